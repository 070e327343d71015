package gpuhost

import (
	"errors"
	"fmt"
	"math"

	"github.com/moehost/moehost/abi"
)

// opSpec is what Apply checks before it looks at shapes.
type opSpec struct {
	minArgs, maxArgs int
	maxAttrs         int
}

var opSpecs = map[abi.Op]opSpec{
	abi.OpMatMul:    {2, 2, 2},
	abi.OpLinear:    {2, 3, 0},
	abi.OpAdd:       {2, 2, 0},
	abi.OpGeluTanh:  {1, 1, 0},
	abi.OpLayerNorm: {3, 3, 1},
}

// defaultLayerNormEps is torch.nn.functional.layer_norm's default.
const defaultLayerNormEps = 1e-5

// record is one op on a Tape, with the sizes and saved tensors its backward
// needs.
type record struct {
	op   abi.Op
	args []*Tensor
	out  *Tensor

	ta, tb  bool // matmul
	m, n, k int  // matmul, linear (m rows, n out, k in)
	swapped bool // add: args[1] is the larger operand
	// layer norm: the forward's row statistics.
	mean, rstd *Tensor
}

// Apply runs op on args with attrs and returns a new tensor. Every arg must
// be a float32 tensor on dev; abi.Op documents each op's args, attrs and
// defaults. Shapes that do not fit give ErrShape, bad counts, attrs or
// dtypes ErrArgument, and an unknown code ErrUnknownOp. When tape is not nil
// the op is recorded so that [Tape.Backward] can differentiate through it.
func Apply(dev Device, tape *Tape, op abi.Op, args []*Tensor, attrs []float64) (*Tensor, error) {
	rec, err := prepare(dev, op, args, attrs)
	if err != nil {
		return nil, err
	}
	if err := forward(dev, rec, attrs); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if tape != nil {
		tape.recs = append(tape.recs, rec)
	}
	return rec.out, nil
}

// prepare validates an op's inputs, and returns its record with the output
// allocated.
func prepare(dev Device, op abi.Op, args []*Tensor, attrs []float64) (*record, error) {
	spec, ok := opSpecs[op]
	if !ok {
		return nil, fmt.Errorf("%w: code %d", ErrUnknownOp, int32(op))
	}
	if dev == nil {
		return nil, fmt.Errorf("%w: %s: nil device", ErrArgument, op)
	}
	if len(args) < spec.minArgs || len(args) > spec.maxArgs {
		return nil, fmt.Errorf("%w: %s: %d args, want %s", ErrArgument, op, len(args), countRange(spec.minArgs, spec.maxArgs))
	}
	if len(attrs) > spec.maxAttrs {
		return nil, fmt.Errorf("%w: %s: %d attrs, want at most %d", ErrArgument, op, len(attrs), spec.maxAttrs)
	}
	for i, t := range args {
		if err := checkFloat(dev, t); err != nil {
			return nil, fmt.Errorf("%w: %s: arg %d: %w", ErrArgument, op, i, err)
		}
	}
	rec := &record{op: op, args: append([]*Tensor(nil), args...)}
	var shape []int
	switch op {
	case abi.OpMatMul:
		a, b := args[0], args[1]
		var err error
		if rec.ta, err = flagAttr(attrs, 0); err != nil {
			return nil, fmt.Errorf("%w: matmul: transpose_a: %w", ErrArgument, err)
		}
		if rec.tb, err = flagAttr(attrs, 1); err != nil {
			return nil, fmt.Errorf("%w: matmul: transpose_b: %w", ErrArgument, err)
		}
		if len(a.shape) != 2 || len(b.shape) != 2 {
			return nil, fmt.Errorf("%w: matmul: A is %v and B is %v, both must be 2-D", ErrShape, a.shape, b.shape)
		}
		m, ka := a.shape[0], a.shape[1]
		if rec.ta {
			m, ka = ka, m
		}
		kb, n := b.shape[0], b.shape[1]
		if rec.tb {
			kb, n = n, kb
		}
		if ka != kb {
			return nil, fmt.Errorf("%w: matmul: A %v (transpose_a=%t) and B %v (transpose_b=%t) disagree on k: %d vs %d",
				ErrShape, a.shape, rec.ta, b.shape, rec.tb, ka, kb)
		}
		rec.m, rec.n, rec.k = m, n, ka
		shape = []int{m, n}
	case abi.OpLinear:
		x, w := args[0], args[1]
		if len(x.shape) < 1 {
			return nil, fmt.Errorf("%w: linear: x is a scalar", ErrShape)
		}
		if len(w.shape) != 2 {
			return nil, fmt.Errorf("%w: linear: W is %v, want [out, in]", ErrShape, w.shape)
		}
		in := x.shape[len(x.shape)-1]
		if w.shape[1] != in {
			return nil, fmt.Errorf("%w: linear: x %v has %d features, W %v expects %d", ErrShape, x.shape, in, w.shape, w.shape[1])
		}
		out := w.shape[0]
		if len(args) == 3 && (len(args[2].shape) != 1 || args[2].shape[0] != out) {
			return nil, fmt.Errorf("%w: linear: b is %v, W %v wants [%d]", ErrShape, args[2].shape, w.shape, out)
		}
		rec.m, rec.n, rec.k = x.n/in, out, in
		shape = append(append([]int{}, x.shape[:len(x.shape)-1]...), out)
	case abi.OpAdd:
		a, b := args[0], args[1]
		switch {
		case isSuffix(b.shape, a.shape):
		case isSuffix(a.shape, b.shape):
			rec.swapped = true
		default:
			return nil, fmt.Errorf("%w: add: %v and %v do not broadcast (one must be a suffix of the other)", ErrShape, a.shape, b.shape)
		}
		shape = a.shape
		if rec.swapped {
			shape = b.shape
		}
	case abi.OpGeluTanh:
		shape = args[0].shape
	case abi.OpLayerNorm:
		x, w, b := args[0], args[1], args[2]
		if len(x.shape) < 1 {
			return nil, fmt.Errorf("%w: layer_norm: x is a scalar", ErrShape)
		}
		h := x.shape[len(x.shape)-1]
		if len(w.shape) != 1 || w.shape[0] != h || len(b.shape) != 1 || b.shape[0] != h {
			return nil, fmt.Errorf("%w: layer_norm: x %v wants w and b of [%d], got %v and %v", ErrShape, x.shape, h, w.shape, b.shape)
		}
		eps := defaultLayerNormEps
		if len(attrs) > 0 {
			eps = attrs[0]
		}
		if !(eps >= 0) || math.IsInf(eps, 0) {
			return nil, fmt.Errorf("%w: layer_norm: eps %v is not a finite non-negative number", ErrArgument, eps)
		}
		rows := x.n / h
		var err error
		if rec.mean, err = dev.Zeros(abi.DTypeFloat32, []int{rows}); err != nil {
			return nil, fmt.Errorf("layer_norm: %w", err)
		}
		if rec.rstd, err = dev.Zeros(abi.DTypeFloat32, []int{rows}); err != nil {
			return nil, fmt.Errorf("layer_norm: %w", err)
		}
		shape = x.shape
	default:
		panic("BUG: op in opSpecs without a case in prepare: " + op.String())
	}
	out, err := dev.Zeros(abi.DTypeFloat32, shape)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	rec.out = out
	return rec, nil
}

// forward runs a prepared record's kernels.
func forward(dev Device, rec *record, attrs []float64) error {
	a, out := rec.args, rec.out
	switch rec.op {
	case abi.OpMatMul:
		return dev.gemm(rec.ta, rec.tb, rec.m, rec.n, rec.k, a[0], a[1], out, false)
	case abi.OpLinear:
		if err := dev.gemm(false, true, rec.m, rec.n, rec.k, a[0], a[1], out, false); err != nil {
			return err
		}
		if len(a) == 3 {
			return dev.addRepeat(out, out, a[2])
		}
		return nil
	case abi.OpAdd:
		if rec.swapped {
			return dev.addRepeat(out, a[1], a[0])
		}
		return dev.addRepeat(out, a[0], a[1])
	case abi.OpGeluTanh:
		return dev.geluForward(out, a[0])
	case abi.OpLayerNorm:
		eps := defaultLayerNormEps
		if len(attrs) > 0 {
			eps = attrs[0]
		}
		return dev.layerNormForward(out, rec.mean, rec.rstd, a[0], a[1], a[2], eps)
	}
	panic("BUG: forward of unprepared op " + rec.op.String())
}

// checkFloat checks that t is a float32 tensor on dev.
func checkFloat(dev Device, t *Tensor) error {
	if t == nil {
		return errors.New("nil tensor")
	}
	if t.dev == nil {
		return errors.New("tensor not made by a device")
	}
	if t.dev != dev {
		return fmt.Errorf("tensor on device %q, want %q", t.dev.Name(), dev.Name())
	}
	if t.dt != abi.DTypeFloat32 {
		return fmt.Errorf("dtype %s, want float32", t.dt)
	}
	return nil
}

// flagAttr reads a 0|1 attr at index i, which defaults to 0.
func flagAttr(attrs []float64, i int) (bool, error) {
	if i >= len(attrs) {
		return false, nil
	}
	switch attrs[i] {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return false, fmt.Errorf("%v is neither 0 nor 1", attrs[i])
}

func countRange(lo, hi int) string {
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d to %d", lo, hi)
}
