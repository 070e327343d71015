package gpuhost_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/internal/testing/ref"
)

// A post-norm transformer encoder layer, as torch.nn.TransformerEncoderLayer
// with norm_first=False and activation="gelu", without dropout:
//
//	h = LayerNorm(x + Wo·MHA(x))
//	y = LayerNorm(h + W2·gelu(W1·h))
const (
	encB, encT, encD, encH, encFF = 2, 5, 8, 2, 32
	encEps                        = 1e-5
)

// encNames names x and the layer's params, in order.
var encNames = []string{"x", "Wq", "bq", "Wk", "bk", "Wv", "bv", "Wo", "bo", "ln1.w", "ln1.b", "W1", "b1", "W2", "b2", "ln2.w", "ln2.b"}

func encShapes() [][]int {
	d, ff := encD, encFF
	return [][]int{{encB, encT, d}, {d, d}, {d}, {d, d}, {d}, {d, d}, {d}, {d, d}, {d}, {d}, {d}, {ff, d}, {ff}, {d, ff}, {d}, {d}, {d}}
}

// encMask pads the last two keys of batch 1; 1 marks padding.
func encMask() []float64 {
	m := make([]float64, encB*encT)
	m[encT+encT-1], m[encT+encT-2] = 1, 1
	return m
}

// refEncoder is the layer in float64.
func refEncoder(p [][]float64, mask []float64) []float64 {
	dh := encD / encH
	heads := func(y []float64) []float64 { // [B,T,d] → [B,H,T,dh]
		return refPermute(y, []int{encB, encT, encH, dh}, []int{0, 2, 1, 3})
	}
	q := heads(ref.Linear(p[0], p[1], p[2], encD, encD))
	k := heads(ref.Linear(p[0], p[3], p[4], encD, encD))
	v := heads(ref.Linear(p[0], p[5], p[6], encD, encD))
	s := []int{encB, encH, encT, dh}
	a := refAttention(q, k, v, mask, s, s, s, false, 0)
	a = refPermute(a, s, []int{0, 2, 1, 3})
	o := ref.Linear(a, p[7], p[8], encD, encD)
	h := ref.LayerNorm(ref.Add(p[0], o), p[9], p[10], encEps)
	f := ref.Linear(h, p[11], p[12], encD, encFF)
	f = refMap(f, func(v float64) float64 { return 0.5 * v * (1 + math.Erf(v/math.Sqrt2)) })
	f = ref.Linear(f, p[13], p[14], encFF, encD)
	return ref.LayerNorm(ref.Add(h, f), p[15], p[16], encEps)
}

// applyEncoder runs the layer on dev from gpuhost ops.
func applyEncoder(dev gpuhost.Device, tape *gpuhost.Tape, p []*gpuhost.Tensor, mask *gpuhost.Tensor) (*gpuhost.Tensor, error) {
	var err error
	op := func(o abi.Op, attrs []float64, args ...*gpuhost.Tensor) *gpuhost.Tensor {
		if err != nil {
			return nil
		}
		var y *gpuhost.Tensor
		y, err = gpuhost.Apply(dev, tape, o, args, attrs)
		return y
	}
	dh := float64(encD / encH)
	heads := func(y *gpuhost.Tensor) *gpuhost.Tensor {
		y = op(abi.OpReshape, []float64{encB, encT, encH, dh}, y)
		return op(abi.OpPermute, []float64{0, 2, 1, 3}, y)
	}
	x := p[0]
	q := heads(op(abi.OpLinear, nil, x, p[1], p[2]))
	k := heads(op(abi.OpLinear, nil, x, p[3], p[4]))
	v := heads(op(abi.OpLinear, nil, x, p[5], p[6]))
	a := op(abi.OpAttention, nil, q, k, v, mask)
	a = op(abi.OpPermute, []float64{0, 2, 1, 3}, a)
	a = op(abi.OpReshape, []float64{encB, encT, -1}, a)
	o := op(abi.OpLinear, nil, a, p[7], p[8])
	h := op(abi.OpLayerNorm, []float64{encEps}, op(abi.OpAdd, nil, x, o), p[9], p[10])
	f := op(abi.OpGelu, nil, op(abi.OpLinear, nil, h, p[11], p[12]))
	f = op(abi.OpLinear, nil, f, p[13], p[14])
	y := op(abi.OpLayerNorm, []float64{encEps}, op(abi.OpAdd, nil, h, f), p[15], p[16])
	return y, err
}

// TestTransformerEncoderGradients checks a whole encoder layer with a key
// padding mask: forward against the float64 reference, and the gradients
// of x and every param against central differences.
func TestTransformerEncoderGradients(t *testing.T) {
	t.Parallel()
	shapes := encShapes()
	maskV := encMask()
	for _, d := range devices() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(11, 5))
			in := make([][]float64, len(shapes))
			p := make([]*gpuhost.Tensor, len(shapes))
			for i, s := range shapes {
				lo, hi := -1.0, 1.0
				if i == 9 || i == 15 {
					lo, hi = 0.5, 1.5 // layer-norm gains
				}
				in[i] = randVals(rng, numel(s), lo, hi)
				p[i] = mustTensor(t, d.dev, s, in[i])
			}
			mb := make([]byte, len(maskV))
			for i, m := range maskV {
				mb[i] = byte(m)
			}
			mask, err := d.dev.FromBytes(abi.DTypeBool, []int{encB, encT}, mb)
			if err != nil {
				t.Fatal(err)
			}
			tape := gpuhost.NewTape()
			out, err := applyEncoder(d.dev, tape, p, mask)
			if err != nil {
				t.Fatalf("encoder: %v", err)
			}
			if e := ref.RelErr(mustFloats(t, d.dev, out), refEncoder(in, maskV)); e > 1e-5 {
				t.Errorf("forward relative error %.3g > 1e-5", e)
			}
			r := randVals(rng, out.Len(), -1, 1)
			grads, err := tape.Backward(d.dev, []*gpuhost.Tensor{out}, []*gpuhost.Tensor{mustTensor(t, d.dev, out.Shape(), r)}, p)
			if err != nil {
				t.Fatalf("Backward: %v", err)
			}
			fd := finiteDiff(in, func(x [][]float64) float64 { return ref.Dot(refEncoder(x, maskV), r) })
			for i, g := range grads {
				got := mustFloats(t, d.dev, g)
				if i == 4 {
					// Softmax ignores what bk adds to every score of a
					// row (q·bk), so its true gradient is zero; check
					// that it is zero up to rounding.
					if e := ref.RelErr(got, make([]float64, len(got))); e > 1e-5 || norm(fd[i]) > 1e-6 {
						t.Errorf("grad bk: norm %.3g (finite differences %.3g), want about 0", e, norm(fd[i]))
					}
					continue
				}
				if e := ref.RelErr(got, fd[i]); e > 1e-3 {
					t.Errorf("grad %s: relative error %.3g > 1e-3", encNames[i], e)
				}
			}
		})
	}
}

func norm(v []float64) float64 {
	return math.Sqrt(ref.Dot(v, v))
}
