package hivemind

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/abi/half"
	hivemindv1 "github.com/moehost/moehost/gen/hivemind/v1"
)

func f32(b []byte) []float32 { return float32s(b) }

func TestTensorCodecs(t *testing.T) {
	t.Parallel()
	vals := []float32{1.5, -2.25, 3, 0.125, 100, -7.5}
	shape := []int{2, 3}
	fp16 := make([]byte, 12)
	_ = half.Encode(abi.DTypeFloat16, fp16, vals)
	// MEANSTD: rows [1.5,-2.25,3] and [0.125,100,-7.5] as (v-mean)/std in
	// float16, then the means and stds as float32.
	var ms []byte
	{
		enc, err := EncodeTensor(Tensor{DType: abi.DTypeFloat32, Shape: shape, Data: float32Bytes(vals)}, hivemindv1.CompressionType_COMPRESSION_TYPE_MEANSTD_16BIT)
		if err != nil {
			t.Fatal(err)
		}
		ms = enc.GetBuffer()
	}
	// 8-bit: codebook of 3 and codes into it.
	book := []float32{-1, 0.5, 2}
	q := binary.LittleEndian.AppendUint64(nil, 3)
	q = append(q, float32Bytes(book)...)
	q = append(q, 0, 1, 2, 2, 1, 0)
	tests := []struct {
		name    string
		pb      *hivemindv1.Tensor
		want    []float32
		tol     float32
		wantErr bool
	}{
		{"none", &hivemindv1.Tensor{Dtype: "float32", Size: []uint32{2, 3}, Buffer: float32Bytes(vals)}, vals, 0, false},
		{"float16", &hivemindv1.Tensor{Dtype: "float32", Size: []uint32{2, 3}, Buffer: fp16, Compression: hivemindv1.CompressionType_COMPRESSION_TYPE_FLOAT16}, vals, 0, false},
		{"meanstd", &hivemindv1.Tensor{Dtype: "float32", Size: []uint32{2, 3}, Buffer: ms, Compression: hivemindv1.CompressionType_COMPRESSION_TYPE_MEANSTD_16BIT}, vals, 0.05, false},
		{"uniform8", &hivemindv1.Tensor{Dtype: "float32", Size: []uint32{2, 3}, Buffer: q, Compression: hivemindv1.CompressionType_COMPRESSION_TYPE_UNIFORM_8BIT}, []float32{-1, 0.5, 2, 2, 0.5, -1}, 0, false},
		{"quantile8", &hivemindv1.Tensor{Dtype: "float32", Size: []uint32{2, 3}, Buffer: q, Compression: hivemindv1.CompressionType_COMPRESSION_TYPE_QUANTILE_8BIT}, []float32{-1, 0.5, 2, 2, 0.5, -1}, 0, false},
		{"short buffer", &hivemindv1.Tensor{Dtype: "float32", Size: []uint32{2, 3}, Buffer: float32Bytes(vals[:5])}, nil, 0, true},
		{"unknown dtype", &hivemindv1.Tensor{Dtype: "complex64", Size: []uint32{1}, Buffer: make([]byte, 8)}, nil, 0, true},
		{"code past codebook", &hivemindv1.Tensor{Dtype: "float32", Size: []uint32{1}, Buffer: append(append(binary.LittleEndian.AppendUint64(nil, 1), float32Bytes([]float32{1})...), 5), Compression: hivemindv1.CompressionType_COMPRESSION_TYPE_UNIFORM_8BIT}, nil, 0, true},
		{"huge codebook", &hivemindv1.Tensor{Dtype: "float32", Size: []uint32{1}, Buffer: binary.LittleEndian.AppendUint64(nil, 1<<40), Compression: hivemindv1.CompressionType_COMPRESSION_TYPE_QUANTILE_8BIT}, nil, 0, true},
		{"blockwise", &hivemindv1.Tensor{Dtype: "float32", Size: []uint32{1}, Buffer: make([]byte, 16), Compression: hivemindv1.CompressionType_COMPRESSION_TYPE_BLOCKWISE_8BIT}, nil, 0, true},
		{"over budget", &hivemindv1.Tensor{Dtype: "float32", Size: []uint32{1 << 20, 1 << 10}, Buffer: nil}, nil, 0, true},
		{"overflowing size", &hivemindv1.Tensor{Dtype: "float32", Size: []uint32{1 << 31, 1 << 31, 4}, Buffer: nil}, nil, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := DecodeTensor(tt.pb, 1<<20)
			if tt.wantErr {
				if !errors.Is(err, ErrBadTensor) {
					t.Fatalf("err = %v, want ErrBadTensor", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.DType != abi.DTypeFloat32 || len(got.Shape) != 2 || got.Shape[0] != 2 || got.Shape[1] != 3 {
				t.Fatalf("got %v %v", got.DType, got.Shape)
			}
			g := f32(got.Data)
			for i := range tt.want {
				if d := math.Abs(float64(g[i] - tt.want[i])); d > float64(tt.tol)*math.Max(1, math.Abs(float64(tt.want[i]))) {
					t.Errorf("element %d = %v, want %v", i, g[i], tt.want[i])
				}
			}
		})
	}
}

func TestEncodeFloat16Clamps(t *testing.T) {
	t.Parallel()
	pb, err := EncodeTensor(Tensor{DType: abi.DTypeFloat32, Shape: []int{2}, Data: float32Bytes([]float32{1e9, -1e9})}, hivemindv1.CompressionType_COMPRESSION_TYPE_FLOAT16)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeTensor(pb, 1<<10)
	if err != nil {
		t.Fatal(err)
	}
	if g := f32(back.Data); g[0] != 65504 || g[1] != -65504 {
		t.Fatalf("got %v, want ±65504", g)
	}
}

func TestFrames(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := writeFrame(&b, markerMessage, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := writeFrame(&b, markerError, nil); err != nil {
		t.Fatal(err)
	}
	m, p, err := readFrame(&b, 5)
	if err != nil || m != markerMessage || string(p) != "hello" {
		t.Fatalf("frame 1: %v %q %v", m, p, err)
	}
	m, p, err = readFrame(&b, 5)
	if err != nil || m != markerError || len(p) != 0 {
		t.Fatalf("frame 2: %v %q %v", m, p, err)
	}
	if _, _, err := readFrame(&b, 5); err != io.EOF {
		t.Fatalf("end: %v, want EOF", err)
	}
	// A frame over the limit is refused from its header alone.
	hdr := append([]byte{0}, binary.BigEndian.AppendUint64(nil, 1<<62)...)
	if _, _, err := readFrame(bytes.NewReader(hdr), 1<<20); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("huge frame: %v", err)
	}
	if _, _, err := readFrame(bytes.NewReader([]byte{7, 0, 0, 0, 0, 0, 0, 0, 0}), 10); err == nil {
		t.Fatal("bad marker accepted")
	}
	var d bytes.Buffer
	_ = writeDelimited(&d, []byte("abc"))
	got, err := readDelimited(bufio.NewReader(&d), 3)
	if err != nil || string(got) != "abc" {
		t.Fatalf("delimited: %q %v", got, err)
	}
	huge := binary.AppendUvarint(nil, 1<<40)
	if _, err := readDelimited(bufio.NewReader(bytes.NewReader(huge)), MaxUnaryBytes); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("huge delimited: %v", err)
	}
}

// TestInfoSchema decodes InfoBytes with a plain msgpack decoder and checks
// the structure hivemind's unpacker needs.
func TestInfoSchema(t *testing.T) {
	t.Parallel()
	b, err := InfoBytes(Schema{
		Inputs:  []Spec{{DType: abi.DTypeFloat32, Shape: []int{1024}}},
		Outputs: []Spec{{DType: abi.DTypeFloat32, Shape: []int{1024}}},
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A map of three keys, each an ext value of the type hivemind packs.
	d := msgpack.NewDecoder(bytes.NewReader(b))
	n, err := d.DecodeMapLen()
	if err != nil || n != 3 {
		t.Fatalf("map of %d: %v", n, err)
	}
	wantExt := map[string]int8{"forward_schema": extTuple, "outputs_schema": extDescriptor, "keyword_names": extTuple}
	var desc []byte
	for range n {
		k, err := d.DecodeString()
		if err != nil {
			t.Fatal(err)
		}
		raw, err := d.DecodeRaw()
		if err != nil {
			t.Fatal(err)
		}
		code, l, err := msgpack.NewDecoder(bytes.NewReader(raw)).DecodeExtHeader()
		if err != nil || code != wantExt[k] {
			t.Errorf("%s: ext %#x, want %#x (%v)", k, code, wantExt[k], err)
		}
		if k == "outputs_schema" {
			desc = raw[len(raw)-l:]
		}
		delete(wantExt, k)
	}
	if len(wantExt) != 0 {
		t.Fatalf("missing keys %v", wantExt)
	}
	// The descriptor: exactly the keys BatchTensorDescriptor takes.
	d = msgpack.NewDecoder(bytes.NewReader(desc))
	n, err = d.DecodeMapLen()
	if err != nil || n != 8 {
		t.Fatalf("descriptor map of %d: %v", n, err)
	}
	got := map[string]string{}
	for range n {
		k, _ := d.DecodeString()
		raw, _ := d.DecodeRaw()
		got[k] = string(raw)
	}
	// size: the tuple (None, 1024) as ext 0x40 of [nil, 1024].
	if !bytes.Contains([]byte(got["size"]), []byte{0x40, 0x92, 0xc0, 0xcd, 0x04, 0x00}) {
		t.Errorf("size = % x, want a tuple (None, 1024)", got["size"])
	}
	for k, want := range map[string]string{
		"dtype": string(packString("torch.float32")), "layout": string(packString("torch.strided")),
		"requires_grad": "\xc3", "pin_memory": "\xc2", "compression": "\x00", "device_type": string(packString("cpu")), "device_index": "\xc0",
	} {
		if got[k] != want {
			t.Errorf("%s = % x, want % x", k, got[k], want)
		}
	}
}

func TestUIDs(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		uid string
		ok  bool
	}{
		{"ffn.0", true}, {"ffn.3.14", true}, {"expert.10.0.7", true},
		{"ffn", false}, {"ffn.", false}, {"ffn.01", false}, {"ffn.-1", false}, {".3", false}, {"ffn.3.x", false},
		{"ffn.99999999999999999999999", false},
	} {
		if err := CheckGridUID(tt.uid); (err == nil) != tt.ok {
			t.Errorf("CheckGridUID(%q) = %v, want ok=%v", tt.uid, err, tt.ok)
		}
	}
	got := prefixes("ffn.1.2.3")
	if len(got) != 2 || got[0] != (prefixCoord{"ffn.1.2.", 3}) || got[1] != (prefixCoord{"ffn.1.", 2}) {
		t.Errorf("prefixes(ffn.1.2.3) = %v", got)
	}
	if got := prefixes("ffn.5"); len(got) != 1 || got[0] != (prefixCoord{"ffn.5.", -1}) {
		t.Errorf("prefixes(ffn.5) = %v", got)
	}
}

func TestDictionaryRoundTrip(t *testing.T) {
	t.Parallel()
	items := []dictItem{{subkey: packInt(3), value: packUIDPeer("ffn.0.3", "Qm"), expiration: 12.5}, {subkey: packInt(-1), value: []byte{1}, expiration: 13}}
	got, err := unpackDictionary(packDictionary(items))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !bytes.Equal(got[0].subkey, items[0].subkey) || !bytes.Equal(got[1].value, items[1].value) || got[1].expiration != 13 {
		t.Fatalf("got %+v", got)
	}
}

// TestStorage follows hivemind's DHTLocalStorage: a later expiration
// replaces, an earlier one is refused, a subkey turns a regular value into
// a dictionary only if it expires later, and expired records are refused
// and vanish.
func TestStorage(t *testing.T) {
	t.Parallel()
	n := &node{store: map[dhtID]*entry{}}
	k := keyID(packString("ffn.0."))
	now := dhtNow()
	steps := []struct {
		name           string
		subkey, value  []byte
		exp            float64
		ok             bool
		wantRegular    string
		wantDictionary int
	}{
		{"first", nil, []byte("a"), now + 10, true, "a", 0},
		{"older refused", nil, []byte("b"), now + 5, false, "a", 0},
		{"newer replaces", nil, []byte("c"), now + 20, true, "c", 0},
		{"subkey older than the value", packInt(1), []byte("x"), now + 15, false, "c", 0},
		{"subkey newer makes a dictionary", packInt(1), []byte("x"), now + 30, true, "", 1},
		{"second subkey", packInt(2), []byte("y"), now + 25, true, "", 2},
		{"older subkey refused", packInt(1), []byte("z"), now + 29, false, "", 2},
		{"expired refused", packInt(3), []byte("w"), now - 1, false, "", 2},
	}
	for _, st := range steps {
		if got := n.put(k, st.subkey, st.value, st.exp); got != st.ok {
			t.Fatalf("%s: put = %v, want %v", st.name, got, st.ok)
		}
		e := n.get(k)
		switch {
		case st.wantRegular != "" && (e == nil || e.reg == nil || string(e.reg.value) != st.wantRegular):
			t.Fatalf("%s: got %+v, want regular %q", st.name, e, st.wantRegular)
		case st.wantDictionary > 0 && (e == nil || len(e.dict) != st.wantDictionary):
			t.Fatalf("%s: got %+v, want %d subkeys", st.name, e, st.wantDictionary)
		}
	}
	n.put(keyID(packString("soon")), nil, []byte("v"), dhtNow()+0.05)
	time.Sleep(100 * time.Millisecond)
	if e := n.get(keyID(packString("soon"))); e != nil {
		t.Fatalf("expired record still found: %+v", e)
	}
	if n.bytes != n.store[k].size() {
		t.Fatalf("charged %d bytes, holding %d", n.bytes, n.store[k].size())
	}
}
