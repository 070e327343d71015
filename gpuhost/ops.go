package gpuhost

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/moehost/moehost/abi"
)

// maxVarArgs bounds the tensors of a concat and the sections of a split;
// the sandbox passes at most 64 args and 64 attrs to an op.
const maxVarArgs = 64

// Arg kinds: what dtype an op accepts for one arg.
const (
	argFloat    = iota // float32
	argIDs             // int32 or int64
	argMask            // bool
	argCastable        // float32, int32, int64 or bool (cast's x)
)

// opSpec is what Apply checks before it looks at shapes.
type opSpec struct {
	minArgs, maxArgs int
	maxAttrs         int
	// kinds gives the dtype kind of each arg by index; args past its end
	// (and every arg when it is nil) are float32.
	kinds []int
	multi bool // several results: ApplyMulti only
}

var opSpecs = map[abi.Op]opSpec{
	abi.OpMatMul:       {minArgs: 2, maxArgs: 2, maxAttrs: 2},
	abi.OpLinear:       {minArgs: 2, maxArgs: 3},
	abi.OpAdd:          {minArgs: 2, maxArgs: 2},
	abi.OpGeluTanh:     {minArgs: 1, maxArgs: 1},
	abi.OpLayerNorm:    {minArgs: 3, maxArgs: 3, maxAttrs: 1},
	abi.OpSub:          {minArgs: 2, maxArgs: 2},
	abi.OpMul:          {minArgs: 2, maxArgs: 2},
	abi.OpDiv:          {minArgs: 2, maxArgs: 2},
	abi.OpScale:        {minArgs: 1, maxArgs: 1, maxAttrs: 1},
	abi.OpAddScalar:    {minArgs: 1, maxArgs: 1, maxAttrs: 1},
	abi.OpRelu:         {minArgs: 1, maxArgs: 1},
	abi.OpGelu:         {minArgs: 1, maxArgs: 1},
	abi.OpTanh:         {minArgs: 1, maxArgs: 1},
	abi.OpSigmoid:      {minArgs: 1, maxArgs: 1},
	abi.OpSilu:         {minArgs: 1, maxArgs: 1},
	abi.OpExp:          {minArgs: 1, maxArgs: 1},
	abi.OpLog:          {minArgs: 1, maxArgs: 1},
	abi.OpSqrt:         {minArgs: 1, maxArgs: 1},
	abi.OpNeg:          {minArgs: 1, maxArgs: 1},
	abi.OpSoftmax:      {minArgs: 1, maxArgs: 1, maxAttrs: 1},
	abi.OpLogSoftmax:   {minArgs: 1, maxArgs: 1, maxAttrs: 1},
	abi.OpRMSNorm:      {minArgs: 2, maxArgs: 2, maxAttrs: 1},
	abi.OpReshape:      {minArgs: 1, maxArgs: 1, maxAttrs: abi.MaxRank},
	abi.OpPermute:      {minArgs: 1, maxArgs: 1, maxAttrs: abi.MaxRank},
	abi.OpTranspose:    {minArgs: 1, maxArgs: 1, maxAttrs: 2},
	abi.OpConcat:       {minArgs: 1, maxArgs: maxVarArgs, maxAttrs: 1},
	abi.OpSlice:        {minArgs: 1, maxArgs: 1, maxAttrs: 3},
	abi.OpSplit:        {minArgs: 1, maxArgs: 1, maxAttrs: maxVarArgs, multi: true},
	abi.OpSum:          {minArgs: 1, maxArgs: 1, maxAttrs: 2},
	abi.OpMean:         {minArgs: 1, maxArgs: 1, maxAttrs: 2},
	abi.OpMax:          {minArgs: 1, maxArgs: 1, maxAttrs: 2},
	abi.OpDropout:      {minArgs: 2, maxArgs: 2, maxAttrs: 1},
	abi.OpEmbedding:    {minArgs: 2, maxArgs: 2, kinds: []int{argIDs}},
	abi.OpCrossEntropy: {minArgs: 2, maxArgs: 2, maxAttrs: 2, kinds: []int{argFloat, argIDs}},
	abi.OpBatchMatMul:  {minArgs: 2, maxArgs: 2, maxAttrs: 2},
	abi.OpAttention:    {minArgs: 3, maxArgs: 4, maxAttrs: 2, kinds: []int{argFloat, argFloat, argFloat, argMask}},

	abi.OpLinearGeluTanh: {minArgs: 2, maxArgs: 3},
	abi.OpAddLayerNorm:   {minArgs: 4, maxArgs: 4, maxAttrs: 1},
	abi.OpCast:           {minArgs: 1, maxArgs: 1, maxAttrs: 1, kinds: []int{argCastable}},
}

// Defaults of attrs.
const (
	// defaultLayerNormEps is torch.nn.functional.layer_norm's default.
	defaultLayerNormEps = 1e-5
	// defaultRMSNormEps is the usual default of RMSNorm layers.
	defaultRMSNormEps = 1e-6
	// defaultIgnoreIndex is torch.nn.functional.cross_entropy's default.
	defaultIgnoreIndex = -100
)

// unaryOps maps the elementwise ops of one tensor to their function.
var unaryOps = map[abi.Op]unaryFn{
	abi.OpScale:     unaryScale,
	abi.OpAddScalar: unaryAddScalar,
	abi.OpRelu:      unaryRelu,
	abi.OpGelu:      unaryGelu,
	abi.OpTanh:      unaryTanh,
	abi.OpSigmoid:   unarySigmoid,
	abi.OpSilu:      unarySilu,
	abi.OpExp:       unaryExp,
	abi.OpLog:       unaryLog,
	abi.OpSqrt:      unarySqrt,
	abi.OpNeg:       unaryNeg,
}

// binaryOps maps the broadcasting ops of two tensors to their function.
var binaryOps = map[abi.Op]binaryFn{
	abi.OpSub: binarySub,
	abi.OpMul: binaryMul,
	abi.OpDiv: binaryDiv,
}

// reduceOps maps the axis reductions to their function.
var reduceOps = map[abi.Op]reduceFn{
	abi.OpSum:  reduceSum,
	abi.OpMean: reduceMean,
	abi.OpMax:  reduceMax,
}

// record is one op on a Tape: its args and results, and its attrs, the
// sizes and saved tensors its kernels and backward need.
type record struct {
	op    abi.Op
	args  []*Tensor
	outs  []*Tensor
	attrs attrs
	// scratch lists the internal tensors of attrs that alloc makes,
	// sized by prepare so that a caller can charge them first.
	scratch   []scratchSpec
	outShapes [][]int
}

// attrs are what prepare learns of an op beyond its args and results:
// one small struct per op family, so that each op's kernels and backward
// read only the fields it has.
type attrs interface {
	// internal returns the tensors the op made for its kernels and its
	// backward (nil for those it did not make), which never leave it.
	internal() []*Tensor
}

// noAttrs are those of gelu_tanh, embedding, reshape and cast: nothing.
type noAttrs struct{}

// scalarAttrs are a unary op's parameter (scale, add_scalar) or
// dropout's keep_prob.
type scalarAttrs struct{ p float64 }

// binaryAttrs are those of add, sub, mul and div.
type binaryAttrs struct {
	swapped bool // args[1] is the larger operand
}

// axisAttrs are those of softmax, log_softmax and the reductions: the
// [outer, dim, inner] view of the axis, and max's arg-max indices.
type axisAttrs struct {
	outer, dim, inner int
	arg               *Tensor
}

// matAttrs are those of matmul, linear and linear_gelu_tanh (m rows, n
// out, k in).
type matAttrs struct {
	ta, tb  bool
	m, n, k int
	// pre is linear_gelu_tanh's pre-activation. A device with the fused
	// kernel (fusedOps) stores it only for the tape.
	pre *Tensor
}

// bmmAttrs are batch matmul's: the matmul sizes, the c matrices and
// those of a and b.
type bmmAttrs struct {
	ta, tb        bool
	m, n, k       int
	batch, na, nb int
}

// normAttrs are those of layer_norm, rms_norm and add_layer_norm.
type normAttrs struct {
	eps float64
	// swapped: add_layer_norm's args[1] is the larger operand.
	swapped bool
	// mean and rstd are the forward's row statistics (rms_norm: rstd
	// only); pre is add_layer_norm's sum, stored as matAttrs.pre is.
	mean, rstd, pre *Tensor
}

// crossEntropyAttrs are cross_entropy's.
type crossEntropyAttrs struct {
	reduction int
	ignore    int64
	count     int     // rows not ignored, set by the forward
	lse       *Tensor // each row's log-sum-exp
	loss      *Tensor // the per-row loss when it reduces
}

// attentionAttrs are attention's sizes and flags, and its probabilities.
type attentionAttrs struct {
	dims  attnDims
	probs *Tensor
}

// permAttrs are those of permute and transpose: dst's dim i is src's
// dim perm[i].
type permAttrs struct{ perm []int }

// sectionAttrs are those of concat, slice and split: the [outer, dim,
// inner] view of the axis (of the result for concat), the section sizes
// along it, and slice's start.
type sectionAttrs struct {
	outer, dim, inner int
	sizes             []int
	start             int
}

func (*noAttrs) internal() []*Tensor             { return nil }
func (*scalarAttrs) internal() []*Tensor         { return nil }
func (*binaryAttrs) internal() []*Tensor         { return nil }
func (a *axisAttrs) internal() []*Tensor         { return []*Tensor{a.arg} }
func (a *matAttrs) internal() []*Tensor          { return []*Tensor{a.pre} }
func (*bmmAttrs) internal() []*Tensor            { return nil }
func (a *normAttrs) internal() []*Tensor         { return []*Tensor{a.mean, a.rstd, a.pre} }
func (a *crossEntropyAttrs) internal() []*Tensor { return []*Tensor{a.lse, a.loss} }
func (a *attentionAttrs) internal() []*Tensor    { return []*Tensor{a.probs} }
func (*permAttrs) internal() []*Tensor           { return nil }
func (*sectionAttrs) internal() []*Tensor        { return nil }

// Apply runs op on args with attrs and returns a new tensor. Every arg must
// be a tensor on dev, float32 unless abi.Op documents another dtype (ids,
// targets, masks); abi.Op documents each op's args, attrs and defaults.
// Shapes that do not fit give ErrShape, bad counts, attrs, dtypes or ids
// ErrArgument, and an unknown code ErrUnknownOp. When tape is not nil the
// op is recorded so that [Tape.Backward] can differentiate through it. An op
// with several results (abi.OpSplit) needs [ApplyMulti].
func Apply(dev Device, tape *Tape, op abi.Op, args []*Tensor, attrs []float64) (*Tensor, error) {
	if spec, ok := opSpecs[op]; ok && spec.multi {
		return nil, fmt.Errorf("%w: %s has several results: use the multi-result form (ApplyMulti)", ErrArgument, op)
	}
	outs, err := ApplyMulti(dev, tape, op, args, attrs)
	if err != nil {
		return nil, err
	}
	return outs[0], nil
}

// ApplyMulti is [Apply] for every op, including those with several results
// (abi.OpSplit); it returns the results in order, one for a single-result
// op. The slice is new; the tensors are as Apply's.
func ApplyMulti(dev Device, tape *Tape, op abi.Op, args []*Tensor, attrs []float64) ([]*Tensor, error) {
	return ApplyMultiContext(context.Background(), dev, tape, op, args, attrs)
}

// ApplyMultiContext is [ApplyMulti] that gives up once ctx is done: it
// does not start, and its long kernels (matmul, linear, batch matmul,
// attention) stop between chunks of a few milliseconds and return ctx's
// error, so that no op outlives its caller's deadline by much.
func ApplyMultiContext(ctx context.Context, dev Device, tape *Tape, op abi.Op, args []*Tensor, attrs []float64) ([]*Tensor, error) {
	p, err := PlanOp(dev, op, args, attrs)
	if err != nil {
		return nil, err
	}
	return p.RunContext(ctx, dev, tape)
}

// Plan is an op whose args, attrs and shapes are checked and whose
// allocations are sized, but not made: [PlanOp] touches no device memory,
// so that a caller with a budget can charge [Plan.Bytes] and
// [Plan.Tensors] before [Plan.Run] allocates them.
type Plan struct {
	rec  *record
	done bool
}

// scratchSpec is an internal tensor of a record, allocated by alloc.
type scratchSpec struct {
	dst   **Tensor
	dt    abi.DType
	shape []int
	// taped: only the backward reads it, so alloc makes it only when
	// the op is recorded on a tape.
	taped bool
}

// need asks alloc for an internal tensor of rec.
func (r *record) need(dst **Tensor, dt abi.DType, shape []int) {
	r.scratch = append(r.scratch, scratchSpec{dst: dst, dt: dt, shape: shape})
}

// needTaped asks alloc for an internal tensor of rec that only its
// backward reads.
func (r *record) needTaped(dst **Tensor, dt abi.DType, shape []int) {
	r.scratch = append(r.scratch, scratchSpec{dst: dst, dt: dt, shape: shape, taped: true})
}

// PlanOp checks op as [ApplyMulti] does and sizes its results and
// internal tensors (attention's probabilities, a norm's statistics…),
// allocating nothing. Its errors are ApplyMulti's.
func PlanOp(dev Device, op abi.Op, args []*Tensor, attrs []float64) (*Plan, error) {
	rec, err := prepare(dev, op, args, attrs)
	if err != nil {
		return nil, err
	}
	return &Plan{rec: rec}, nil
}

// Results returns the number of tensors Run returns.
func (p *Plan) Results() int { return len(p.rec.outShapes) }

// Bytes returns the bytes that Run allocates without a tape: the results
// and the internal tensors the kernels need. With a tape, Run may also
// allocate what only the backward reads; BackwardBytes counts that.
func (p *Plan) Bytes() int64 {
	var n int64
	for _, s := range p.rec.outShapes {
		n += shapeBytes(abi.DTypeFloat32, s)
	}
	for _, s := range p.rec.scratch {
		if !s.taped {
			n += shapeBytes(s.dt, s.shape)
		}
	}
	return n
}

// Tensors returns the number of tensors that Run allocates without a tape.
func (p *Plan) Tensors() int {
	n := len(p.rec.outShapes)
	for _, s := range p.rec.scratch {
		if !s.taped {
			n++
		}
	}
	return n
}

// tapedBytes and tapedTensors size the internal tensors that Run makes
// only for a tape.
func (p *Plan) tapedBytes() (int64, int) {
	var n int64
	var t int
	for _, s := range p.rec.scratch {
		if s.taped {
			n += shapeBytes(s.dt, s.shape)
			t++
		}
	}
	return n, t
}

// BackwardBytes bounds the bytes that recording this op costs beyond
// Bytes: the internal tensors Run keeps only for a tape, and what
// [Tape.Backward] allocates for it — a gradient for each arg, as many
// again for the temporaries of broadcasts, clones and sums, and the size
// of the op's results and internal tensors for its kernels' work.
// Charging it with the forward means a backward never allocates what
// nobody paid for.
func (p *Plan) BackwardBytes() int64 {
	var n int64
	for _, a := range p.rec.args {
		n += 2 * shapeBytes(abi.DTypeFloat32, a.shape)
	}
	tb, _ := p.tapedBytes()
	return n + p.Bytes() + 2*tb
}

// BackwardTensors bounds the number of tensors that recording this op
// costs beyond Tensors (see BackwardBytes).
func (p *Plan) BackwardTensors() int {
	_, tt := p.tapedBytes()
	return 2*len(p.rec.args) + p.Tensors() + 2*tt
}

// shapeBytes returns the byte size of a checked shape.
func shapeBytes(dt abi.DType, shape []int) int64 {
	n := int64(dt.Size())
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}

// Run allocates the op's results and internal tensors and runs it, as
// [ApplyMulti]. A Plan runs once.
func (p *Plan) Run(dev Device, tape *Tape) ([]*Tensor, error) {
	return p.RunContext(context.Background(), dev, tape)
}

// RunContext is [Plan.Run] that gives up once ctx is done, as
// [ApplyMultiContext].
func (p *Plan) RunContext(ctx context.Context, dev Device, tape *Tape) ([]*Tensor, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", p.rec.op, err)
	}
	if p.done {
		return nil, fmt.Errorf("%w: %s: plan already run", ErrArgument, p.rec.op)
	}
	p.done = true
	rec, op := p.rec, p.rec.op
	if err := rec.alloc(dev, tape != nil); err != nil {
		return nil, err
	}
	if err := forwardUntil(ctx, dev, rec); err != nil {
		dev.Release(rec.outs...)
		dev.Release(rec.internal()...)
		if errors.Is(err, ErrArgument) || errors.Is(err, ErrShape) {
			return nil, err // kernels that check data name the op already
		}
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if tape != nil {
		tape.recs = append(tape.recs, rec)
	} else {
		dev.Release(rec.internal()...) // nothing will read them
	}
	return append([]*Tensor(nil), rec.outs...), nil
}

// internal returns the tensors that r made for its backward, which never
// leave it.
func (r *record) internal() []*Tensor { return r.attrs.internal() }

// alloc allocates rec's results and internal tensors, as prepare sized
// them; those only a backward reads only when taped.
func (r *record) alloc(dev Device, taped bool) error {
	r.outs = make([]*Tensor, len(r.outShapes))
	for i, s := range r.outShapes {
		t, err := dev.Zeros(abi.DTypeFloat32, s)
		if err != nil {
			dev.Release(r.outs...)
			return fmt.Errorf("%s: %w", r.op, err)
		}
		r.outs[i] = t
	}
	for _, s := range r.scratch {
		if s.taped && !taped {
			continue
		}
		t, err := dev.Zeros(s.dt, s.shape)
		if err != nil {
			dev.Release(r.outs...)
			dev.Release(r.internal()...)
			return fmt.Errorf("%s: %w", r.op, err)
		}
		*s.dst = t
	}
	return nil
}

// prepare validates an op's inputs and returns its record with the shapes
// of its outputs and internal tensors, allocating nothing.
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
		kind := argFloat
		if i < len(spec.kinds) {
			kind = spec.kinds[i]
		}
		if err := checkArg(dev, t, kind); err != nil {
			return nil, fmt.Errorf("%w: %s: arg %d: %w", ErrArgument, op, i, err)
		}
	}
	rec := &record{op: op, args: append([]*Tensor(nil), args...), attrs: &noAttrs{}}
	shapes, err := prepareShapes(dev, rec, attrs)
	if err != nil {
		return nil, err
	}
	for _, s := range shapes {
		if _, err := checkShape(abi.DTypeFloat32, s); err != nil {
			return nil, fmt.Errorf("%s: result: %w", op, err)
		}
	}
	for _, s := range rec.scratch {
		if _, err := checkShape(s.dt, s.shape); err != nil {
			return nil, fmt.Errorf("%s: internal tensor: %w", op, err)
		}
	}
	rec.outShapes = shapes
	return rec, nil
}

// prepareShapes checks the shapes and attrs of rec's args, fills in the
// sizes that forward and backward need, and returns the output shapes.
func prepareShapes(dev Device, rec *record, attrs []float64) ([][]int, error) {
	op, args := rec.op, rec.args
	one := func(s []int) ([][]int, error) { return [][]int{s}, nil }
	if fn, ok := unaryOps[op]; ok {
		at := &scalarAttrs{}
		rec.attrs = at
		switch fn {
		case unaryScale:
			at.p = attrOr(attrs, 0, 1)
		case unaryAddScalar:
			at.p = attrOr(attrs, 0, 0)
		}
		if math.IsNaN(at.p) || math.IsInf(at.p, 0) {
			return nil, fmt.Errorf("%w: %s: attr %v is not finite", ErrArgument, op, at.p)
		}
		return one(args[0].shape)
	}
	if _, ok := binaryOps[op]; ok {
		s, swapped, err := broadcast(op, args[0], args[1])
		rec.attrs = &binaryAttrs{swapped: swapped}
		if err != nil {
			return nil, err
		}
		return one(s)
	}
	if _, ok := reduceOps[op]; ok {
		return prepareReduce(rec, attrs)
	}
	switch op {
	case abi.OpMatMul:
		a, b := args[0], args[1]
		at := &matAttrs{}
		rec.attrs = at
		var err error
		if at.ta, err = flagAttr(attrs, 0); err != nil {
			return nil, fmt.Errorf("%w: matmul: transpose_a: %w", ErrArgument, err)
		}
		if at.tb, err = flagAttr(attrs, 1); err != nil {
			return nil, fmt.Errorf("%w: matmul: transpose_b: %w", ErrArgument, err)
		}
		if len(a.shape) != 2 || len(b.shape) != 2 {
			return nil, fmt.Errorf("%w: matmul: A is %v and B is %v, both must be 2-D", ErrShape, a.shape, b.shape)
		}
		if at.m, at.n, at.k, err = matDims(op, a.shape, b.shape, a.shape, b.shape, at.ta, at.tb); err != nil {
			return nil, err
		}
		return one([]int{at.m, at.n})
	case abi.OpLinear, abi.OpLinearGeluTanh:
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
		at := &matAttrs{m: x.n / in, n: out, k: in}
		rec.attrs = at
		shape := append(append([]int{}, x.shape[:len(x.shape)-1]...), out)
		if op == abi.OpLinearGeluTanh {
			rec.needPre(dev, &at.pre, shape)
		}
		return one(shape)
	case abi.OpAdd:
		s, swapped, err := broadcast(op, args[0], args[1])
		rec.attrs = &binaryAttrs{swapped: swapped}
		if err != nil {
			return nil, err
		}
		return one(s)
	case abi.OpGeluTanh:
		return one(args[0].shape)
	case abi.OpAddLayerNorm:
		return prepareAddLayerNorm(dev, rec, attrs)
	case abi.OpLayerNorm:
		x, w, b := args[0], args[1], args[2]
		if len(x.shape) < 1 {
			return nil, fmt.Errorf("%w: layer_norm: x is a scalar", ErrShape)
		}
		h := x.shape[len(x.shape)-1]
		if len(w.shape) != 1 || w.shape[0] != h || len(b.shape) != 1 || b.shape[0] != h {
			return nil, fmt.Errorf("%w: layer_norm: x %v wants w and b of [%d], got %v and %v", ErrShape, x.shape, h, w.shape, b.shape)
		}
		at := &normAttrs{}
		rec.attrs = at
		var err error
		if at.eps, err = epsAttr(op, attrs, defaultLayerNormEps); err != nil {
			return nil, err
		}
		rec.need(&at.mean, abi.DTypeFloat32, []int{x.n / h})
		rec.need(&at.rstd, abi.DTypeFloat32, []int{x.n / h})
		return one(x.shape)
	case abi.OpRMSNorm:
		x, w := args[0], args[1]
		if len(x.shape) < 1 {
			return nil, fmt.Errorf("%w: rms_norm: x is a scalar", ErrShape)
		}
		h := x.shape[len(x.shape)-1]
		if len(w.shape) != 1 || w.shape[0] != h {
			return nil, fmt.Errorf("%w: rms_norm: x %v wants w of [%d], got %v", ErrShape, x.shape, h, w.shape)
		}
		at := &normAttrs{}
		rec.attrs = at
		var err error
		if at.eps, err = epsAttr(op, attrs, defaultRMSNormEps); err != nil {
			return nil, err
		}
		rec.need(&at.rstd, abi.DTypeFloat32, []int{x.n / h})
		return one(x.shape)
	case abi.OpSoftmax, abi.OpLogSoftmax:
		x := args[0]
		axis, err := axisAttr(op, "axis", attrs, 0, -1, len(x.shape))
		if err != nil {
			return nil, err
		}
		at := &axisAttrs{}
		at.outer, at.dim, at.inner = view3(x.shape, axis)
		rec.attrs = at
		return one(x.shape)
	case abi.OpDropout:
		x, mask := args[0], args[1]
		if !isSuffix(mask.shape, x.shape) {
			return nil, fmt.Errorf("%w: dropout: mask %v must have x's shape %v or a suffix of it", ErrShape, mask.shape, x.shape)
		}
		at := &scalarAttrs{p: attrOr(attrs, 0, 1)}
		rec.attrs = at
		if !(at.p > 0 && at.p <= 1) {
			return nil, fmt.Errorf("%w: dropout: keep_prob %v is not in (0, 1]", ErrArgument, at.p)
		}
		return one(x.shape)
	case abi.OpEmbedding:
		return prepareEmbedding(rec)
	case abi.OpCast:
		if dt := attrOr(attrs, 0, float64(abi.DTypeFloat32)); dt != float64(abi.DTypeFloat32) {
			return nil, fmt.Errorf("%w: cast: dtype %v: ABI v1 casts to float32 (%d) only", ErrArgument, dt, abi.DTypeFloat32)
		}
		return one(args[0].shape)
	case abi.OpCrossEntropy:
		return prepareCrossEntropy(dev, rec, attrs)
	case abi.OpBatchMatMul:
		return prepareBatchMatMul(rec, attrs)
	case abi.OpAttention:
		return prepareAttention(dev, rec, attrs)
	case abi.OpReshape, abi.OpPermute, abi.OpTranspose, abi.OpConcat, abi.OpSlice, abi.OpSplit:
		return prepareShapeOp(rec, attrs)
	}
	panic("BUG: op in opSpecs without a case in prepare: " + op.String())
}

// matDims checks op(A)·op(B) for the 2-D shapes as and bs (the last two
// dims of A and B, whose shapes are a and b) and returns m, n and k.
func matDims(op abi.Op, a, b, as, bs []int, ta, tb bool) (m, n, k int, err error) {
	m, ka := as[0], as[1]
	if ta {
		m, ka = ka, m
	}
	kb, n := bs[0], bs[1]
	if tb {
		kb, n = n, kb
	}
	if ka != kb {
		return 0, 0, 0, fmt.Errorf("%w: %s: A %v (transpose_a=%t) and B %v (transpose_b=%t) disagree on k: %d vs %d",
			ErrShape, op, a, ta, b, tb, ka, kb)
	}
	return m, n, ka, nil
}

// broadcast checks that one of a and b is a suffix of the other, and
// returns the larger shape and whether b is the larger.
func broadcast(op abi.Op, a, b *Tensor) ([]int, bool, error) {
	switch {
	case isSuffix(b.shape, a.shape):
		return a.shape, false, nil
	case isSuffix(a.shape, b.shape):
		return b.shape, true, nil
	}
	return nil, false, fmt.Errorf("%w: %s: %v and %v do not broadcast (one must be a suffix of the other)", ErrShape, op, a.shape, b.shape)
}

// view3 returns the [outer, dim, inner] view of shape around axis.
func view3(shape []int, axis int) (outer, dim, inner int) {
	outer, inner = 1, 1
	for _, d := range shape[:axis] {
		outer *= d
	}
	for _, d := range shape[axis+1:] {
		inner *= d
	}
	return outer, shape[axis], inner
}

// prepareReduce handles sum, mean and max.
func prepareReduce(rec *record, attrs []float64) ([][]int, error) {
	x := rec.args[0]
	axis, err := axisAttr(rec.op, "axis", attrs, 0, -1, len(x.shape))
	if err != nil {
		return nil, err
	}
	keep, err := flagAttr(attrs, 1)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: keepdim: %w", ErrArgument, rec.op, err)
	}
	at := &axisAttrs{}
	at.outer, at.dim, at.inner = view3(x.shape, axis)
	rec.attrs = at
	shape := append([]int{}, x.shape[:axis]...)
	if keep {
		shape = append(shape, 1)
	}
	shape = append(shape, x.shape[axis+1:]...)
	if rec.op == abi.OpMax {
		rec.need(&at.arg, abi.DTypeInt32, shape) // arg-max indices
	}
	return [][]int{shape}, nil
}

// needPre asks for a fused op's intermediate: only for the tape on a
// device with the fused kernel, always on one that composes the op from
// its parts (and needs the intermediate as their buffer).
func (r *record) needPre(dev Device, pre **Tensor, shape []int) {
	if _, ok := dev.(fusedOps); ok {
		r.needTaped(pre, abi.DTypeFloat32, shape)
		return
	}
	r.need(pre, abi.DTypeFloat32, shape)
}

// prepareAddLayerNorm checks x and r as add does and w, b and eps as
// layer_norm does, for the larger of x and r.
func prepareAddLayerNorm(dev Device, rec *record, attrs []float64) ([][]int, error) {
	op, args := rec.op, rec.args
	s, swapped, err := broadcast(op, args[0], args[1])
	if err != nil {
		return nil, err
	}
	at := &normAttrs{swapped: swapped}
	rec.attrs = at
	if len(s) < 1 {
		return nil, fmt.Errorf("%w: add_layer_norm: x and r are scalars", ErrShape)
	}
	small := args[1]
	if swapped {
		small = args[0]
	}
	h := s[len(s)-1]
	if len(small.shape) < 1 {
		return nil, fmt.Errorf("%w: add_layer_norm: %v and %v: the smaller must have the last dim %d too", ErrShape, args[0].shape, args[1].shape, h)
	}
	w, b := args[2], args[3]
	if len(w.shape) != 1 || w.shape[0] != h || len(b.shape) != 1 || b.shape[0] != h {
		return nil, fmt.Errorf("%w: add_layer_norm: x + r of %v wants w and b of [%d], got %v and %v", ErrShape, s, h, w.shape, b.shape)
	}
	if at.eps, err = epsAttr(op, attrs, defaultLayerNormEps); err != nil {
		return nil, err
	}
	rows := numel(s) / h
	rec.need(&at.mean, abi.DTypeFloat32, []int{rows})
	rec.need(&at.rstd, abi.DTypeFloat32, []int{rows})
	rec.needPre(dev, &at.pre, s)
	return [][]int{s}, nil
}

// numel returns the element count of a checked shape.
func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// prepareEmbedding checks ids and table; the ids' values are checked by
// the kernel.
func prepareEmbedding(rec *record) ([][]int, error) {
	ids, table := rec.args[0], rec.args[1]
	if len(table.shape) != 2 {
		return nil, fmt.Errorf("%w: embedding: table is %v, want [V, D]", ErrShape, table.shape)
	}
	if len(ids.shape) >= abi.MaxRank {
		return nil, fmt.Errorf("%w: embedding: ids %s have rank %d; the result would exceed rank %d", ErrShape, ids.desc(), len(ids.shape), abi.MaxRank)
	}
	return [][]int{append(append([]int{}, ids.shape...), table.shape[1])}, nil
}

// prepareCrossEntropy checks logits, targets and attrs.
func prepareCrossEntropy(dev Device, rec *record, attrs []float64) ([][]int, error) {
	logits, targets := rec.args[0], rec.args[1]
	if len(logits.shape) != 2 || len(targets.shape) != 1 || targets.shape[0] != logits.shape[0] {
		return nil, fmt.Errorf("%w: cross_entropy: logits %v and targets %s, want [N, C] and [N]", ErrShape, logits.shape, targets.desc())
	}
	red, err := intAttr(rec.op, "reduction", attrs, 0, 0, 0, 2)
	if err != nil {
		return nil, err
	}
	ign, err := intAttr(rec.op, "ignore_index", attrs, 1, defaultIgnoreIndex, -1<<53, 1<<53)
	if err != nil {
		return nil, err
	}
	at := &crossEntropyAttrs{reduction: red, ignore: int64(ign)}
	rec.attrs = at
	n := logits.shape[0]
	rec.need(&at.lse, abi.DTypeFloat32, []int{n})
	if red == 0 {
		return [][]int{{n}}, nil
	}
	rec.need(&at.loss, abi.DTypeFloat32, []int{n})
	return [][]int{{1}}, nil
}

// prepareBatchMatMul checks a batch matmul's shapes and flags.
func prepareBatchMatMul(rec *record, attrs []float64) ([][]int, error) {
	a, b := rec.args[0], rec.args[1]
	at := &bmmAttrs{}
	rec.attrs = at
	var err error
	if at.ta, err = flagAttr(attrs, 0); err != nil {
		return nil, fmt.Errorf("%w: batch_matmul: transpose_a: %w", ErrArgument, err)
	}
	if at.tb, err = flagAttr(attrs, 1); err != nil {
		return nil, fmt.Errorf("%w: batch_matmul: transpose_b: %w", ErrArgument, err)
	}
	if len(a.shape) < 2 || len(b.shape) < 2 {
		return nil, fmt.Errorf("%w: batch_matmul: a is %v and b is %v, both need rank >= 2", ErrShape, a.shape, b.shape)
	}
	la, lb := a.shape[:len(a.shape)-2], b.shape[:len(b.shape)-2]
	lead := la
	switch {
	case isSuffix(lb, la):
	case isSuffix(la, lb):
		lead = lb
	default:
		return nil, fmt.Errorf("%w: batch_matmul: leading dims of a %v and b %v do not broadcast (one must be a suffix of the other)", ErrShape, a.shape, b.shape)
	}
	if at.m, at.n, at.k, err = matDims(rec.op, a.shape, b.shape, a.shape[len(la):], b.shape[len(lb):], at.ta, at.tb); err != nil {
		return nil, err
	}
	at.na, at.nb = a.n/(a.shape[len(la)]*a.shape[len(la)+1]), b.n/(b.shape[len(lb)]*b.shape[len(lb)+1])
	at.batch = max(at.na, at.nb)
	return [][]int{append(append([]int{}, lead...), at.m, at.n)}, nil
}

// prepareAttention checks q, k, v, the mask and the attrs.
func prepareAttention(dev Device, rec *record, attrs []float64) ([][]int, error) {
	q, k, v := rec.args[0], rec.args[1], rec.args[2]
	if len(q.shape) != 4 || len(k.shape) != 4 || len(v.shape) != 4 {
		return nil, fmt.Errorf("%w: attention: q %v, k %v and v %v must be [B,H,T,D]", ErrShape, q.shape, k.shape, v.shape)
	}
	b, h, tq, d := q.shape[0], q.shape[1], q.shape[2], q.shape[3]
	tk, dv := k.shape[2], v.shape[3]
	if k.shape[0] != b || k.shape[1] != h || k.shape[3] != d || v.shape[0] != b || v.shape[1] != h || v.shape[2] != tk {
		return nil, fmt.Errorf("%w: attention: q %v, k %v and v %v do not fit q [B,H,Tq,D], k [B,H,Tk,D], v [B,H,Tk,Dv]", ErrShape, q.shape, k.shape, v.shape)
	}
	if len(rec.args) == 4 {
		if m := rec.args[3]; len(m.shape) != 2 || m.shape[0] != b || m.shape[1] != tk {
			return nil, fmt.Errorf("%w: attention: key_padding_mask is %v, want [%d %d] for k %v", ErrShape, m.shape, b, tk, k.shape)
		}
	}
	causal, err := flagAttr(attrs, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: attention: causal: %w", ErrArgument, err)
	}
	scale := attrOr(attrs, 1, 0)
	if math.IsNaN(scale) || math.IsInf(scale, 0) {
		return nil, fmt.Errorf("%w: attention: scale %v is not finite", ErrArgument, scale)
	}
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(d))
	}
	at := &attentionAttrs{dims: attnDims{b: b, h: h, tq: tq, tk: tk, d: d, dv: dv, causal: causal, scale: scale}}
	rec.attrs = at
	rec.need(&at.probs, abi.DTypeFloat32, []int{b, h, tq, tk})
	return [][]int{{b, h, tq, dv}}, nil
}

// prepareShapeOp handles reshape, permute, transpose, concat, slice and
// split.
func prepareShapeOp(rec *record, attrs []float64) ([][]int, error) {
	op, x := rec.op, rec.args[0]
	rank := len(x.shape)
	switch op {
	case abi.OpReshape:
		shape := make([]int, len(attrs))
		infer := -1
		known := 1
		for i := range attrs {
			d, err := intAttr(op, fmt.Sprintf("dim %d", i), attrs, i, 0, -1, math.MaxInt32)
			if err != nil {
				return nil, err
			}
			switch {
			case d == -1 && infer >= 0:
				return nil, fmt.Errorf("%w: reshape: dims %v have more than one -1", ErrArgument, attrs)
			case d == -1:
				infer = i
			case d == 0:
				return nil, fmt.Errorf("%w: reshape: dims %v have a 0", ErrArgument, attrs)
			default:
				if known > x.n/d {
					return nil, fmt.Errorf("%w: reshape: %v to dims %v: the element count differs", ErrShape, x.shape, attrs)
				}
				known *= d
			}
			shape[i] = d
		}
		if infer >= 0 {
			if x.n%known != 0 {
				return nil, fmt.Errorf("%w: reshape: %v to dims %v: %d elements do not divide by %d", ErrShape, x.shape, attrs, x.n, known)
			}
			shape[infer] = x.n / known
			known = x.n
		}
		if known != x.n {
			return nil, fmt.Errorf("%w: reshape: %v (%d elements) to %v", ErrShape, x.shape, x.n, shape)
		}
		return [][]int{shape}, nil
	case abi.OpPermute:
		if len(attrs) != rank {
			return nil, fmt.Errorf("%w: permute: %d dims for x %v of rank %d", ErrArgument, len(attrs), x.shape, rank)
		}
		perm := make([]int, rank)
		seen := make([]bool, rank)
		for i := range attrs {
			a, err := axisAttr(op, fmt.Sprintf("perm[%d]", i), attrs, i, 0, rank)
			if err != nil {
				return nil, err
			}
			if seen[a] {
				return nil, fmt.Errorf("%w: permute: %v is not a permutation of %d dims", ErrArgument, attrs, rank)
			}
			seen[a], perm[i] = true, a
		}
		rec.attrs = &permAttrs{perm: perm}
		return [][]int{permuted(x.shape, perm)}, nil
	case abi.OpTranspose:
		if len(attrs) != 2 {
			return nil, fmt.Errorf("%w: transpose: %d attrs, want dim0 and dim1", ErrArgument, len(attrs))
		}
		d0, err := axisAttr(op, "dim0", attrs, 0, 0, rank)
		if err != nil {
			return nil, err
		}
		d1, err := axisAttr(op, "dim1", attrs, 1, 0, rank)
		if err != nil {
			return nil, err
		}
		perm := make([]int, rank)
		for i := range perm {
			perm[i] = i
		}
		perm[d0], perm[d1] = d1, d0
		rec.attrs = &permAttrs{perm: perm}
		return [][]int{permuted(x.shape, perm)}, nil
	case abi.OpConcat:
		axis, err := axisAttr(op, "axis", attrs, 0, 0, rank)
		if err != nil {
			return nil, err
		}
		at := &sectionAttrs{sizes: make([]int, len(rec.args))}
		rec.attrs = at
		at.outer, _, at.inner = view3(x.shape, axis)
		total := 0
		for i, t := range rec.args {
			if len(t.shape) != rank || !slices.Equal(t.shape[:axis], x.shape[:axis]) || !slices.Equal(t.shape[axis+1:], x.shape[axis+1:]) {
				return nil, fmt.Errorf("%w: concat: arg %d is %v, arg 0 is %v; they may differ only on axis %d", ErrShape, i, t.shape, x.shape, axis)
			}
			at.sizes[i] = t.shape[axis]
			total += t.shape[axis]
		}
		at.dim = total
		shape := append([]int{}, x.shape...)
		shape[axis] = total
		return [][]int{shape}, nil
	case abi.OpSlice:
		if len(attrs) != 3 {
			return nil, fmt.Errorf("%w: slice: %d attrs, want axis, start and end", ErrArgument, len(attrs))
		}
		axis, err := axisAttr(op, "axis", attrs, 0, 0, rank)
		if err != nil {
			return nil, err
		}
		dim := x.shape[axis]
		start, err := intAttr(op, "start", attrs, 1, 0, 0, dim-1)
		if err != nil {
			return nil, fmt.Errorf("%w (x is %v, axis %d)", err, x.shape, axis)
		}
		end, err := intAttr(op, "end", attrs, 2, 0, start+1, dim)
		if err != nil {
			return nil, fmt.Errorf("%w (x is %v, axis %d, start %d)", err, x.shape, axis, start)
		}
		at := &sectionAttrs{sizes: []int{end - start}, start: start}
		at.outer, at.dim, at.inner = view3(x.shape, axis)
		rec.attrs = at
		shape := append([]int{}, x.shape...)
		shape[axis] = end - start
		return [][]int{shape}, nil
	case abi.OpSplit:
		if len(attrs) < 2 {
			return nil, fmt.Errorf("%w: split: %d attrs, want axis and at least one section size", ErrArgument, len(attrs))
		}
		axis, err := axisAttr(op, "axis", attrs, 0, 0, rank)
		if err != nil {
			return nil, err
		}
		at := &sectionAttrs{sizes: make([]int, len(attrs)-1)}
		at.outer, at.dim, at.inner = view3(x.shape, axis)
		rec.attrs = at
		shapes := make([][]int, len(at.sizes))
		left := at.dim
		for i := range at.sizes {
			s, err := intAttr(op, fmt.Sprintf("size %d", i), attrs, i+1, 0, 1, left)
			if err != nil {
				return nil, fmt.Errorf("%w (x is %v, axis %d, sizes %v)", err, x.shape, axis, attrs[1:])
			}
			left -= s
			at.sizes[i] = s
			shapes[i] = append([]int{}, x.shape...)
			shapes[i][axis] = s
		}
		if left != 0 {
			return nil, fmt.Errorf("%w: split: sizes %v do not add up to dim %d of x %v", ErrShape, attrs[1:], axis, x.shape)
		}
		return shapes, nil
	}
	panic("BUG: prepareShapeOp on " + op.String())
}

// permuted returns shape with its dims reordered by perm.
func permuted(shape, perm []int) []int {
	s := make([]int, len(perm))
	for i, p := range perm {
		s[i] = shape[p]
	}
	return s
}

// forward runs a prepared record's kernels.
func forward(dev Device, rec *record) error {
	a, out := rec.args, rec.outs[0]
	if fn, ok := unaryOps[rec.op]; ok {
		return dev.unary(fn, rec.attrs.(*scalarAttrs).p, out, a[0])
	}
	if fn, ok := binaryOps[rec.op]; ok {
		return dev.binary(fn, out, a[0], a[1])
	}
	if fn, ok := reduceOps[rec.op]; ok {
		at := rec.attrs.(*axisAttrs)
		return dev.reduceAxis(fn, out, at.arg, a[0], at.outer, at.dim, at.inner)
	}
	switch at := rec.attrs.(type) {
	case *matAttrs:
		return forwardMat(dev, rec.op, at, a, out)
	case *binaryAttrs: // add
		if at.swapped {
			return dev.addRepeat(out, a[1], a[0])
		}
		return dev.addRepeat(out, a[0], a[1])
	case *normAttrs:
		return forwardNorm(dev, rec.op, at, a, out)
	case *axisAttrs: // softmax, log_softmax
		return dev.softmax(out, a[0], at.outer, at.dim, at.inner, rec.op == abi.OpLogSoftmax)
	case *scalarAttrs: // dropout
		if err := dev.binary(binaryMul, out, a[0], a[1]); err != nil {
			return err
		}
		return dev.unary(unaryScale, 1/at.p, out, out)
	case *crossEntropyAttrs:
		loss := out
		if at.reduction != 0 {
			loss = at.loss
		}
		var err error
		if at.count, err = dev.crossEntropy(loss, at.lse, a[0], a[1], at.ignore); err != nil {
			return err
		}
		if at.reduction == 0 {
			return nil
		}
		if err := dev.sumRows(out, loss); err != nil {
			return err
		}
		if at.reduction == 1 {
			return dev.unary(unaryScale, 1/float64(at.count), out, out)
		}
		return nil
	case *bmmAttrs:
		return dev.bmm(at.ta, at.tb, at.batch, at.m, at.n, at.k, a[0], at.na, a[1], at.nb, out, at.batch, false)
	case *attentionAttrs:
		var mask *Tensor
		if len(a) == 4 {
			mask = a[3]
		}
		return dev.attention(out, at.probs, a[0], a[1], a[2], mask, at.dims)
	case *permAttrs:
		return dev.permute(out, a[0], at.perm)
	case *sectionAttrs:
		if rec.op == abi.OpConcat {
			off := 0
			for i, t := range a {
				w := at.sizes[i] * at.inner
				if err := dev.copy2D(out, off, at.dim*at.inner, t, 0, w, at.outer, w); err != nil {
					return err
				}
				off += w
			}
			return nil
		}
		off := at.start * at.inner // slice, split
		for i, o := range rec.outs {
			w := at.sizes[i] * at.inner
			if err := dev.copy2D(o, 0, w, a[0], off, at.dim*at.inner, at.outer, w); err != nil {
				return err
			}
			off += w
		}
		return nil
	}
	switch rec.op {
	case abi.OpGeluTanh:
		return dev.geluForward(out, a[0])
	case abi.OpEmbedding:
		return dev.embedding(out, a[0], a[1])
	case abi.OpReshape:
		return dev.copy(out, a[0])
	case abi.OpCast:
		if a[0].dt == abi.DTypeFloat32 {
			return dev.copy(out, a[0])
		}
		return dev.cast(out, a[0])
	}
	panic("BUG: forward of unprepared op " + rec.op.String())
}

// forwardMat runs matmul, linear and linear_gelu_tanh.
func forwardMat(dev Device, op abi.Op, at *matAttrs, a []*Tensor, out *Tensor) error {
	switch op {
	case abi.OpMatMul:
		return dev.gemm(at.ta, at.tb, at.m, at.n, at.k, a[0], a[1], out, false)
	case abi.OpLinear:
		if l, ok := dev.(fusedLinear); ok && len(a) == 3 {
			return l.linear(at.m, at.n, at.k, a[0], a[1], a[2], out)
		}
		if err := dev.gemm(false, true, at.m, at.n, at.k, a[0], a[1], out, false); err != nil {
			return err
		}
		if len(a) == 3 {
			return dev.addRepeat(out, out, a[2])
		}
		return nil
	}
	var bias *Tensor // linear_gelu_tanh
	if len(a) == 3 {
		bias = a[2]
	}
	if f, ok := dev.(fusedOps); ok {
		return f.linearGelu(at.m, at.n, at.k, a[0], a[1], bias, out, at.pre)
	}
	// The parts, with the pre-activation as linear's result.
	if err := dev.gemm(false, true, at.m, at.n, at.k, a[0], a[1], at.pre, false); err != nil {
		return err
	}
	if bias != nil {
		if err := dev.addRepeat(at.pre, at.pre, bias); err != nil {
			return err
		}
	}
	return dev.geluForward(out, at.pre)
}

// forwardNorm runs layer_norm, rms_norm and add_layer_norm.
func forwardNorm(dev Device, op abi.Op, at *normAttrs, a []*Tensor, out *Tensor) error {
	switch op {
	case abi.OpLayerNorm:
		return dev.layerNormForward(out, at.mean, at.rstd, a[0], a[1], a[2], at.eps)
	case abi.OpRMSNorm:
		return dev.rmsNormForward(out, at.rstd, a[0], a[1], at.eps)
	}
	x, r := a[0], a[1] // add_layer_norm
	if at.swapped {
		x, r = r, x
	}
	if f, ok := dev.(fusedOps); ok {
		return f.addLayerNorm(out, at.pre, at.mean, at.rstd, x, r, a[2], a[3], at.eps)
	}
	if err := dev.addRepeat(at.pre, x, r); err != nil {
		return err
	}
	return dev.layerNormForward(out, at.mean, at.rstd, at.pre, a[2], a[3], at.eps)
}

// fusedLinear is a device whose GEMM adds a linear layer's bias in its
// epilogue (the CPU device).
type fusedLinear interface {
	linear(m, n, k int, x, w, bias, y *Tensor) error
}

// fusedOps is a device with kernels for the fused ops (the CPU device).
// Another device runs them as their parts, with the intermediate as a
// tensor between them.
type fusedOps interface {
	// linearGelu sets y = gelu_tanh(x·wᵀ + bias) for an m×k x and an
	// n×k w; bias (n values) may be nil, and pre, when not nil,
	// receives x·wᵀ + bias.
	linearGelu(m, n, k int, x, w, bias, y, pre *Tensor) error

	// addLayerNorm sets y = layer_norm(x + res) over rows of w.Len(),
	// with res repeating along x, keeps the row statistics as
	// layerNormForward does and, when sum is not nil, x + res in sum.
	addLayerNorm(y, sum, mean, rstd, x, res, w, b *Tensor, eps float64) error
}

// checkArg checks that t is a tensor on dev of the dtype kind wants.
func checkArg(dev Device, t *Tensor, kind int) error {
	if t == nil {
		return errors.New("nil tensor")
	}
	if t.dev == nil {
		return errors.New("tensor not made by a device")
	}
	if t.dev != dev {
		return fmt.Errorf("tensor on device %q, want %q", t.dev.Name(), dev.Name())
	}
	switch kind {
	case argIDs:
		if t.dt != abi.DTypeInt32 && t.dt != abi.DTypeInt64 {
			return fmt.Errorf("dtype %s, want int32 or int64", t.dt)
		}
	case argMask:
		if t.dt != abi.DTypeBool {
			return fmt.Errorf("dtype %s, want bool", t.dt)
		}
	case argCastable:
		switch t.dt {
		case abi.DTypeFloat32, abi.DTypeInt32, abi.DTypeInt64, abi.DTypeBool:
		default:
			return fmt.Errorf("dtype %s, want float32, int32, int64 or bool", t.dt)
		}
	default:
		if t.dt != abi.DTypeFloat32 {
			return fmt.Errorf("dtype %s, want float32", t.dt)
		}
	}
	return nil
}

// checkFloat checks that t is a float32 tensor on dev.
func checkFloat(dev Device, t *Tensor) error { return checkArg(dev, t, argFloat) }

// attrOr returns attrs[i], or def when it is left out.
func attrOr(attrs []float64, i int, def float64) float64 {
	if i < len(attrs) {
		return attrs[i]
	}
	return def
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

// intAttr reads an integral attr at index i (def when left out) that must
// lie in [lo, hi].
func intAttr(op abi.Op, name string, attrs []float64, i, def, lo, hi int) (int, error) {
	if i >= len(attrs) {
		return def, nil
	}
	v := attrs[i]
	if v != math.Trunc(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%w: %s: %s %v is not an integer", ErrArgument, op, name, v)
	}
	if v < float64(lo) || v > float64(hi) {
		return 0, fmt.Errorf("%w: %s: %s %v is outside [%d, %d]", ErrArgument, op, name, v, lo, hi)
	}
	return int(v), nil
}

// axisAttr reads an axis attr for a tensor of the given rank (at least 1)
// and returns it in [0, rank); a negative axis counts from the end.
func axisAttr(op abi.Op, name string, attrs []float64, i, def, rank int) (int, error) {
	if rank == 0 {
		return 0, fmt.Errorf("%w: %s: x is a scalar and has no axis", ErrShape, op)
	}
	a, err := intAttr(op, name, attrs, i, def, -rank, rank-1)
	if err != nil {
		return 0, fmt.Errorf("%w (rank %d)", err, rank)
	}
	if a < 0 {
		a += rank
	}
	return a, nil
}

// epsAttr reads a norm's eps at index 0.
func epsAttr(op abi.Op, attrs []float64, def float64) (float64, error) {
	eps := attrOr(attrs, 0, def)
	if !(eps >= 0) || math.IsInf(eps, 0) {
		return 0, fmt.Errorf("%w: %s: eps %v is not a finite non-negative number", ErrArgument, op, eps)
	}
	return eps, nil
}

func countRange(lo, hi int) string {
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d to %d", lo, hi)
}
