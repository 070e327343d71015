package gpuhost_test

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/internal/testing/ref"
)

// wideCase is an op on shapes past the edges of a GPU kernel's layout,
// which the gradient table's small shapes never reach: rows longer than
// one block of threads, more rows than one chunk of a column sum or than
// one grid dimension, ids that repeat. ties rounds the float inputs to halves, so that maxima
// repeat and the first one must win.
type wideCase struct {
	opCase
	ties bool
}

var wideCases = []wideCase{
	{opCase: opCase{name: "layer_norm-wide", op: abi.OpLayerNorm, shapes: [][]int{{70, 1000}, {1000}, {1000}}}},
	{opCase: opCase{name: "rms_norm-wide", op: abi.OpRMSNorm, shapes: [][]int{{130, 300}, {300}}}},
	{opCase: opCase{name: "softmax-wide", op: abi.OpSoftmax, shapes: [][]int{{3, 1000}}, lo: -4, hi: 4}},
	{opCase: opCase{name: "softmax-wide-strided", op: abi.OpSoftmax, shapes: [][]int{{300, 4}}, attrs: []float64{0}}},
	{opCase: opCase{name: "log_softmax-wide", op: abi.OpLogSoftmax, shapes: [][]int{{2, 700}}, lo: -4, hi: 4}},
	{opCase: opCase{name: "sum-wide", op: abi.OpSum, shapes: [][]int{{2, 700, 3}}, attrs: []float64{1}}},
	{opCase: opCase{name: "mean-wide", op: abi.OpMean, shapes: [][]int{{3, 900}}}},
	{opCase: opCase{name: "max-wide-ties", op: abi.OpMax, shapes: [][]int{{4, 600}}}, ties: true},
	{opCase: opCase{name: "max-wide-ties-strided", op: abi.OpMax, shapes: [][]int{{600, 3}}, attrs: []float64{0}}, ties: true},
	// Axes with 32 or more elements after them: a GPU takes a thread per
	// row there.
	{opCase: opCase{name: "softmax-inner-40", op: abi.OpSoftmax, shapes: [][]int{{50, 40}}, attrs: []float64{0}, lo: -3, hi: 3}},
	{opCase: opCase{name: "log_softmax-inner-33", op: abi.OpLogSoftmax, shapes: [][]int{{3, 20, 33}}, attrs: []float64{1}}},
	{opCase: opCase{name: "sum-inner-64", op: abi.OpSum, shapes: [][]int{{300, 64}}, attrs: []float64{0}}},
	{opCase: opCase{name: "mean-inner-40", op: abi.OpMean, shapes: [][]int{{2, 5, 40}}, attrs: []float64{1, 1}}},
	{opCase: opCase{name: "max-inner-64-ties", op: abi.OpMax, shapes: [][]int{{300, 64}}, attrs: []float64{0}}, ties: true},
	// More rows than a grid's 65535 blocks in x: a GPU's row kernels
	// spill into grid.y.
	{opCase: opCase{name: "max-rows-past-grid-x", op: abi.OpMax, shapes: [][]int{{65537, 2}}}, ties: true},
	{opCase: opCase{name: "permute-rank5", op: abi.OpPermute, shapes: [][]int{{2, 3, 4, 5, 6}}, attrs: []float64{4, 2, 0, 3, 1}}},
	// Dims that a GPU merges (contiguous in both orders) or drops (1s).
	{opCase: opCase{name: "permute-mergeable", op: abi.OpPermute, shapes: [][]int{{2, 3, 4, 5}}, attrs: []float64{2, 3, 0, 1}}},
	{opCase: opCase{name: "permute-unit-dims", op: abi.OpPermute, shapes: [][]int{{1, 3, 1, 4, 2}}, attrs: []float64{3, 0, 2, 4, 1}}},
	{opCase: opCase{name: "permute-identity-but-units", op: abi.OpPermute, shapes: [][]int{{3, 1, 4}}, attrs: []float64{1, 0, 2}}},
	{opCase: opCase{name: "embedding-repeated-ids", op: abi.OpEmbedding, shapes: [][]int{{600}, {5, 40}}, kinds: []argKind{kIDs32}, ids: 5}},
	{opCase: opCase{name: "embedding-wide-int64", op: abi.OpEmbedding, shapes: [][]int{{3, 7}, {9, 300}}, kinds: []argKind{kIDs64}, ids: 9}},
	{opCase: opCase{name: "cross_entropy-wide-mean", op: abi.OpCrossEntropy, shapes: [][]int{{5, 1000}, {5}}, attrs: []float64{1}, kinds: []argKind{kFloat, kTarget}, ids: 1000, lo: -3, hi: 3}},
	{opCase: opCase{name: "attention-long-causal", op: abi.OpAttention, shapes: [][]int{{1, 2, 3, 8}, {1, 2, 300, 8}, {1, 2, 300, 4}}, attrs: []float64{1}}},
	{opCase: opCase{name: "attention-long-mask", op: abi.OpAttention, shapes: [][]int{{2, 1, 3, 4}, {2, 1, 300, 4}, {2, 1, 300, 4}, {2, 300}}, kinds: []argKind{kFloat, kFloat, kFloat, kPadMask}}},
}

// runWide runs c forward and backward on dev with inputs from seed, and
// returns the outputs (concatenated) and the gradients of the float args.
func runWide(t *testing.T, dev gpuhost.Device, c wideCase, seed uint64) ([]float32, [][]float32) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 99))
	lo, hi := c.lo, c.hi
	if lo == 0 && hi == 0 {
		lo, hi = -1, 1
	}
	args := make([]*gpuhost.Tensor, len(c.shapes))
	var wrt []*gpuhost.Tensor
	for j := range c.shapes {
		var v []float64
		v, args[j] = makeArg(t, dev, rng, c.opCase, j, lo, hi)
		if args[j].DType() != abi.DTypeFloat32 {
			continue
		}
		if c.ties {
			for i := range v {
				v[i] = math.Round(2*v[i]) / 2
			}
			args[j] = mustTensor(t, dev, c.shapes[j], v)
		}
		wrt = append(wrt, args[j])
	}
	tape := gpuhost.NewTape()
	outs, err := gpuhost.ApplyMulti(dev, tape, c.op, args, c.attrs)
	if err != nil {
		t.Fatalf("%s: ApplyMulti: %v", dev.Name(), err)
	}
	var got []float32
	gouts := make([]*gpuhost.Tensor, len(outs))
	for j, o := range outs {
		got = append(got, mustFloats(t, dev, o)...)
		gouts[j] = mustTensor(t, dev, o.Shape(), randVals(rng, o.Len(), -1, 1))
	}
	grads, err := tape.Backward(dev, outs, gouts, wrt)
	if err != nil {
		t.Fatalf("%s: Backward: %v", dev.Name(), err)
	}
	gs := make([][]float32, len(grads))
	for j, g := range grads {
		gs[j] = mustFloats(t, dev, g)
	}
	return got, gs
}

// TestDevicesAgreeOnWideShapes runs the wide cases on every device and
// compares each with the serial CPU device, which the gradient table
// checks against float64 references.
func TestDevicesAgreeOnWideShapes(t *testing.T) {
	t.Parallel()
	base := gpuhost.NewCPU(1)
	for i, c := range wideCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			wantOut, wantGrads := runWide(t, base, c, uint64(i))
			for _, d := range devices() {
				if d.name == "cpu-1" {
					continue
				}
				got, grads := runWide(t, d.dev, c, uint64(i))
				// !(e <= tol) fails a NaN too: an element never written.
				if e := ref.RelErr(got, f64(wantOut)); !(e <= 1e-5) {
					t.Errorf("%s: forward relative error %.3g > 1e-5", d.name, e)
				}
				for j, g := range grads {
					if e := ref.RelErr(g, f64(wantGrads[j])); !(e <= 1e-4) {
						t.Errorf("%s: grad %d: relative error %.3g > 1e-4", d.name, j, e)
					}
				}
			}
		})
	}
}

func f64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, e := range v {
		out[i] = float64(e)
	}
	return out
}

// TestIDErrorsOnEveryDevice checks that embedding and cross_entropy name
// the first bad id or target on every device, however far into the ids
// it is and whatever bad ones follow it, and record nothing.
func TestIDErrorsOnEveryDevice(t *testing.T) {
	t.Parallel()
	for _, d := range devices() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			dev := d.dev
			ints := func(dt abi.DType, n int, fill int64, at map[int]int64) *gpuhost.Tensor {
				b := make([]byte, n*dt.Size())
				for i := range n {
					v := fill
					if w, ok := at[i]; ok {
						v = w
					}
					if dt == abi.DTypeInt32 {
						binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(v)))
					} else {
						binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
					}
				}
				x, err := dev.FromBytes(dt, []int{n}, b)
				if err != nil {
					t.Fatal(err)
				}
				return x
			}
			table := mustZeros(t, dev, abi.DTypeFloat32, 4, 3)
			logits := mustZeros(t, dev, abi.DTypeFloat32, 3000, 2)
			tests := []struct {
				name    string
				op      abi.Op
				args    []*gpuhost.Tensor
				attrs   []float64
				wantMsg string
			}{
				{name: "embedding-first-of-two-blocks", op: abi.OpEmbedding, args: []*gpuhost.Tensor{ints(abi.DTypeInt64, 3000, 1, map[int]int64{2999: -1, 2500: 9, 700: 4}), table}, wantMsg: "id 4 at index 700 "},
				{name: "embedding-index-0", op: abi.OpEmbedding, args: []*gpuhost.Tensor{ints(abi.DTypeInt32, 600, 3, map[int]int64{0: -7, 1: 8}), table}, wantMsg: "id -7 at index 0 "},
				// The CUDA device's check runs 1,024 blocks of 256 threads
				// over the ids, so in 263,000 ids the threads below 856 see
				// two: the last id, and a bad id twice in one thread.
				{name: "embedding-last", op: abi.OpEmbedding, args: []*gpuhost.Tensor{ints(abi.DTypeInt32, 263000, 2, map[int]int64{262999: math.MaxInt32}), table}, wantMsg: "id 2147483647 at index 262999 "},
				{name: "embedding-two-in-one-thread", op: abi.OpEmbedding, args: []*gpuhost.Tensor{ints(abi.DTypeInt64, 263000, 2, map[int]int64{500: 5, 262644: 9}), table}, wantMsg: "id 5 at index 500 "},
				{name: "cross_entropy-after-ignored", op: abi.OpCrossEntropy, args: []*gpuhost.Tensor{logits, ints(abi.DTypeInt64, 3000, -100, map[int]int64{1200: 2, 900: -5, 100: 1})}, wantMsg: "target -5 of row 900 "},
				{name: "cross_entropy-ignore-attr", op: abi.OpCrossEntropy, args: []*gpuhost.Tensor{logits, ints(abi.DTypeInt32, 3000, 7, map[int]int64{2000: -100})}, attrs: []float64{0, 7}, wantMsg: "target -100 of row 2000 "},
			}
			for _, tt := range tests {
				tape := gpuhost.NewTape()
				out, err := gpuhost.Apply(dev, tape, tt.op, tt.args, tt.attrs)
				if !errors.Is(err, gpuhost.ErrArgument) || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Errorf("%s: Apply error = %v, want ErrArgument naming %q", tt.name, err, tt.wantMsg)
				}
				if out != nil || tape.Len() != 0 {
					t.Errorf("%s: failed Apply returned %v and recorded %d ops", tt.name, out, tape.Len())
				}
			}

			// Rows that are all ignored count for nothing: the mean is NaN.
			tape := gpuhost.NewTape()
			tg := ints(abi.DTypeInt64, 3000, -100, nil)
			out, err := gpuhost.Apply(dev, tape, abi.OpCrossEntropy, []*gpuhost.Tensor{logits, tg}, []float64{1})
			if err != nil {
				t.Fatal(err)
			}
			if v := mustFloats(t, dev, out); !math.IsNaN(float64(v[0])) {
				t.Errorf("mean over all-ignored rows = %v, want NaN", v)
			}
			// One row counts: the mean is that row's loss, log 2.
			tg = ints(abi.DTypeInt64, 3000, -100, map[int]int64{2100: 1})
			out, err = gpuhost.Apply(dev, tape, abi.OpCrossEntropy, []*gpuhost.Tensor{logits, tg}, []float64{1})
			if err != nil {
				t.Fatal(err)
			}
			if v := mustFloats(t, dev, out); !slices.Equal(v, []float32{float32(math.Ln2)}) {
				t.Errorf("mean over one counted row of zeros = %v, want [ln 2]", v)
			}
		})
	}
}

// TestMaxPicksFirstOnEveryDevice checks max's arg-max where threads of a
// GPU block meet: the first NaN beats every number, and of equal maxima
// the first wins, wherever in a row longer than a block they are.
func TestMaxPicksFirstOnEveryDevice(t *testing.T) {
	t.Parallel()
	const w = 600
	nan := math.NaN()
	// In a block of 256 threads, index 260 is thread 4's and 250 thread
	// 250's, and a tree reduction brings thread 4's candidate to thread 0
	// first: the first of equals must win by index, not by arrival.
	rows := []struct {
		name string
		set  map[int]float64 // on a row of -1s
		want int
	}{
		{name: "nans", set: map[int]float64{5: 3, 260: nan, 250: nan, 599: nan}, want: 250},
		{name: "nan-first", set: map[int]float64{0: nan, 1: 5}, want: 0},
		{name: "ties", set: map[int]float64{260: 2, 250: 2, 556: 2, 45: 1}, want: 250},
		{name: "signed-zeros", set: func() map[int]float64 {
			m := map[int]float64{}
			for j := range w {
				m[j] = math.Copysign(0, float64(j%3-1))
			}
			return m
		}(), want: 0},
	}
	x := make([]float64, 0, len(rows)*w)
	for _, r := range rows {
		for j := range w {
			v, ok := r.set[j]
			if !ok {
				v = -1
			}
			x = append(x, v)
		}
	}
	for _, d := range devices() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			xt := mustTensor(t, d.dev, []int{len(rows), w}, x)
			tape := gpuhost.NewTape()
			y, err := gpuhost.Apply(d.dev, tape, abi.OpMax, []*gpuhost.Tensor{xt}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ones := make([]float64, len(rows))
			for i := range ones {
				ones[i] = 1
			}
			g, err := tape.Backward(d.dev, []*gpuhost.Tensor{y}, []*gpuhost.Tensor{mustTensor(t, d.dev, []int{len(rows)}, ones)}, []*gpuhost.Tensor{xt})
			if err != nil {
				t.Fatal(err)
			}
			yv, gv := mustFloats(t, d.dev, y), mustFloats(t, d.dev, g[0])
			for i, r := range rows {
				want := x[i*w+r.want]
				if got := float64(yv[i]); math.Float64bits(got) != math.Float64bits(want) && !(math.IsNaN(got) && math.IsNaN(want)) {
					t.Errorf("%s: max = %v, want %v", r.name, got, want)
				}
				at := slices.Index(gv[i*w:(i+1)*w], 1)
				if at != r.want || slices.ContainsFunc(gv[i*w+at+1:(i+1)*w], func(v float32) bool { return v != 0 }) {
					t.Errorf("%s: the gradient goes to %d, want only %d", r.name, at, r.want)
				}
			}
		})
	}
}

// TestApplyNoPanicOnBuildDevices is TestApplyNoPanic on the devices that
// only some builds have (the CUDA device under -tags cudaemu or cuda),
// with fewer calls: hostile ids, targets, shapes and attrs return errors
// there too, and no kernel reads or writes out of bounds.
func TestApplyNoPanicOnBuildDevices(t *testing.T) {
	t.Parallel()
	other := gpuhost.NewCPU(1)
	for _, d := range buildDevices {
		for _, op := range append(abi.Ops(), 0, 37) {
			t.Run(d.name+"/"+op.String(), func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewPCG(uint64(op), 5))
				for range 400 {
					fuzzOne(t, rng, d.dev, other, op)
				}
			})
		}
	}
}
