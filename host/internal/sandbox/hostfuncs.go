package sandbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"unicode/utf8"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

const (
	i32 = api.ValueTypeI32
	f64 = api.ValueTypeF64
)

// hostFunc is one function of the ABI's host module. fn returns the
// function's non-negative result, or an error that becomes an Errno.
type hostFunc struct {
	name   string
	params []api.ValueType
	fn     func(st *state, mem api.Memory, stack []uint64) (int32, error)
}

var hostFuncs = []hostFunc{
	{abi.FuncLastError, []api.ValueType{i32, i32}, lastError},
	{abi.FuncConfigI64, []api.ValueType{i32, i32, i32}, configI64},
	{abi.FuncDeclareInput, []api.ValueType{i32, i32, i32, i32, i32}, declareInput},
	{abi.FuncDeclareOutput, []api.ValueType{i32, i32, i32, i32, i32}, declareOutput},
	{abi.FuncParamNew, []api.ValueType{i32, i32, i32, i32, i32, i32, f64, f64}, paramNew},
	{abi.FuncInput, []api.ValueType{i32}, input},
	{abi.FuncOutput, []api.ValueType{i32, i32}, output},
	{abi.FuncTensorNew, []api.ValueType{i32, i32, i32}, tensorNew},
	{abi.FuncTensorWrite, []api.ValueType{i32, i32, i32}, tensorWrite},
	{abi.FuncTensorRead, []api.ValueType{i32, i32, i32}, tensorRead},
	{abi.FuncTensorShape, []api.ValueType{i32, i32, i32}, tensorShape},
	{abi.FuncTensorDType, []api.ValueType{i32}, tensorDType},
	{abi.FuncOp, []api.ValueType{i32, i32, i32, i32, i32}, op},
	{abi.FuncOpMulti, []api.ValueType{i32, i32, i32, i32, i32, i32, i32}, opMulti},
	{abi.FuncFail, []api.ValueType{i32, i32}, fail},
	{abi.FuncGradOutput, []api.ValueType{i32}, gradOutput},
	{abi.FuncGradInput, []api.ValueType{i32, i32}, gradInput},
	{abi.FuncParamGrad, []api.ValueType{i32, i32}, paramGrad},
}

var hostFuncNames = func() []string {
	names := make([]string, len(hostFuncs))
	for i, f := range hostFuncs {
		names[i] = f.name
	}
	return names
}()

// instantiateHostModule defines moehost_v1 with stack-based Go functions.
func instantiateHostModule(ctx context.Context, r wazero.Runtime) error {
	b := r.NewHostModuleBuilder(abi.ModuleName)
	for _, f := range hostFuncs {
		b.NewFunctionBuilder().
			WithGoModuleFunction(wrap(f), f.params, []api.ValueType{i32}).
			Export(f.name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

// wrap adapts fn to wazero: it finds the calling instance's state, turns
// errors into Errnos with a message for last_error, and never lets a Go
// panic reach the guest.
func wrap(f hostFunc) api.GoModuleFunction {
	return api.GoModuleFunc(func(ctx context.Context, mod api.Module, stack []uint64) {
		st := stateFrom(ctx)
		if st == nil {
			// A call outside Instantiate/Forward, e.g. from an
			// export the host did not call. Refuse it.
			stack[0] = api.EncodeI32(int32(abi.ErrWrongPhase))
			return
		}
		var r int32
		var err error
		if st.hostCalls >= st.limits.HostCallsPerCall {
			err = errf(abi.ErrBudgetExceeded, "more than %d host calls in one call", st.limits.HostCallsPerCall)
		} else {
			st.hostCalls++
			if g := st.gate; g != nil {
				g.Enter()
				r, err = safeCall(f, st, mod.Memory(), stack)
				g.Leave()
			} else {
				r, err = safeCall(f, st, mod.Memory(), stack)
			}
		}
		if err != nil {
			code := abi.ErrInternal
			var ae *abiError
			if errors.As(err, &ae) {
				code = ae.code
			}
			if f.name != abi.FuncLastError {
				st.lastErr = f.name + ": " + err.Error()
			}
			r = int32(code)
		}
		stack[0] = api.EncodeI32(r)
	})
}

func safeCall(f hostFunc, st *state, mem api.Memory, stack []uint64) (r int32, err error) {
	defer func() {
		if p := recover(); p != nil {
			r, err = 0, errf(abi.ErrInternal, "host bug: %v", p)
		}
	}()
	if mem == nil {
		return 0, errf(abi.ErrInvalidArgument, "module exports no memory")
	}
	return f.fn(st, mem, stack)
}

// Argument decoding.

func argI32(stack []uint64, i int) int32   { return api.DecodeI32(stack[i]) }
func argF64(stack []uint64, i int) float64 { return api.DecodeF64(stack[i]) }
func argPtr(stack []uint64, i int) uint32  { return uint32(stack[i]) }

// view returns guest memory [ptr, ptr+n) without copying.
func view(mem api.Memory, ptr uint32, n int32) ([]byte, error) {
	if n < 0 {
		return nil, errf(abi.ErrOutOfBounds, "length %d is negative", n)
	}
	if n == 0 {
		return nil, nil
	}
	b, ok := mem.Read(ptr, uint32(n))
	if !ok {
		return nil, errf(abi.ErrOutOfBounds, "[%d, %d) is outside guest memory of %d bytes", ptr, uint64(ptr)+uint64(n), mem.Size())
	}
	return b, nil
}

func readString(mem api.Memory, ptr uint32, n int32, what string) (string, error) {
	if n > 256 {
		return "", errf(abi.ErrInvalidArgument, "%s is %d bytes; the limit is 256", what, n)
	}
	b, err := view(mem, ptr, n)
	if err != nil {
		return "", err
	}
	if !utf8.Valid(b) {
		return "", errf(abi.ErrInvalidArgument, "%s is not UTF-8", what)
	}
	return string(b), nil
}

// readShape reads rank i64 dims. Negative dims are returned as they are.
func readShape(mem api.Memory, ptr uint32, rank int32) ([]int64, error) {
	if rank < 0 || rank > abi.MaxRank {
		return nil, errf(abi.ErrInvalidArgument, "rank %d is outside [0, %d]", rank, abi.MaxRank)
	}
	b, err := view(mem, ptr, 8*rank)
	if err != nil {
		return nil, err
	}
	dims := make([]int64, rank)
	for i := range dims {
		dims[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return dims, nil
}

// concreteShape checks that every dim is positive and returns it as ints.
func concreteShape(dims []int64) ([]int, error) {
	shape := make([]int, len(dims))
	for i, d := range dims {
		if d <= 0 || d > math.MaxInt32 {
			return nil, errf(abi.ErrInvalidArgument, "dim %d of shape %v is not in [1, 2³¹)", i, dims)
		}
		shape[i] = int(d)
	}
	return shape, nil
}

func needPhase(st *state, want phase, fn string) error {
	if st.phase != want {
		where := map[phase]string{phaseInit: abi.ExportInit, phaseForward: abi.ExportForward, phaseBackward: abi.ExportBackward}[want]
		return errf(abi.ErrWrongPhase, "%s is only allowed during %s", fn, where)
	}
	return nil
}

// needCall allows fn during moe_forward and moe_backward.
func needCall(st *state, fn string) error {
	if !st.phase.inCall() {
		return errf(abi.ErrWrongPhase, "%s is only allowed during %s or %s", fn, abi.ExportForward, abi.ExportBackward)
	}
	return nil
}

// The host functions. Their contracts are documented in package abi.

func lastError(st *state, mem api.Memory, stack []uint64) (int32, error) {
	ptr, capacity := argPtr(stack, 0), argI32(stack, 1)
	msg := st.lastErr
	if msg == "" {
		msg = st.guestErr
	}
	if capacity < 0 {
		return 0, errf(abi.ErrOutOfBounds, "capacity %d is negative", capacity)
	}
	n := min(int32(len(msg)), capacity)
	if n > 0 && !mem.Write(ptr, []byte(msg[:n])) {
		return 0, errf(abi.ErrOutOfBounds, "[%d, %d) is outside guest memory", ptr, uint64(ptr)+uint64(n))
	}
	return int32(len(msg)), nil
}

// maxConfigKeysRead bounds the absent keys an instance's moe_init may
// have recorded as read (present keys are bounded by the config itself).
const maxConfigKeysRead = 64

func configI64(st *state, mem api.Memory, stack []uint64) (int32, error) {
	key, err := readString(mem, argPtr(stack, 0), argI32(stack, 1), "config key")
	if err != nil {
		return 0, err
	}
	out := argPtr(stack, 2)
	v, ok := st.config[key]
	if st.phase == phaseInit && (ok || len(st.configRead) < maxConfigKeysRead) {
		if st.configRead == nil {
			st.configRead = map[string]bool{}
		}
		st.configRead[key] = true
	}
	if !ok {
		return 0, errf(abi.ErrNotFound, "no integer config value %q", key)
	}
	if !mem.WriteUint64Le(out, uint64(v)) {
		return 0, errf(abi.ErrOutOfBounds, "out pointer %d is outside guest memory", out)
	}
	return 0, nil
}

func declareInput(st *state, mem api.Memory, stack []uint64) (int32, error) {
	return declare(st, mem, stack, &st.inputs, &st.inputNames, st.limits.MaxInputs, "input")
}

func declareOutput(st *state, mem api.Memory, stack []uint64) (int32, error) {
	return declare(st, mem, stack, &st.outputs, &st.outputNames, st.limits.MaxOutputs, "output")
}

// declare appends a spec; names holds the names declared so far, so that
// the duplicate check is one map lookup.
func declare(st *state, mem api.Memory, stack []uint64, specs *[]Spec, names *map[string]bool, limit int, what string) (int32, error) {
	if err := needPhase(st, phaseInit, "declare_"+what); err != nil {
		return 0, err
	}
	if len(*specs) >= limit {
		return 0, errf(abi.ErrBudgetExceeded, "more than %d %ss", limit, what)
	}
	name, err := readString(mem, argPtr(stack, 0), argI32(stack, 1), what+" name")
	if err != nil {
		return 0, err
	}
	if name == "" {
		return 0, errf(abi.ErrInvalidArgument, "%s name is empty", what)
	}
	dt := abi.DType(argI32(stack, 2))
	if !dt.Valid() {
		return 0, errf(abi.ErrInvalidArgument, "%s %q: unknown dtype %d", what, name, dt)
	}
	dims, err := readShape(mem, argPtr(stack, 3), argI32(stack, 4))
	if err != nil {
		return 0, err
	}
	if len(dims) == 0 || dims[0] != abi.BatchDim {
		return 0, errf(abi.ErrInvalidArgument, "%s %q: shape %v must start with the batch dim %d", what, name, dims, abi.BatchDim)
	}
	// Check the dims after the batch dim here rather than with
	// concreteShape, so that a bad one is named by its place in the shape
	// the guest declared (--hidden-dim 0 is dim 1 of [-1 0]).
	for i, d := range dims[1:] {
		if d <= 0 || d > math.MaxInt32 {
			return 0, errf(abi.ErrInvalidArgument, "%s %q: dim %d of shape %v is %d, not in [1, 2³¹)", what, name, i+1, dims, d)
		}
	}
	if (*names)[name] {
		return 0, errf(abi.ErrAlreadyExists, "%s %q declared twice", what, name)
	}
	if *names == nil {
		*names = map[string]bool{}
	}
	(*names)[name] = true
	*specs = append(*specs, Spec{Name: name, DType: dt, Shape: dims})
	return int32(len(*specs) - 1), nil
}

func paramNew(st *state, mem api.Memory, stack []uint64) (int32, error) {
	if err := needPhase(st, phaseInit, abi.FuncParamNew); err != nil {
		return 0, err
	}
	name, err := readString(mem, argPtr(stack, 0), argI32(stack, 1), "param name")
	if err != nil {
		return 0, err
	}
	if name == "" {
		return 0, errf(abi.ErrInvalidArgument, "param name is empty")
	}
	if st.paramNames[name] {
		return 0, errf(abi.ErrAlreadyExists, "param %q declared twice", name)
	}
	if len(st.paramEntries) >= st.limits.MaxParams {
		return 0, errf(abi.ErrBudgetExceeded, "more than %d params", st.limits.MaxParams)
	}
	dims, err := readShape(mem, argPtr(stack, 3), argI32(stack, 4))
	if err != nil {
		return 0, err
	}
	shape, err := concreteShape(dims)
	if err != nil {
		return 0, err
	}
	a, b := argF64(stack, 6), argF64(stack, 7)
	if math.IsNaN(a) || math.IsNaN(b) || math.IsInf(a, 0) || math.IsInf(b, 0) {
		return 0, errf(abi.ErrInvalidArgument, "param %q: init arguments must be finite", name)
	}
	decl := paramDecl{name: name, dt: abi.DType(argI32(stack, 2)), shape: shape, init: abi.Init(argI32(stack, 5)), a: a, b: b}
	t, err := st.params.declare(decl.name, decl.dt, decl.shape, decl.init, decl.a, decl.b)
	if err != nil {
		return 0, err
	}
	h, err := st.addParam(t)
	if err != nil {
		return 0, err
	}
	if st.paramNames == nil {
		st.paramNames = map[string]bool{}
	}
	st.paramNames[name] = true
	st.paramDecls = append(st.paramDecls, decl)
	return h, nil
}

func input(st *state, _ api.Memory, stack []uint64) (int32, error) {
	if err := needCall(st, abi.FuncInput); err != nil {
		return 0, err
	}
	i, err := argIndex(stack, len(st.callInputs), "input")
	if err != nil {
		return 0, err
	}
	return st.callInputs[i], nil
}

func output(st *state, _ api.Memory, stack []uint64) (int32, error) {
	if err := needPhase(st, phaseForward, abi.FuncOutput); err != nil {
		return 0, err
	}
	i, err := argIndex(stack, len(st.outputs), "output")
	if err != nil {
		return 0, err
	}
	t, err := st.claim(argI32(stack, 1), st.outputs[i], fmt.Sprintf("output %d", i))
	if err != nil {
		return 0, err
	}
	st.callOutputs[i] = t
	return 0, nil
}

// argIndex reads stack[0] as the index of one of n declared things.
func argIndex(stack []uint64, n int, what string) (int, error) {
	i := argI32(stack, 0)
	if i < 0 || int(i) >= n {
		return 0, errf(abi.ErrInvalidArgument, "%s %d does not exist; %d declared", what, i, n)
	}
	return int(i), nil
}

// claim resolves a handle that becomes a result of the call (an output or
// a gradient), checks it against spec and freezes it.
func (st *state) claim(h int32, spec Spec, what string) (*gpuhost.Tensor, error) {
	e, err := st.lookup(h)
	if err != nil {
		return nil, err
	}
	if err := checkSpec(spec, e.t, st.batch); err != nil {
		return nil, errf(abi.ErrShapeMismatch, "%s: %v", what, err)
	}
	e.used = true
	return e.t, nil
}

func tensorNew(st *state, mem api.Memory, stack []uint64) (int32, error) {
	if err := needCall(st, abi.FuncTensorNew); err != nil {
		return 0, err
	}
	dt := abi.DType(argI32(stack, 0))
	if !dt.Valid() {
		return 0, errf(abi.ErrInvalidArgument, "unknown dtype %d", dt)
	}
	dims, err := readShape(mem, argPtr(stack, 1), argI32(stack, 2))
	if err != nil {
		return 0, err
	}
	shape, err := concreteShape(dims)
	if err != nil {
		return 0, err
	}
	if err := st.countOp(); err != nil {
		return 0, err
	}
	n, err := numElements(shape)
	if err != nil {
		return 0, err
	}
	if err := st.charge(abi.FuncTensorNew, n*int64(dt.Size()), 1); err != nil {
		return 0, err
	}
	t, err := st.dev.Zeros(dt, shape)
	if errors.Is(err, gpuhost.ErrOutOfMemory) { // the host's memory limit
		return 0, errf(abi.ErrBudgetExceeded, "%v", err)
	}
	if err != nil {
		return 0, errf(abi.ErrInvalidArgument, "%v", err)
	}
	h, err := st.add(t, kindNew)
	if err != nil {
		st.dev.Release(t)
		return 0, err
	}
	return h, nil
}

func tensorWrite(st *state, mem api.Memory, stack []uint64) (int32, error) {
	e, err := st.lookup(argI32(stack, 0))
	if err != nil {
		return 0, err
	}
	if e.kind != kindNew || e.used {
		return 0, errf(abi.ErrInvalidArgument, "only a tensor from tensor_new that no op has read may be written")
	}
	data, err := view(mem, argPtr(stack, 1), argI32(stack, 2))
	if err != nil {
		return 0, err
	}
	if len(data) != e.t.ByteSize() {
		return 0, errf(abi.ErrShapeMismatch, "wrote %d bytes to a tensor of %d bytes (%v%v)", len(data), e.t.ByteSize(), e.t.DType(), e.t.Shape())
	}
	// Hand the old storage back first, so that the copy reuses it and a
	// write allocates nothing the call has not paid for.
	dt, shape := e.t.DType(), e.t.Shape()
	st.dev.Release(e.t)
	t, err := st.dev.FromBytes(dt, shape, data)
	if err != nil {
		e.used = true // released; never read again
		return 0, errf(abi.ErrInternal, "%v", err)
	}
	e.t = t
	return 0, nil
}

func tensorRead(st *state, mem api.Memory, stack []uint64) (int32, error) {
	e, err := st.lookup(argI32(stack, 0))
	if err != nil {
		return 0, err
	}
	ptr, n := argPtr(stack, 1), argI32(stack, 2)
	size := e.t.ByteSize()
	if n < 0 {
		return 0, errf(abi.ErrOutOfBounds, "length %d is negative", n)
	}
	if int(n) < size {
		return 0, errf(abi.ErrShapeMismatch, "buffer of %d bytes is smaller than the tensor's %d bytes", n, size)
	}
	dst, err := view(mem, ptr, int32(size))
	if err != nil {
		return 0, err
	}
	if err := st.dev.ReadBytes(e.t, dst); err != nil {
		return 0, errf(abi.ErrInternal, "%v", err)
	}
	return int32(size), nil
}

func tensorShape(st *state, mem api.Memory, stack []uint64) (int32, error) {
	e, err := st.lookup(argI32(stack, 0))
	if err != nil {
		return 0, err
	}
	shape := e.t.Shape()
	ptr, capacity := argPtr(stack, 1), argI32(stack, 2)
	if int(capacity) < len(shape) {
		return int32(len(shape)), nil
	}
	buf, err := view(mem, ptr, int32(8*len(shape)))
	if err != nil {
		return 0, err
	}
	for i, d := range shape {
		binary.LittleEndian.PutUint64(buf[8*i:], uint64(d))
	}
	return int32(len(shape)), nil
}

func tensorDType(st *state, _ api.Memory, stack []uint64) (int32, error) {
	e, err := st.lookup(argI32(stack, 0))
	if err != nil {
		return 0, err
	}
	return int32(e.t.DType()), nil
}

func op(st *state, mem api.Memory, stack []uint64) (int32, error) {
	outs, err := runOp(st, mem, stack, func(n int) error {
		if n != 1 {
			return errf(abi.ErrInvalidArgument, "%v has %d results; call %s", abi.Op(argI32(stack, 0)), n, abi.FuncOpMulti)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return st.addResult(outs[0])
}

func opMulti(st *state, mem api.Memory, stack []uint64) (int32, error) {
	if err := needCall(st, abi.FuncOpMulti); err != nil {
		return 0, err
	}
	outPtr, outCap := argPtr(stack, 5), argI32(stack, 6)
	if outCap < 0 || outCap > 1<<16 {
		return 0, errf(abi.ErrOutOfBounds, "out_cap %d is outside [0, 65536]", outCap)
	}
	buf, err := view(mem, outPtr, 4*outCap)
	if err != nil {
		return 0, err
	}
	outs, err := runOp(st, mem, stack, func(n int) error {
		if n > int(outCap) {
			return errf(abi.ErrInvalidArgument, "%v has %d results; out_cap is %d", abi.Op(argI32(stack, 0)), n, outCap)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for i, t := range outs {
		h, err := st.addResult(t)
		if err != nil {
			return 0, err
		}
		binary.LittleEndian.PutUint32(buf[4*i:], uint32(h))
	}
	return int32(len(outs)), nil
}

// runOp decodes the op's args and attrs (stack[0:5]), runs it, lets fits
// refuse the number of results, and charges the results to the call.
func runOp(st *state, mem api.Memory, stack []uint64, fits func(int) error) ([]*gpuhost.Tensor, error) {
	code := abi.Op(argI32(stack, 0))
	if err := needCall(st, abi.FuncOp); err != nil {
		return nil, err
	}
	if err := st.stopped(); err != nil {
		return nil, err
	}
	if err := st.countOp(); err != nil {
		return nil, err
	}
	nargs, nattrs := argI32(stack, 2), argI32(stack, 4)
	if nargs < 0 || nattrs < 0 {
		return nil, errf(abi.ErrOutOfBounds, "%v: %d args and %d attrs; counts are not negative", code, nargs, nattrs)
	}
	if nargs > 64 || nattrs > 64 {
		return nil, errf(abi.ErrInvalidArgument, "%v: %d args and %d attrs; at most 64 of each", code, nargs, nattrs)
	}
	rawArgs, err := view(mem, argPtr(stack, 1), 4*nargs)
	if err != nil {
		return nil, err
	}
	rawAttrs, err := view(mem, argPtr(stack, 3), 8*nattrs)
	if err != nil {
		return nil, err
	}
	args := make([]*gpuhost.Tensor, nargs)
	entries := make([]*entry, nargs)
	for i := range args {
		h := int32(binary.LittleEndian.Uint32(rawArgs[4*i:]))
		e, err := st.lookup(h)
		if err != nil {
			return nil, fmt.Errorf("%v: arg %d: %w", code, i, err)
		}
		args[i], entries[i] = e.t, e
	}
	attrs := make([]float64, nattrs)
	for i := range attrs {
		attrs[i] = math.Float64frombits(binary.LittleEndian.Uint64(rawAttrs[8*i:]))
	}
	plan, err := gpuhost.PlanOp(st.dev, code, args, attrs)
	if err != nil {
		return nil, opError(code, err)
	}
	if err := fits(plan.Results()); err != nil {
		return nil, err
	}
	// Charge what the op allocates, and with a tape what its backward
	// will, before a byte of it exists.
	bytes, objects := plan.Bytes(), int64(plan.Tensors())
	if st.tape != nil {
		bytes, objects = bytes+plan.BackwardBytes(), objects+int64(plan.BackwardTensors())
	}
	if err := st.charge(code.String(), bytes, objects); err != nil {
		return nil, err
	}
	stop := context.Background()
	if st.stop != nil {
		stop = st.stop
	}
	outs, err := plan.RunContext(stop, st.dev, st.tape)
	if err != nil {
		if serr := st.stopped(); serr != nil {
			return nil, serr
		}
		return nil, opError(code, err)
	}
	for _, e := range entries {
		e.used = true
	}
	return outs, nil
}

// opError maps a gpuhost error to the ABI's codes.
func opError(code abi.Op, err error) error {
	switch {
	case errors.Is(err, gpuhost.ErrUnknownOp):
		return errf(abi.ErrUnknownOp, "op code %d is not served by this host (ABI v%d)", int32(code), abi.Version)
	case errors.Is(err, gpuhost.ErrShape):
		return errf(abi.ErrShapeMismatch, "%v", err)
	case errors.Is(err, gpuhost.ErrArgument):
		return errf(abi.ErrInvalidArgument, "%v", err)
	case errors.Is(err, gpuhost.ErrOutOfMemory): // the host's memory limit
		return errf(abi.ErrBudgetExceeded, "%v", err)
	}
	return errf(abi.ErrInternal, "%v: %v", code, err)
}

func fail(st *state, mem api.Memory, stack []uint64) (int32, error) {
	n := min(argI32(stack, 1), 1024)
	b, err := view(mem, argPtr(stack, 0), n)
	if err != nil {
		return 0, err
	}
	st.guestErr = string(b)
	return 0, nil
}

func gradOutput(st *state, _ api.Memory, stack []uint64) (int32, error) {
	if err := needPhase(st, phaseBackward, abi.FuncGradOutput); err != nil {
		return 0, err
	}
	i, err := argIndex(stack, len(st.callGradOutputs), "output")
	if err != nil {
		return 0, err
	}
	return st.callGradOutputs[i], nil
}

func gradInput(st *state, _ api.Memory, stack []uint64) (int32, error) {
	if err := needPhase(st, phaseBackward, abi.FuncGradInput); err != nil {
		return 0, err
	}
	i, err := argIndex(stack, len(st.inputs), "input")
	if err != nil {
		return 0, err
	}
	if st.inputs[i].DType != abi.DTypeFloat32 {
		return 0, errf(abi.ErrInvalidArgument, "input %d (%s) is not float32 and has no gradient", i, st.inputs[i])
	}
	t, err := st.claim(argI32(stack, 1), st.inputs[i], fmt.Sprintf("gradient of input %d", i))
	if err != nil {
		return 0, err
	}
	st.gradInputs[i] = t
	return 0, nil
}

func paramGrad(st *state, _ api.Memory, stack []uint64) (int32, error) {
	if err := needPhase(st, phaseBackward, abi.FuncParamGrad); err != nil {
		return 0, err
	}
	p, err := st.lookup(argI32(stack, 0))
	if err != nil {
		return 0, err
	}
	if p.kind != kindParam {
		return 0, errf(abi.ErrInvalidArgument, "handle %d is not a parameter", argI32(stack, 0))
	}
	g, err := st.lookup(argI32(stack, 1))
	if err != nil {
		return 0, err
	}
	if g.t.DType() != p.t.DType() || !slices.Equal(g.t.Shape(), p.t.Shape()) {
		return 0, errf(abi.ErrShapeMismatch, "gradient %v%v for a parameter of %v%v", g.t.DType(), g.t.Shape(), p.t.DType(), p.t.Shape())
	}
	g.used = true
	st.paramGrads[p.t] = g.t
	return 0, nil
}
