// Package checkpoint keeps experts' training state on disk: parameters and
// optimizer state in safetensors files, one pair per saved step,
//
//	<dir>/<uid>/<step>.safetensors        the parameters, named as the
//	                                      module declares them (a PyTorch
//	                                      state_dict)
//	<dir>/<uid>/<step>.optim.safetensors  the optimizer's buffers
//
// written atomically (the optimizer file first, so a step whose parameter
// file exists is whole), with the newest few kept. It knows nothing of
// experts or devices; package host converts.
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moehost/moehost/internal/atomicfile"
)

// ErrNotFound is returned when an expert has no checkpoint (at the step
// asked for).
var ErrNotFound = errors.New("no such checkpoint")

// Metadata keys in both files' __metadata__.
const (
	keyFormat    = "format" // "pt", as torch's safetensors writer puts it
	keyUID       = "uid"
	keyDigest    = "module_digest"
	keyStep      = "step"
	keyExamples  = "examples_processed"
	keyConfig    = "config"
	keyOptimizer = "optimizer"
)

// Meta describes a checkpoint.
type Meta struct {
	UID          string
	ModuleDigest string
	// Step is the number of optimizer steps (updates) taken.
	Step int64
	// Examples is the number of examples trained on.
	Examples int64
	// Config is the expert's config, as moe_init read it.
	Config map[string]int64
	// Optimizer is the optimizer's settings and schedule, as JSON.
	Optimizer string
}

func (m Meta) encode() (map[string]string, error) {
	cfg, err := json.Marshal(m.Config)
	if err != nil {
		return nil, err
	}
	return map[string]string{
		keyFormat:    "pt",
		keyUID:       m.UID,
		keyDigest:    m.ModuleDigest,
		keyStep:      strconv.FormatInt(m.Step, 10),
		keyExamples:  strconv.FormatInt(m.Examples, 10),
		keyConfig:    string(cfg),
		keyOptimizer: m.Optimizer,
	}, nil
}

func decodeMeta(md map[string]string) (Meta, error) {
	m := Meta{UID: md[keyUID], ModuleDigest: md[keyDigest], Optimizer: md[keyOptimizer]}
	var err error
	if m.Step, err = strconv.ParseInt(md[keyStep], 10, 64); err != nil || m.Step < 0 {
		return Meta{}, fmt.Errorf("%w: metadata step %q", ErrCorrupt, md[keyStep])
	}
	if m.Examples, err = strconv.ParseInt(md[keyExamples], 10, 64); err != nil || m.Examples < 0 {
		return Meta{}, fmt.Errorf("%w: metadata examples %q", ErrCorrupt, md[keyExamples])
	}
	if c := md[keyConfig]; c != "" && c != "null" {
		if err := json.Unmarshal([]byte(c), &m.Config); err != nil {
			return Meta{}, fmt.Errorf("%w: metadata config: %w", ErrCorrupt, err)
		}
	}
	return m, nil
}

// Checkpoint is one saved step of one expert.
type Checkpoint struct {
	Meta
	// Params are the parameters in declaration order.
	Params []Tensor
	// Optim are the optimizer's buffers, named "<param>.<buffer>" with
	// torch's buffer names ("exp_avg", "momentum_buffer").
	Optim []Tensor
}

// Info lists one checkpoint on disk.
type Info struct {
	UID   string
	Step  int64
	Bytes int64 // both files together
	Time  time.Time
}

// Store is a directory of checkpoints.
type Store struct {
	dir    string
	keep   int
	signer Signer
}

// Option configures a Store.
type Option interface{ apply(*Store) }

type optionFunc func(*Store)

func (f optionFunc) apply(s *Store) { f(s) }

// WithSigner signs each checkpoint's state root as Save writes its
// manifest. Default: manifests are written unsigned.
func WithSigner(sg Signer) Option { return optionFunc(func(s *Store) { s.signer = sg }) }

// Open returns the store in dir, creating dir, and removes the temp files
// a crash mid-write left behind. keep is how many checkpoints per expert
// Save leaves; keep < 1 keeps all.
func Open(dir string, keep int, opts ...Option) (*Store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating checkpoint dir: %w", err)
	}
	tmps, _ := filepath.Glob(filepath.Join(dir, "*", ".tmp-*"))
	for _, t := range tmps {
		os.Remove(t)
	}
	st := &Store{dir: dir, keep: keep}
	for _, o := range opts {
		o.apply(st)
	}
	return st, nil
}

// CheckDirName refuses a uid that cannot be a directory name of its own:
// the checkpoint store's own check, beside the one uid grammar.
func CheckDirName(uid string) error {
	// maxUIDBytes is NAME_MAX of common file systems (ext4, xfs, tmpfs).
	const maxUIDBytes = 255
	if uid == "" || uid == "." || uid == ".." || strings.HasPrefix(uid, ".") || strings.ContainsAny(uid, `/\`+"\x00") {
		return fmt.Errorf("uid %q cannot name a checkpoint directory", uid)
	}
	if len(uid) > maxUIDBytes {
		return fmt.Errorf("uid %.40q… is %d bytes, longer than a checkpoint directory's name may be (%d)", uid, len(uid), maxUIDBytes)
	}
	return nil
}

// Dir returns the directory holding uid's checkpoints.
func (s *Store) Dir(uid string) string { return filepath.Join(s.dir, uid) }

func (s *Store) paths(uid string, step int64) (params, optim string) {
	base := filepath.Join(s.dir, uid, strconv.FormatInt(step, 10))
	return base + ".safetensors", base + ".optim.safetensors"
}

func (s *Store) manifestPath(uid string, step int64) string {
	return filepath.Join(s.dir, uid, strconv.FormatInt(step, 10)+".manifest")
}

// FileNames returns the names of the files of uid's checkpoint at step, in
// a manifest's order: the optimizer's, then the parameters'.
func FileNames(step int64) []string {
	base := strconv.FormatInt(step, 10)
	return []string{base + ".optim.safetensors", base + ".safetensors"}
}

// writeHashed writes what write writes (size bytes) to path atomically,
// and returns the hashes of its chunks, taken as the bytes go to the
// file.
func writeHashed(path string, size int64, write func(io.Writer) error) (FileHashes, error) {
	var fh FileHashes
	err := atomicfile.WriteFunc(path, func(w io.Writer) error {
		c := newChunkHasher(w, size)
		if err := write(c); err != nil {
			return err
		}
		fh = c.file(filepath.Base(path))
		return nil
	})
	return fh, err
}

// Save writes c atomically, the optimizer file first, then the
// parameters (the commit point) and the manifest, then prunes the
// expert's older checkpoints beyond the store's keep.
func (s *Store) Save(c *Checkpoint) error {
	_, err := s.SaveManifest(c)
	return err
}

// SaveManifest is Save, and returns the checkpoint's signed manifest.
func (s *Store) SaveManifest(c *Checkpoint) (*SignedManifest, error) {
	sm, err := s.save(c)
	if err != nil {
		return nil, err
	}
	return sm, s.prune(c.UID)
}

func (s *Store) save(c *Checkpoint) (*SignedManifest, error) {
	if err := CheckDirName(c.UID); err != nil {
		return nil, err
	}
	md, err := c.Meta.encode()
	if err != nil {
		return nil, fmt.Errorf("saving %q: %w", c.UID, err)
	}
	// Both files are checked, and sized, before either is written.
	_, psize, err := encodeHeader(c.Params, md)
	if err != nil {
		return nil, fmt.Errorf("saving %q: params: %w", c.UID, err)
	}
	_, osize, err := encodeHeader(c.Optim, md)
	if err != nil {
		return nil, fmt.Errorf("saving %q: optimizer: %w", c.UID, err)
	}
	if err := os.MkdirAll(filepath.Join(s.dir, c.UID), 0o755); err != nil {
		return nil, fmt.Errorf("saving %q: %w", c.UID, err)
	}
	// Streamed from the tensors, hashed on the way: an encoded copy of
	// the ffn's state was 100 MB of garbage per expert and save.
	parent := s.parentRoot(c.UID, c.Step)
	pp, op := s.paths(c.UID, c.Step)
	of, err := writeHashed(op, osize, func(w io.Writer) error { return encodeTo(w, c.Optim, md) })
	if err != nil {
		return nil, fmt.Errorf("saving %q step %d: %w", c.UID, c.Step, err)
	}
	pf, err := writeHashed(pp, psize, func(w io.Writer) error { return encodeTo(w, c.Params, md) })
	if err != nil {
		return nil, fmt.Errorf("saving %q step %d: %w", c.UID, c.Step, err)
	}
	m := &Manifest{UID: c.UID, ModuleDigest: c.ModuleDigest, Config: c.Config, Step: c.Step,
		Examples: c.Examples, Optimizer: c.Optimizer, Parent: parent, Files: []FileHashes{of, pf}}
	sm, err := s.writeManifest(m)
	if err != nil {
		return nil, fmt.Errorf("saving %q step %d: %w", c.UID, c.Step, err)
	}
	return sm, nil
}

// parentRoot returns the root of uid's newest checkpoint before step, ""
// if it has none (or its manifest does not read).
func (s *Store) parentRoot(uid string, step int64) string {
	steps, _ := s.steps(uid)
	for _, st := range steps {
		if st >= step {
			continue
		}
		if sm, err := s.Manifest(uid, st); err == nil {
			return sm.Root
		}
		return ""
	}
	return ""
}

// writeManifest signs m (with the store's signer, if any) and writes it
// as its step's manifest file.
func (s *Store) writeManifest(m *Manifest) (*SignedManifest, error) {
	enc := m.Encode()
	sm := &SignedManifest{Manifest: m, Encoded: enc, Root: RootOf(enc)}
	if s.signer != nil {
		pub, sig, err := s.signer.SignState(sm.Root)
		if err != nil {
			return nil, fmt.Errorf("signing the state root: %w", err)
		}
		sm.PublicKey, sm.Signature = pub, sig
	}
	if err := atomicfile.Write(s.manifestPath(m.UID, m.Step), EncodeSigned(enc, sm.PublicKey, sm.Signature)); err != nil {
		return nil, err
	}
	return sm, nil
}

// Manifest returns the signed manifest of uid's checkpoint at step. A
// checkpoint without one (written before manifests, or a crash came
// between its parameter file and its manifest) gets one now, from its
// files.
func (s *Store) Manifest(uid string, step int64) (*SignedManifest, error) {
	if err := CheckDirName(uid); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.manifestPath(uid, step))
	if err == nil {
		sm, err := DecodeSigned(b)
		if err != nil {
			return nil, fmt.Errorf("manifest of %q step %d: %w", uid, step, err)
		}
		if sm.Manifest.UID != uid || sm.Manifest.Step != step {
			return nil, fmt.Errorf("%w: the manifest of %q step %d names %q step %d", ErrBadManifest, uid, step, sm.Manifest.UID, sm.Manifest.Step)
		}
		return sm, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	l, err := s.Open(uid, step, 0)
	if err != nil {
		return nil, err
	}
	meta := l.Meta
	l.Close()
	m := &Manifest{UID: uid, ModuleDigest: meta.ModuleDigest, Config: meta.Config, Step: step,
		Examples: meta.Examples, Optimizer: meta.Optimizer, Parent: s.parentRoot(uid, step)}
	pp, op := s.paths(uid, step)
	for _, p := range []string{op, pp} {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		fi, err := f.Stat()
		if err == nil {
			var fh FileHashes
			fh, err = HashFile(filepath.Base(p), f, fi.Size())
			m.Files = append(m.Files, fh)
		}
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("hashing %s: %w", filepath.Base(p), err)
		}
	}
	return s.writeManifest(m)
}

// Latest returns the step of uid's newest checkpoint; ok is false when
// it has none.
func (s *Store) Latest(uid string) (step int64, ok bool) {
	if CheckDirName(uid) != nil {
		return 0, false
	}
	steps, err := s.steps(uid)
	if err != nil || len(steps) == 0 {
		return 0, false
	}
	return steps[0], true
}

// Path returns the path of the file named name (a manifest's file name)
// in uid's directory.
func (s *Store) Path(uid, name string) string { return filepath.Join(s.dir, uid, name) }

// PartPath returns where a pull keeps the file named name of uid while
// it arrives.
func (s *Store) PartPath(uid, name string) string {
	return filepath.Join(s.dir, uid, ".part-"+name)
}

// Import commits a pulled checkpoint: the files of sm, which lie
// verified at their PartPath, are synced and renamed into place (the
// optimizer's first, the parameters' as the commit point), then the
// signed manifest is written as received.
func (s *Store) Import(sm *SignedManifest) error {
	m := sm.Manifest
	if err := CheckDirName(m.UID); err != nil {
		return err
	}
	names := FileNames(m.Step)
	if len(m.Files) != len(names) || m.Files[0].Name != names[0] || m.Files[1].Name != names[1] {
		return fmt.Errorf("%w: the files of %q step %d are not %v", ErrBadManifest, m.UID, m.Step, names)
	}
	for _, f := range m.Files {
		part := s.PartPath(m.UID, f.Name)
		fd, err := os.OpenFile(part, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("importing %q step %d: %w", m.UID, m.Step, err)
		}
		err = fd.Sync()
		fd.Close()
		if err != nil {
			return fmt.Errorf("importing %q step %d: %w", m.UID, m.Step, err)
		}
		if err := os.Rename(part, s.Path(m.UID, f.Name)); err != nil {
			return fmt.Errorf("importing %q step %d: %w", m.UID, m.Step, err)
		}
	}
	if err := atomicfile.Write(s.manifestPath(m.UID, m.Step), EncodeSigned(sm.Encoded, sm.PublicKey, sm.Signature)); err != nil {
		return fmt.Errorf("importing %q step %d: %w", m.UID, m.Step, err)
	}
	return s.prune(m.UID)
}

// steps returns the expert's saved steps (those with a parameter file),
// newest first.
func (s *Store) steps(uid string) ([]int64, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, uid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints of %q: %w", uid, err)
	}
	var steps []int64
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".safetensors")
		if !ok || strings.HasSuffix(name, ".optim") {
			continue
		}
		if n, err := strconv.ParseInt(name, 10, 64); err == nil && n >= 0 {
			steps = append(steps, n)
		}
	}
	slices.Sort(steps)
	slices.Reverse(steps)
	return steps, nil
}

// prune removes all but the newest keep checkpoints, and optimizer files
// whose parameter file is gone or was never written.
func (s *Store) prune(uid string) error {
	if s.keep < 1 {
		return nil
	}
	steps, err := s.steps(uid)
	if err != nil {
		return err
	}
	kept := map[string]bool{}
	for i, st := range steps {
		pp, op := s.paths(uid, st)
		if i < s.keep {
			kept[filepath.Base(op)] = true
			continue
		}
		if err := os.Remove(pp); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("pruning %q: %w", uid, err)
		}
		os.Remove(op)
		os.Remove(s.manifestPath(uid, st))
	}
	optims, _ := filepath.Glob(filepath.Join(s.dir, uid, "*.optim.safetensors"))
	for _, o := range optims {
		if !kept[filepath.Base(o)] {
			os.Remove(o)
		}
	}
	manifests, _ := filepath.Glob(filepath.Join(s.dir, uid, "*.manifest"))
	for _, m := range manifests {
		step := strings.TrimSuffix(filepath.Base(m), ".manifest")
		if !kept[step+".optim.safetensors"] {
			os.Remove(m)
		}
	}
	return nil
}

// List returns the expert's checkpoints, newest first.
func (s *Store) List(uid string) ([]Info, error) {
	if err := CheckDirName(uid); err != nil {
		return nil, err
	}
	steps, err := s.steps(uid)
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(steps))
	for _, st := range steps {
		pp, op := s.paths(uid, st)
		pi, err := os.Stat(pp)
		if err != nil {
			continue // pruned meanwhile
		}
		in := Info{UID: uid, Step: st, Bytes: pi.Size(), Time: pi.ModTime()}
		if oi, err := os.Stat(op); err == nil {
			in.Bytes += oi.Size()
		}
		out = append(out, in)
	}
	return out, nil
}

// Load reads and checks the expert's checkpoint at step. maxBytes bounds
// each file's size before it is read (<= 0: no bound), so that a file
// larger than the expert could ever be costs nothing.
func (s *Store) Load(uid string, step int64, maxBytes int64) (*Checkpoint, error) {
	l, err := s.Open(uid, step, maxBytes)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	for i := range l.Params {
		l.Params[i].Data = make([]float32, l.params.entries[i].n)
		if err := l.ReadParam(i, l.Params[i].Data); err != nil {
			return nil, err
		}
	}
	return &l.Checkpoint, nil
}

// Lazy is a checkpoint whose parameters' values stay in their file until
// ReadParam copies them out, straight into where they go (a parameter's
// tensor, say), so that a restore copies each value once. Its Params have
// names and shapes but no Data; its Optim are read whole. Close it.
type Lazy struct {
	Checkpoint
	f      *os.File
	params *tensorFile // Params[i] is params.entries[i]
	path   string
}

// Open reads and checks the expert's checkpoint at step as Load does,
// every header and the optimizer's file, but leaves the parameters'
// values in their file. maxBytes is as for Load.
func (s *Store) Open(uid string, step int64, maxBytes int64) (*Lazy, error) {
	if err := CheckDirName(uid); err != nil {
		return nil, err
	}
	pp, op := s.paths(uid, step)
	open := func(path string) (*os.File, *tensorFile, Meta, error) {
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, Meta{}, fmt.Errorf("%w: %s", ErrNotFound, filepath.Base(path))
		}
		if err != nil {
			return nil, nil, Meta{}, err
		}
		tf, m, err := openFile(f, path, maxBytes)
		if err != nil {
			f.Close()
			return nil, nil, Meta{}, err
		}
		return f, tf, m, nil
	}
	pf, ptf, meta, err := open(pp)
	if err != nil {
		return nil, fmt.Errorf("loading %q step %d: %w", uid, step, err)
	}
	l := &Lazy{f: pf, params: ptf, path: pp}
	fail := func(err error) (*Lazy, error) {
		l.Close()
		return nil, fmt.Errorf("loading %q step %d: %w", uid, step, err)
	}
	of, otf, ometa, err := open(op)
	if err != nil {
		return fail(err)
	}
	optim, err := otf.readAll()
	of.Close()
	if err != nil {
		return fail(fmt.Errorf("%s: %w", filepath.Base(op), err))
	}
	if meta.UID != uid || meta.Step != step || ometa.UID != uid || ometa.Step != step || ometa.ModuleDigest != meta.ModuleDigest {
		return fail(fmt.Errorf("%w: the files' metadata name %q step %d and %q step %d", ErrCorrupt, meta.UID, meta.Step, ometa.UID, ometa.Step))
	}
	l.Meta, l.Optim = meta, optim
	l.Params = make([]Tensor, len(ptf.entries))
	for i, e := range ptf.entries {
		l.Params[i] = Tensor{Name: e.name, Shape: e.shape}
	}
	return l, nil
}

// openFile checks the size of the safetensors file f (at path) against
// maxBytes, then reads and checks its header and metadata.
func openFile(f *os.File, path string, maxBytes int64) (*tensorFile, Meta, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, Meta{}, err
	}
	if maxBytes > 0 && fi.Size() > maxBytes {
		return nil, Meta{}, fmt.Errorf("%w: %s is %d bytes, more than the expert's %d", ErrCorrupt, filepath.Base(path), fi.Size(), maxBytes)
	}
	tf, err := openTensors(f, fi.Size())
	if err != nil {
		return nil, Meta{}, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	m, err := decodeMeta(tf.meta)
	if err != nil {
		return nil, Meta{}, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return tf, m, nil
}

// ReadParam copies the values of Params[i] into dst, which must be its
// length. A file cut short or changed since Open fails the read.
func (l *Lazy) ReadParam(i int, dst []float32) error {
	if i < 0 || i >= len(l.Params) {
		return fmt.Errorf("reading parameter %d of %d", i, len(l.Params))
	}
	if err := l.params.read(i, dst); err != nil {
		return fmt.Errorf("loading %q step %d: %s: %w", l.UID, l.Step, filepath.Base(l.path), err)
	}
	return nil
}

// Close closes the parameters' file.
func (l *Lazy) Close() error {
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
