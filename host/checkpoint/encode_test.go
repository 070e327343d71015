package checkpoint

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

// TestSaveStreamsEncode checks that a saved file is, byte for byte, what
// Encode returns, through either way of writing the tensors (Data's
// memory, or the buffer a big-endian machine uses, here on tensors
// larger than it), and that a failed write is reported.
func TestSaveStreamsEncode(t *testing.T) {
	t.Parallel()
	big := make([]float32, 40_000) // 160 KB: more than the 64 KiB buffer
	for i := range big {
		big[i] = float32(i) * 0.5
	}
	ts := []Tensor{
		{Name: "w", Shape: []int{200, 200}, Data: big},
		{Name: "b", Shape: []int{3}, Data: []float32{1, -2, 3}},
	}
	md := map[string]string{"uid": "ffn.0"}
	want, err := Encode(ts, md)
	if err != nil {
		t.Fatal(err)
	}
	head, size, err := encodeHeader(ts, md)
	if err != nil {
		t.Fatal(err)
	}
	if size != int64(len(want)) {
		t.Errorf("encodeHeader sizes the file at %d bytes, Encode wrote %d", size, len(want))
	}
	for _, direct := range []bool{true, false} {
		var got bytes.Buffer
		if err := writeEncoded(&got, head, ts, direct); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Errorf("direct %v: %d bytes that differ from Encode's %d", direct, got.Len(), len(want))
		}
		if err := writeEncoded(&failAfter{n: len(head) + 1000}, head, ts, direct); !errors.Is(err, errFull) {
			t.Errorf("direct %v: a write that fails gives %v, want errFull", direct, err)
		}
	}

	s, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	c := &Checkpoint{Meta: Meta{UID: "ffn.0", Step: 4, Config: map[string]int64{}}, Params: ts, Optim: ts[1:]}
	if err := s.Save(c); err != nil {
		t.Fatal(err)
	}
	cmd, err := c.Meta.encode()
	if err != nil {
		t.Fatal(err)
	}
	pp, op := s.paths("ffn.0", 4)
	for _, f := range []struct {
		path string
		ts   []Tensor
	}{{pp, c.Params}, {op, c.Optim}} {
		got, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		want, err := Encode(f.ts, cmd)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes that differ from Encode's %d", f.path, len(got), len(want))
		}
	}
}

var errFull = errors.New("full")

// failAfter takes n bytes, then fails.
type failAfter struct{ n int }

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		k := f.n
		f.n = 0
		return k, errFull
	}
	f.n -= len(p)
	return len(p), nil
}
