package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/moehost/moehost/internal/lefloat"
)

// ErrCorrupt is returned for bytes that are not a valid safetensors file
// of float32 tensors.
var ErrCorrupt = errors.New("corrupt safetensors file")

// maxHeaderBytes bounds the JSON header, as the safetensors crate does
// (100 MB), so that a forged length cannot make the reader allocate.
const maxHeaderBytes = 100 << 20

// Tensor is one named float32 tensor, row-major.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
}

// headerEntry is one tensor's entry in the safetensors header.
type headerEntry struct {
	DType   string   `json:"dtype"`
	Shape   []int    `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

// Encode writes tensors and metadata in the safetensors format: an 8-byte
// little-endian header length, a JSON header, then the tensors' raw
// little-endian bytes, in the order given and without gaps.
func Encode(tensors []Tensor, metadata map[string]string) ([]byte, error) {
	head, size, err := encodeHeader(tensors, metadata)
	if err != nil {
		return nil, err
	}
	out := bytes.NewBuffer(make([]byte, 0, size))
	if err := writeEncoded(out, head, tensors, lefloat.LittleEndian); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// encodeTo writes what Encode returns to w, without a copy of the
// tensors in memory: their bytes go to w straight from Data (on a
// little-endian machine) or through a small buffer.
func encodeTo(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	head, _, err := encodeHeader(tensors, metadata)
	if err != nil {
		return err
	}
	return writeEncoded(w, head, tensors, lefloat.LittleEndian)
}

// encodeHeader checks tensors and returns the file's length prefix and
// JSON header, and the size of the whole file.
func encodeHeader(tensors []Tensor, metadata map[string]string) (head []byte, size int64, err error) {
	header := make(map[string]any, len(tensors)+1)
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, t := range tensors {
		if t.Name == "" || t.Name == "__metadata__" {
			return nil, 0, fmt.Errorf("encoding: tensor name %q is reserved", t.Name)
		}
		if _, dup := header[t.Name]; dup {
			return nil, 0, fmt.Errorf("encoding: tensor %q is listed twice", t.Name)
		}
		n, ok := numel(t.Shape)
		if !ok || n != int64(len(t.Data)) {
			return nil, 0, fmt.Errorf("encoding: tensor %q has %d values for shape %v", t.Name, len(t.Data), t.Shape)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[t.Name] = headerEntry{DType: "F32", Shape: shape, Offsets: [2]int64{off, off + 4*n}}
		off += 4 * n
	}
	js, err := json.Marshal(header)
	if err != nil {
		return nil, 0, fmt.Errorf("encoding header: %w", err)
	}
	// Pad the header with spaces to a multiple of 8, as the reference
	// writer does, so that the data is aligned.
	if pad := (8 - len(js)%8) % 8; pad > 0 {
		js = append(js, strings.Repeat(" ", pad)...)
	}
	head = make([]byte, 8, 8+len(js))
	binary.LittleEndian.PutUint64(head, uint64(len(js)))
	head = append(head, js...)
	return head, int64(len(head)) + off, nil
}

// writeEncoded writes head and then the tensors' little-endian bytes:
// with direct (a little-endian machine), Data's own memory, else
// through a 64 KiB buffer.
func writeEncoded(w io.Writer, head []byte, tensors []Tensor, direct bool) error {
	if _, err := w.Write(head); err != nil {
		return err
	}
	var buf []byte
	for _, t := range tensors {
		if direct {
			if _, err := w.Write(lefloat.Bytes(t.Data)); err != nil {
				return err
			}
			continue
		}
		if buf == nil {
			buf = make([]byte, 64<<10)
		}
		for d := t.Data; len(d) > 0; {
			n := min(len(d), len(buf)/4)
			lefloat.Put(buf[:4*n], d[:n])
			if _, err := w.Write(buf[:4*n]); err != nil {
				return err
			}
			d = d[n:]
		}
	}
	return nil
}

// Decode parses a safetensors file of float32 tensors. It checks
// everything before it allocates the tensors: the header length against
// the file, every dtype, every shape against its byte range, and that the
// ranges tile the data without gaps or overlaps. Tensors come back in the
// order of their data.
func Decode(data []byte) ([]Tensor, map[string]string, error) {
	tf, err := openTensors(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return nil, nil, err
	}
	ts, err := tf.readAll()
	if err != nil {
		return nil, nil, err
	}
	return ts, tf.meta, nil
}

// tensorFile is a safetensors file whose header has been read and
// checked: where each tensor's data lies. The data stays in the file
// until read copies it out.
type tensorFile struct {
	r       io.ReaderAt
	base    int64       // where the data starts: after the length and the header
	entries []fileEntry // in the order of their data, which tiles it
	meta    map[string]string
}

// fileEntry is one tensor of a tensorFile.
type fileEntry struct {
	name  string
	shape []int
	off   int64 // from base
	n     int64 // float32 values
}

// openTensors reads and checks the header of the size-byte safetensors
// file in r, as Decode describes. It allocates the header, at most the
// file's size and maxHeaderBytes, and nothing for the tensors.
func openTensors(r io.ReaderAt, size int64) (*tensorFile, error) {
	if size < 8 {
		return nil, fmt.Errorf("%w: %d bytes is shorter than the header length", ErrCorrupt, size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("reading the header length: %w", err)
	}
	hl := binary.LittleEndian.Uint64(lenBuf[:])
	if hl > maxHeaderBytes || hl > uint64(size-8) {
		return nil, fmt.Errorf("%w: header length %d does not fit the %d-byte file", ErrCorrupt, hl, size)
	}
	header := make([]byte, hl)
	if _, err := r.ReadAt(header, 8); err != nil {
		return nil, fmt.Errorf("reading the header: %w", err)
	}
	bodyLen := size - 8 - int64(hl)
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(header, &raw); err != nil {
		return nil, fmt.Errorf("%w: header: %w", ErrCorrupt, err)
	}
	var meta map[string]string
	if m, ok := raw["__metadata__"]; ok {
		if err := json.Unmarshal(m, &meta); err != nil {
			return nil, fmt.Errorf("%w: metadata: %w", ErrCorrupt, err)
		}
		delete(raw, "__metadata__")
	}
	type entry struct {
		name string
		headerEntry
	}
	entries := make([]entry, 0, len(raw))
	for name, r := range raw {
		var e headerEntry
		if err := json.Unmarshal(r, &e); err != nil {
			return nil, fmt.Errorf("%w: tensor %q: %w", ErrCorrupt, name, err)
		}
		if e.DType != "F32" {
			return nil, fmt.Errorf("%w: tensor %q has dtype %q; checkpoints hold F32", ErrCorrupt, name, e.DType)
		}
		n, ok := numel(e.Shape)
		if !ok || e.Offsets[0] < 0 || e.Offsets[1]-e.Offsets[0] != 4*n {
			return nil, fmt.Errorf("%w: tensor %q: shape %v does not match bytes [%d, %d)", ErrCorrupt, name, e.Shape, e.Offsets[0], e.Offsets[1])
		}
		entries = append(entries, entry{name, e})
	}
	slices.SortFunc(entries, func(a, b entry) int {
		if c := a.Offsets[0] - b.Offsets[0]; c != 0 {
			if c < 0 {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	var end int64
	for _, e := range entries {
		if e.Offsets[0] != end {
			return nil, fmt.Errorf("%w: tensor %q starts at byte %d, not %d", ErrCorrupt, e.name, e.Offsets[0], end)
		}
		end = e.Offsets[1]
	}
	if end != bodyLen {
		return nil, fmt.Errorf("%w: the tensors cover %d of %d data bytes", ErrCorrupt, end, bodyLen)
	}
	tf := &tensorFile{r: r, base: 8 + int64(hl), entries: make([]fileEntry, len(entries)), meta: meta}
	for i, e := range entries {
		tf.entries[i] = fileEntry{name: e.name, shape: e.Shape, off: e.Offsets[0], n: (e.Offsets[1] - e.Offsets[0]) / 4}
	}
	return tf, nil
}

// read copies tensor i's values into dst, which must be its length.
func (tf *tensorFile) read(i int, dst []float32) error {
	e := tf.entries[i]
	if int64(len(dst)) != e.n {
		return fmt.Errorf("tensor %q has %d values, not %d", e.name, e.n, len(dst))
	}
	if err := readFloats(tf.r, tf.base+e.off, dst); err != nil {
		return fmt.Errorf("tensor %q: %w", e.name, err)
	}
	return nil
}

// readAll reads every tensor into memory of its own. The header's checks
// bound what it allocates by the file's size.
func (tf *tensorFile) readAll() ([]Tensor, error) {
	out := make([]Tensor, len(tf.entries))
	for i, e := range tf.entries {
		vals := make([]float32, e.n)
		if err := tf.read(i, vals); err != nil {
			return nil, err
		}
		out[i] = Tensor{Name: e.name, Shape: e.shape, Data: vals}
	}
	return out, nil
}

// readFloats reads len(dst) little-endian float32s at off in r into dst:
// where memory is little-endian, straight into dst's bytes, with no
// buffer in between.
func readFloats(r io.ReaderAt, off int64, dst []float32) error {
	if len(dst) == 0 {
		return nil
	}
	raw := lefloat.Bytes(dst)
	if _, err := r.ReadAt(raw, off); err != nil {
		return err
	}
	if !lefloat.LittleEndian {
		lefloat.Get(dst, raw)
	}
	return nil
}

// numel multiplies dims; ok is false for a negative dim or an overflow
// past 2^40 elements.
func numel(shape []int) (int64, bool) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 || (d > 0 && n > (1<<40)/int64(d)) {
			return 0, false
		}
		n *= int64(d)
	}
	return n, true
}
