package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"slices"
	"strings"
)

// A state manifest names one checkpoint by its content: the expert's
// identity and schedule, and for each of its files the size and the
// SHA-256 of every chunk. Its deterministic encoding hashes to the
// checkpoint's state root, which the uid's DHT record carries, so that a
// host pulling the state from anyone checks every chunk against the root
// its owner signed.
//
// The encoding (all integers unsigned varints, strings and byte strings a
// varint length and the bytes):
//
//	"moehost-manifest/1\n"
//	uid, module digest, step, examples, optimizer, parent root
//	config: count, then (key, value as zig-zag varint) sorted by key
//	files: count, then per file: name, size, chunk size,
//	       chunk count, then 32 bytes per chunk
//
// and a signed manifest, as the <step>.manifest file holds it:
//
//	"moehost-signed-manifest/1\n"
//	manifest, public key, signature
//
// where the signature signs the root (see Signer), or both are empty.

// Bounds a manifest's decoder checks before it allocates.
const (
	// MaxManifestBytes bounds an encoded manifest: two files of 1 TiB
	// in 4 MiB chunks take 16 MiB of hashes.
	MaxManifestBytes = 17 << 20
	// MaxFileBytes bounds one file a manifest describes.
	MaxFileBytes = 1 << 40
	maxFiles     = 4
	maxString    = 1 << 16
	maxConfig    = 1024
	maxKeyBytes  = 4096
)

// Chunk sizes: ChunkSize, or BigChunkSize for files above BigFileBytes.
const (
	ChunkSize    = 1 << 20
	BigChunkSize = 4 << 20
	BigFileBytes = 1 << 30
)

// ChunkSizeFor returns the chunk size of a file of size bytes.
func ChunkSizeFor(size int64) int64 {
	if size > BigFileBytes {
		return BigChunkSize
	}
	return ChunkSize
}

// ErrBadManifest is wrapped by every manifest decoding failure.
var ErrBadManifest = errors.New("bad state manifest")

const (
	manifestMagic = "moehost-manifest/1\n"
	signedMagic   = "moehost-signed-manifest/1\n"
)

// Manifest describes one checkpoint by content.
type Manifest struct {
	UID          string
	ModuleDigest string
	Config       map[string]int64
	Step         int64
	Examples     int64
	// Optimizer is the optimizer's settings, as JSON.
	Optimizer string
	// Parent is the state root of the checkpoint this one was trained
	// from (the expert's previous one), "" for the first.
	Parent string
	// Files are the checkpoint's files: the optimizer's, then the
	// parameters'.
	Files []FileHashes
}

// FileHashes is one file of a manifest.
type FileHashes struct {
	// Name is the file's name in the uid's directory
	// ("12.optim.safetensors").
	Name      string
	Size      int64
	ChunkSize int64
	Chunks    [][sha256.Size]byte
}

// NumChunks returns how many chunks a file of size bytes has in chunks
// of chunk bytes.
func NumChunks(size, chunk int64) int64 {
	if size == 0 {
		return 0
	}
	return (size + chunk - 1) / chunk
}

// Chunk returns the byte range [off, off+n) of chunk i.
func (f FileHashes) Chunk(i int64) (off, n int64) {
	off = i * f.ChunkSize
	return off, min(f.ChunkSize, f.Size-off)
}

// Encode returns m's deterministic encoding.
func (m *Manifest) Encode() []byte {
	var b []byte
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = append(b, manifestMagic...)
	str(m.UID)
	str(m.ModuleDigest)
	b = binary.AppendUvarint(b, uint64(m.Step))
	b = binary.AppendUvarint(b, uint64(m.Examples))
	str(m.Optimizer)
	str(m.Parent)
	keys := make([]string, 0, len(m.Config))
	for k := range m.Config {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		str(k)
		b = binary.AppendVarint(b, m.Config[k])
	}
	b = binary.AppendUvarint(b, uint64(len(m.Files)))
	for _, f := range m.Files {
		str(f.Name)
		b = binary.AppendUvarint(b, uint64(f.Size))
		b = binary.AppendUvarint(b, uint64(f.ChunkSize))
		b = binary.AppendUvarint(b, uint64(len(f.Chunks)))
		for _, c := range f.Chunks {
			b = append(b, c[:]...)
		}
	}
	return b
}

// Root returns the state root of m: "sha256:" and the hex SHA-256 of its
// encoding.
func (m *Manifest) Root() string { return RootOf(m.Encode()) }

// RootOf returns the state root of an encoded manifest.
func RootOf(encoded []byte) string {
	sum := sha256.Sum256(encoded)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Bytes returns the sum of the files' sizes.
func (m *Manifest) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// decoder reads a manifest's fields, failing once.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrBadManifest, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) uvarint(what string, max uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("%s: not a varint", what)
		return 0
	}
	if v > max {
		d.fail("%s %d is more than %d", what, v, max)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(what string, max uint64) []byte {
	n := d.uvarint(what+" length", max)
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("%s of %d bytes, but %d are left", what, n, len(d.b))
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) str(what string) string { return string(d.bytes(what, maxString)) }

// DecodeManifest parses an encoded manifest. Every count and size is
// checked against the bytes left before anything is allocated for it,
// and the encoding must be the one Encode gives (so that its root is the
// one the bytes hash to).
func DecodeManifest(b []byte) (*Manifest, error) {
	if len(b) > MaxManifestBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrBadManifest, len(b), MaxManifestBytes)
	}
	rest, ok := bytes.CutPrefix(b, []byte(manifestMagic))
	if !ok {
		return nil, fmt.Errorf("%w: no %q header", ErrBadManifest, strings.TrimSpace(manifestMagic))
	}
	d := &decoder{b: rest}
	m := &Manifest{}
	m.UID = d.str("uid")
	m.ModuleDigest = d.str("module digest")
	m.Step = int64(d.uvarint("step", 1<<62))
	m.Examples = int64(d.uvarint("examples", 1<<62))
	m.Optimizer = d.str("optimizer")
	m.Parent = d.str("parent")
	nc := d.uvarint("config entries", maxConfig)
	if d.err == nil && nc > 0 {
		if nc > uint64(len(d.b))/2 {
			d.fail("%d config entries in %d bytes", nc, len(d.b))
		} else {
			m.Config = make(map[string]int64, nc)
		}
	}
	prev := ""
	for i := uint64(0); i < nc && d.err == nil; i++ {
		k := string(d.bytes("config key", maxKeyBytes))
		if d.err != nil {
			break
		}
		if i > 0 && k <= prev {
			d.fail("config key %q is out of order", k)
			break
		}
		prev = k
		v, n := binary.Varint(d.b)
		if n <= 0 {
			d.fail("config %q: not a varint", k)
			break
		}
		d.b = d.b[n:]
		m.Config[k] = v
	}
	nf := d.uvarint("files", maxFiles)
	for i := uint64(0); i < nf && d.err == nil; i++ {
		f := FileHashes{Name: d.str("file name")}
		f.Size = int64(d.uvarint("file size", MaxFileBytes))
		f.ChunkSize = int64(d.uvarint("chunk size", BigChunkSize))
		n := d.uvarint("chunks", MaxFileBytes)
		if d.err != nil {
			break
		}
		switch {
		case f.Name == "" || strings.ContainsAny(f.Name, `/\`+"\x00") || strings.HasPrefix(f.Name, "."):
			d.fail("file name %q", f.Name)
		case f.ChunkSize != ChunkSizeFor(f.Size):
			d.fail("file %q of %d bytes has chunks of %d, not %d", f.Name, f.Size, f.ChunkSize, ChunkSizeFor(f.Size))
		case int64(n) != NumChunks(f.Size, f.ChunkSize):
			d.fail("file %q of %d bytes lists %d chunks, not %d", f.Name, f.Size, n, NumChunks(f.Size, f.ChunkSize))
		case n > uint64(len(d.b))/sha256.Size:
			d.fail("file %q lists %d chunks in %d bytes", f.Name, n, len(d.b))
		}
		if d.err != nil {
			break
		}
		f.Chunks = make([][sha256.Size]byte, n)
		for j := range f.Chunks {
			copy(f.Chunks[j][:], d.b[:sha256.Size])
			d.b = d.b[sha256.Size:]
		}
		m.Files = append(m.Files, f)
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last file", ErrBadManifest, len(d.b))
	}
	if !bytes.Equal(m.Encode(), b) {
		return nil, fmt.Errorf("%w: not in its deterministic encoding", ErrBadManifest)
	}
	return m, nil
}

// Signer signs state roots with the host's key (its libp2p key, under a
// signature prefix of its own: see sdk/swarm's SignStateRoot).
type Signer interface {
	SignState(root string) (publicKey, signature []byte, err error)
}

// SignedManifest is a manifest with its signer's public key and the
// signature of its root, as the <step>.manifest file holds it.
type SignedManifest struct {
	Manifest  *Manifest
	Encoded   []byte // the manifest's encoding, which hashes to Root
	Root      string
	PublicKey []byte // empty when unsigned
	Signature []byte
}

// EncodeSigned returns the signed manifest's file bytes.
func EncodeSigned(encoded, publicKey, signature []byte) []byte {
	b := append([]byte(nil), signedMagic...)
	for _, f := range [][]byte{encoded, publicKey, signature} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	return b
}

// DecodeSigned parses a signed manifest's bytes (from a file or a peer)
// and the manifest in it; it does not check the signature, which needs
// the key's scheme (sdk/swarm's VerifyStateRoot does).
func DecodeSigned(b []byte) (*SignedManifest, error) {
	if len(b) > MaxManifestBytes+64<<10 {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrBadManifest, len(b), MaxManifestBytes+64<<10)
	}
	rest, ok := bytes.CutPrefix(b, []byte(signedMagic))
	if !ok {
		return nil, fmt.Errorf("%w: no %q header", ErrBadManifest, strings.TrimSpace(signedMagic))
	}
	d := &decoder{b: rest}
	enc := d.bytes("manifest", MaxManifestBytes)
	pub := d.bytes("public key", 4096)
	sig := d.bytes("signature", 4096)
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the signature", ErrBadManifest, len(d.b))
	}
	m, err := DecodeManifest(enc)
	if err != nil {
		return nil, err
	}
	return &SignedManifest{Manifest: m, Encoded: bytes.Clone(enc), Root: RootOf(enc),
		PublicKey: bytes.Clone(pub), Signature: bytes.Clone(sig)}, nil
}

// chunkHasher hashes what is written through it in chunks of a file's
// chunk size, so that a checkpoint's manifest comes from the bytes as
// they are written, not from reading the file back.
type chunkHasher struct {
	w      io.Writer
	chunk  int64
	h      hash.Hash
	inCur  int64
	chunks [][sha256.Size]byte
	size   int64
}

func newChunkHasher(w io.Writer, size int64) *chunkHasher {
	return &chunkHasher{w: w, chunk: ChunkSizeFor(size), h: sha256.New()}
}

func (c *chunkHasher) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	q := p[:n]
	for len(q) > 0 {
		k := min(int64(len(q)), c.chunk-c.inCur)
		c.h.Write(q[:k])
		c.inCur += k
		q = q[k:]
		if c.inCur == c.chunk {
			c.flush()
		}
	}
	c.size += int64(n)
	return n, err
}

func (c *chunkHasher) flush() {
	var s [sha256.Size]byte
	c.h.Sum(s[:0])
	c.chunks = append(c.chunks, s)
	c.h.Reset()
	c.inCur = 0
}

// file returns the hashes of what was written, as the file name.
func (c *chunkHasher) file(name string) FileHashes {
	if c.inCur > 0 {
		c.flush()
	}
	return FileHashes{Name: name, Size: c.size, ChunkSize: c.chunk, Chunks: c.chunks}
}

// HashFile returns the chunk hashes of the size bytes in r, for a
// checkpoint written before manifests existed (or one whose manifest a
// crash lost) and for tests.
func HashFile(name string, r io.Reader, size int64) (FileHashes, error) {
	c := newChunkHasher(io.Discard, size)
	if _, err := io.CopyN(c, r, size); err != nil {
		return FileHashes{}, err
	}
	return c.file(name), nil
}
