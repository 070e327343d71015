package npy_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/moehost/moehost/cmd/moehost/internal/npy"
)

// numpy26 is np.save of np.arange(6, dtype='<f4').reshape(2, 3), byte for
// byte as NumPy 1.x and 2.x write it.
var numpy26 = func() []byte {
	h := "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + strings.Repeat(" ", 58) + "\n"
	b := append([]byte("\x93NUMPY\x01\x00"), byte(len(h)), 0)
	b = append(b, h...)
	for i := range 6 {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(i)))
	}
	return b
}()

func TestWriteAsNumPy(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := npy.Write(&buf, npy.Array{Shape: []int64{2, 3}, Data: []float32{0, 1, 2, 3, 4, 5}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), numpy26) {
		t.Errorf("Write:\n%q\nwant NumPy's\n%q", buf.Bytes(), numpy26)
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		a    npy.Array
	}{
		{name: "scalar", a: npy.Array{Shape: []int64{}, Data: []float32{7}}},
		{name: "vector", a: npy.Array{Shape: []int64{3}, Data: []float32{1, -2, 3.5}}},
		{name: "matrix", a: npy.Array{Shape: []int64{2, 2}, Data: []float32{1, 2, 3, float32(math.Inf(-1))}}},
		{name: "empty", a: npy.Array{Shape: []int64{0, 4}, Data: []float32{}}},
		{name: "3d", a: npy.Array{Shape: []int64{1, 2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			if err := npy.Write(&buf, tc.a); err != nil {
				t.Fatal(err)
			}
			got, err := npy.Read(&buf, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Shape, tc.a.Shape) || !slices.Equal(got.Data, tc.a.Data) {
				t.Errorf("read %v %v, want %v %v", got.Shape, got.Data, tc.a.Shape, tc.a.Data)
			}
		})
	}
}

// v2 wraps a header dict as format 2.0, padded to 64 bytes.
func v2(dict string, data ...float32) []byte {
	pad := (64 - (12+len(dict)+1)%64) % 64
	h := dict + strings.Repeat(" ", pad) + "\n"
	b := append([]byte("\x93NUMPY\x02\x00"), binary.LittleEndian.AppendUint32(nil, uint32(len(h)))...)
	b = append(b, h...)
	for _, v := range data {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

func TestReadVersion2(t *testing.T) {
	t.Parallel()
	got, err := npy.Read(bytes.NewReader(v2(`{"shape": (2,), "fortran_order": False, "descr": "<f4"}`, 1.5, -1)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Shape, []int64{2}) || !slices.Equal(got.Data, []float32{1.5, -1}) {
		t.Errorf("read %v %v", got.Shape, got.Data)
	}
}

func TestReadErrors(t *testing.T) {
	t.Parallel()
	ok := "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"
	for _, tc := range []struct {
		name, want string
		in         []byte
		max        int64
	}{
		{name: "not npy", in: []byte("PK\x03\x04zipzipzip"), want: "not a .npy file"},
		{name: "short", in: []byte("\x93NUM"), want: "preamble"},
		{name: "version", in: []byte("\x93NUMPY\x04\x00\x10\x00"), want: "format version 4.0"},
		{name: "float64", in: v2(strings.Replace(ok, "<f4", "<f8", 1), 1, 2, 3, 4), want: `dtype "<f8"`},
		{name: "big endian", in: v2(strings.Replace(ok, "<f4", ">f4", 1), 1, 2), want: `dtype ">f4"`},
		{name: "fortran", in: v2(strings.Replace(ok, "False", "True", 1), 1, 2), want: "fortran_order is True"},
		{name: "unknown key", in: v2("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 1, 2), want: `unknown key "x"`},
		{name: "missing shape", in: v2("{'descr': '<f4', 'fortran_order': False}"), want: "want 'descr', 'fortran_order' and 'shape'"},
		{name: "negative dim", in: v2("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}"), want: "non-negative"},
		{name: "short data", in: v2(ok, 1), want: "wants 8 bytes of data"},
		{name: "trailing data", in: v2(ok, 1, 2, 3), want: "bytes after"},
		{name: "over the data limit", in: v2(ok, 1, 2), max: 4, want: "over the limit of 4"},
		{name: "huge shape", in: v2("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4)}"), want: "too large"},
		{name: "huge shape under a limit", in: v2("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000)}"), max: 1 << 20, want: "over the limit"},
		{name: "huge header", in: append([]byte("\x93NUMPY\x02\x00"), 0xff, 0xff, 0xff, 0x7f), want: "over the limit of 10000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := npy.Read(bytes.NewReader(tc.in), tc.max)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Read: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// FuzzRead feeds Read arbitrary bytes: it must not panic or allocate past
// its limit, and what it accepts must write back and read the same.
func FuzzRead(f *testing.F) {
	f.Add(numpy26)
	f.Add(v2("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 3))
	f.Add(v2("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 0, 2), }"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := npy.Read(bytes.NewReader(b), 1<<20)
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := npy.Write(&buf, a); err != nil {
			t.Fatalf("Write of what Read accepted: %v", err)
		}
		back, err := npy.Read(&buf, 1<<20)
		if err != nil {
			t.Fatalf("Read of what Write wrote: %v", err)
		}
		if !slices.Equal(back.Shape, a.Shape) || len(back.Data) != len(a.Data) {
			t.Fatalf("round trip: %v → %v", a.Shape, back.Shape)
		}
		for i := range a.Data {
			if math.Float32bits(back.Data[i]) != math.Float32bits(a.Data[i]) {
				t.Fatalf("value %d: %x → %x", i, math.Float32bits(a.Data[i]), math.Float32bits(back.Data[i]))
			}
		}
	})
}
