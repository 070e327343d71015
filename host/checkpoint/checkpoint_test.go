package checkpoint_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moehost/moehost/host/checkpoint"
)

func sample() []checkpoint.Tensor {
	return []checkpoint.Tensor{
		{Name: "ffn.0.weight", Shape: []int{2, 3}, Data: []float32{1, -2, 3.5, 0, float32(math.Inf(1)), -0.25}},
		{Name: "ffn.0.bias", Shape: []int{3}, Data: []float32{0.5, 0.25, -1}},
		{Name: "scalar", Shape: []int{}, Data: []float32{7}},
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	md := map[string]string{"uid": "ffn.0", "step": "3"}
	b, err := checkpoint.Encode(sample(), md)
	if err != nil {
		t.Fatal(err)
	}
	ts, gotMD, err := checkpoint.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	want := sample()
	if len(ts) != len(want) {
		t.Fatalf("got %d tensors, want %d", len(ts), len(want))
	}
	for i := range want {
		if ts[i].Name != want[i].Name || !slices.Equal(ts[i].Shape, want[i].Shape) || !slices.Equal(ts[i].Data, want[i].Data) {
			t.Errorf("tensor %d = %+v, want %+v", i, ts[i], want[i])
		}
	}
	if gotMD["uid"] != "ffn.0" || gotMD["step"] != "3" {
		t.Errorf("metadata %v", gotMD)
	}
}

// TestEncodeIndependentReader reads Encode's output with a reader written
// from the format's description alone (8-byte length, JSON, raw bytes),
// as PyTorch's side of the interop does.
func TestEncodeIndependentReader(t *testing.T) {
	t.Parallel()
	b, err := checkpoint.Encode(sample(), map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b[:8])
	if (8+n)%8 != 0 {
		t.Errorf("data starts at byte %d, not 8-aligned", 8+n)
	}
	var header map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &header); err != nil {
		t.Fatal(err)
	}
	data := b[8+n:]
	for _, want := range sample() {
		var e struct {
			DType   string  `json:"dtype"`
			Shape   []int   `json:"shape"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(header[want.Name], &e); err != nil {
			t.Fatalf("%s: %v", want.Name, err)
		}
		if e.DType != "F32" || !slices.Equal(e.Shape, want.Shape) {
			t.Errorf("%s: dtype %s shape %v", want.Name, e.DType, e.Shape)
		}
		raw := data[e.Offsets[0]:e.Offsets[1]]
		for i, v := range want.Data {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); got != v {
				t.Errorf("%s[%d] = %v, want %v", want.Name, i, got, v)
			}
		}
	}
	if !bytes.Contains(b[8:8+n], []byte(`"__metadata__":{"format":"pt"}`)) {
		t.Errorf("header lacks the metadata: %s", b[8:8+n])
	}
}

// TestDecodeGolden reads a file laid out by hand as the reference writer
// lays it out.
func TestDecodeGolden(t *testing.T) {
	t.Parallel()
	header := `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}}`
	var b []byte
	b = binary.LittleEndian.AppendUint64(b, uint64(len(header)))
	b = append(b, header...)
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(1.5))
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(-2))
	ts, md, err := checkpoint.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 1 || ts[0].Name != "a" || !slices.Equal(ts[0].Data, []float32{1.5, -2}) || md["k"] != "v" {
		t.Errorf("got %+v %v", ts, md)
	}
}

func TestDecodeRefusals(t *testing.T) {
	t.Parallel()
	file := func(header string, data int) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
		return append(append(b, header...), make([]byte, data)...)
	}
	tests := []struct {
		name string
		b    []byte
		want string
	}{
		{name: "short", b: []byte{1, 2}, want: "shorter"},
		{name: "huge-header", b: binary.LittleEndian.AppendUint64(nil, 1<<62), want: "header length"},
		{name: "bad-json", b: file(`{"a":`, 0), want: "header"},
		{name: "dtype", b: file(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, 4), want: "dtype"},
		{name: "shape-bytes", b: file(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8), want: "shape"},
		{name: "negative-dim", b: file(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,-4]}}`, 0), want: "shape"},
		{name: "overflow-dims", b: file(`{"a":{"dtype":"F32","shape":[1048576,1048576,1048576],"data_offsets":[0,4]}}`, 4), want: "shape"},
		{name: "gap", b: file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), want: "starts at"},
		{name: "overlap", b: file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), want: "starts at"},
		{name: "trailing", b: file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 8), want: "cover"},
		{name: "past-end", b: file(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, 8), want: "cover"},
		{name: "bad-metadata", b: file(`{"__metadata__":{"a":1}}`, 0), want: "metadata"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := checkpoint.Decode(tt.b)
			if !errors.Is(err, checkpoint.ErrCorrupt) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Decode = %v, want ErrCorrupt mentioning %q", err, tt.want)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	good, _ := checkpoint.Encode(sample(), map[string]string{"uid": "x"})
	f.Add(good)
	f.Add([]byte{})
	f.Add(good[:20])
	f.Fuzz(func(t *testing.T, b []byte) {
		ts, md, err := checkpoint.Decode(b)
		if err != nil {
			return
		}
		// What decodes encodes again to something that decodes the same.
		again, err := checkpoint.Encode(ts, md)
		if err != nil {
			t.Fatalf("re-encoding a decoded file: %v", err)
		}
		ts2, _, err := checkpoint.Decode(again)
		if err != nil || len(ts2) != len(ts) {
			t.Fatalf("re-decoding: %v", err)
		}
		for i := range ts {
			if ts[i].Name != ts2[i].Name || len(ts[i].Data) != len(ts2[i].Data) {
				t.Fatalf("tensor %d changed: %q → %q", i, ts[i].Name, ts2[i].Name)
			}
			for j := range ts[i].Data {
				if math.Float32bits(ts[i].Data[j]) != math.Float32bits(ts2[i].Data[j]) {
					t.Fatalf("tensor %q value %d changed: %x → %x", ts[i].Name, j, math.Float32bits(ts[i].Data[j]), math.Float32bits(ts2[i].Data[j]))
				}
			}
		}
	})
}

func ckpt(uid string, step int64) *checkpoint.Checkpoint {
	return &checkpoint.Checkpoint{
		Meta:   checkpoint.Meta{UID: uid, ModuleDigest: "sha256:ab", Step: step, Examples: 10 * step, Config: map[string]int64{"hidden_dim": 4}, Optimizer: `{"name":"adam"}`},
		Params: []checkpoint.Tensor{{Name: "w", Shape: []int{2}, Data: []float32{float32(step), 1}}},
		Optim:  []checkpoint.Tensor{{Name: "w.exp_avg", Shape: []int{2}, Data: []float32{0.5, 0.5}}},
	}
}

func TestStoreSaveLoadPrune(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := checkpoint.Open(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []int64{1, 2, 5, 10, 11} {
		if err := s.Save(ckpt("ffn.0", step)); err != nil {
			t.Fatal(err)
		}
	}
	infos, err := s.List("ffn.0")
	if err != nil {
		t.Fatal(err)
	}
	var steps []int64
	for _, in := range infos {
		steps = append(steps, in.Step)
		if in.Bytes <= 0 {
			t.Errorf("step %d has %d bytes", in.Step, in.Bytes)
		}
	}
	if !slices.Equal(steps, []int64{11, 10, 5}) {
		t.Errorf("kept steps %v, want [11 10 5]", steps)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "ffn.0", "*"))
	if len(files) != 9 { // three files (optimizer, parameters, manifest) each
		t.Errorf("%d files left, want 9: %v", len(files), files)
	}
	c, err := s.Load("ffn.0", 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.Step != 10 || c.Examples != 100 || c.Config["hidden_dim"] != 4 || c.ModuleDigest != "sha256:ab" || c.Optimizer != `{"name":"adam"}` ||
		!slices.Equal(c.Params[0].Data, []float32{10, 1}) || c.Optim[0].Name != "w.exp_avg" {
		t.Errorf("loaded %+v", c)
	}
	if _, err := s.Load("ffn.0", 1, 0); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("pruned step: %v, want ErrNotFound", err)
	}
	if _, err := s.Load("ffn.0", 11, 10); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("over the size bound: %v, want ErrCorrupt", err)
	}
	if in, err := s.List("ffn.9"); err != nil || len(in) != 0 {
		t.Errorf("unknown expert: %v, %v", in, err)
	}
}

func TestStoreCorruptAndLeftovers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := checkpoint.Open(dir, 0)
	for _, step := range []int64{1, 2} {
		if err := s.Save(ckpt("e", step)); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, "e", "2.safetensors")
	b, _ := os.ReadFile(p)
	os.WriteFile(p, b[:len(b)-3], 0o644)
	if _, err := s.Load("e", 2, 0); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("truncated: %v, want ErrCorrupt", err)
	}
	// A params file copied under another step's name is refused.
	os.WriteFile(filepath.Join(dir, "e", "3.safetensors"), mustRead(t, filepath.Join(dir, "e", "1.safetensors")), 0o644)
	os.WriteFile(filepath.Join(dir, "e", "3.optim.safetensors"), mustRead(t, filepath.Join(dir, "e", "1.optim.safetensors")), 0o644)
	if _, err := s.Load("e", 3, 0); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("renamed: %v, want ErrCorrupt", err)
	}
	// A missing optimizer file is not a checkpoint.
	os.Remove(filepath.Join(dir, "e", "1.optim.safetensors"))
	if _, err := s.Load("e", 1, 0); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("no optimizer file: %v, want ErrNotFound", err)
	}
	os.WriteFile(filepath.Join(dir, "e", ".tmp-123"), []byte("x"), 0o644)
	if _, err := checkpoint.Open(dir, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "e", ".tmp-123")); err == nil {
		t.Error("Open left a crashed write's temp file")
	}
}

// TestStoreOpenLazy reads a checkpoint's parameters one by one from the
// file, as a restore does: Open checks every header and reads the
// optimizer's file, the parameters come out only through ReadParam, a
// slice of the wrong length is refused, and a file cut short after Open
// fails the read instead of leaving zeros.
func TestStoreOpenLazy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := checkpoint.Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := ckpt("e", 7)
	c.Params = []checkpoint.Tensor{
		{Name: "w", Shape: []int{2, 3}, Data: []float32{1, -2, 3.5, 4, 5, 6}},
		{Name: "b", Shape: []int{3}, Data: []float32{0.25, -0.5, 1e-7}},
	}
	if err := s.Save(c); err != nil {
		t.Fatal(err)
	}
	l, err := s.Open("e", 7, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Step != 7 || l.UID != "e" || len(l.Optim) != 1 || !slices.Equal(l.Optim[0].Data, []float32{0.5, 0.5}) {
		t.Fatalf("opened %+v", l.Checkpoint)
	}
	if len(l.Params) != 2 {
		t.Fatalf("%d params, want 2", len(l.Params))
	}
	for i, p := range l.Params {
		want := c.Params[slices.IndexFunc(c.Params, func(w checkpoint.Tensor) bool { return w.Name == p.Name })]
		if p.Data != nil || !slices.Equal(p.Shape, want.Shape) {
			t.Fatalf("param %d: %+v before ReadParam, want %q of shape %v and no data", i, p, want.Name, want.Shape)
		}
		got := make([]float32, len(want.Data))
		if err := l.ReadParam(i, got); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want.Data) {
			t.Fatalf("param %q: read %v, want %v", p.Name, got, want.Data)
		}
		if err := l.ReadParam(i, make([]float32, len(want.Data)+1)); err == nil {
			t.Fatalf("param %q: a slice one too long was filled", p.Name)
		}
	}
	p := filepath.Join(dir, "e", "7.safetensors")
	if err := os.Truncate(p, 100); err != nil {
		t.Fatal(err)
	}
	last := len(l.Params) - 1
	if err := l.ReadParam(last, make([]float32, 3)); err == nil {
		t.Fatal("a param read from a file cut short after Open succeeded")
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCheckDirName(t *testing.T) {
	t.Parallel()
	for _, uid := range []string{"", ".", "..", "../x", "a/b", `a\b`, ".hidden"} {
		if checkpoint.CheckDirName(uid) == nil {
			t.Errorf("CheckDirName(%q) = nil", uid)
		}
	}
	for _, uid := range []string{"ffn.0", "ffn.3.14", "expert_a"} {
		if err := checkpoint.CheckDirName(uid); err != nil {
			t.Errorf("CheckDirName(%q) = %v", uid, err)
		}
	}
}
