package sandbox

import (
	"context"
	"slices"
	"sync/atomic"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

type phase int

const (
	phaseStart    phase = iota // in _initialize and moe_abi_version: nothing allowed
	phaseInit                  // in moe_init: declarations allowed
	phaseIdle                  // between calls: nothing allowed
	phaseForward               // in moe_forward: tensors and ops allowed
	phaseBackward              // in moe_backward: tensors, ops and gradients
)

// inCall reports whether the instance is running a forward or backward.
func (p phase) inCall() bool { return p == phaseForward || p == phaseBackward }

// handleKind says where a handle came from, which decides what the guest
// may do with it.
type handleKind int

const (
	kindParam  handleKind = iota // instance-lived, host-owned
	kindInput                    // call-lived, the batch's input
	kindNew                      // call-lived, from tensor_new: writable until used
	kindResult                   // call-lived, from op
)

type entry struct {
	t    *gpuhost.Tensor
	kind handleKind
	used bool // read by an op or set as an output; no more writes
}

// lastHandle numbers handles across all instances of the process, so that
// a handle from another instance or an earlier call is never found in the
// current tables (until 2³¹ handles wrap, and then only by a collision with
// a live handle of the same instance).
var lastHandle atomic.Int32

func newHandle() int32 {
	for {
		h := lastHandle.Add(1)
		if h > 0 {
			return h
		}
		lastHandle.CompareAndSwap(h, 0)
	}
}

// state is one instance's side of the ABI: declarations, handle tables,
// the current call and its budgets. Only the goroutine running an export
// of the instance touches it.
type state struct {
	dev    gpuhost.Device
	params *ParamStore
	config map[string]int64
	limits Limits
	phase  phase

	lastErr  string // message of the last error returned to the guest
	guestErr string // message from FuncFail

	inputs, outputs []Spec
	paramHandles    map[int32]*entry
	paramNames      map[string]bool

	// The current call.
	calls       map[int32]*entry
	callInputs  []int32
	callOutputs []*gpuhost.Tensor
	batch       int
	tape        *gpuhost.Tape
	ops         int
	bytes       int64

	// The current moe_backward call.
	callGradOutputs []int32
	gradInputs      []*gpuhost.Tensor
	paramGrads      map[*gpuhost.Tensor]*gpuhost.Tensor
}

type stateKey struct{}

func withState(ctx context.Context, st *state) context.Context {
	return context.WithValue(ctx, stateKey{}, st)
}

func stateFrom(ctx context.Context) *state {
	st, _ := ctx.Value(stateKey{}).(*state)
	return st
}

func (st *state) beginCall(ph phase, inputs, gradOutputs []*gpuhost.Tensor, batch int, tape *gpuhost.Tape) {
	st.phase = ph
	st.calls = make(map[int32]*entry, 64)
	st.callInputs = st.addInputs(inputs)
	st.callGradOutputs = st.addInputs(gradOutputs)
	st.gradInputs = make([]*gpuhost.Tensor, len(inputs))
	st.paramGrads = map[*gpuhost.Tensor]*gpuhost.Tensor{}
	st.callOutputs = make([]*gpuhost.Tensor, len(st.outputs))
	st.batch = batch
	st.tape = tape
	st.ops, st.bytes = 0, 0
	st.guestErr, st.lastErr = "", ""
}

// addInputs gives read-only call-lived handles to tensors.
func (st *state) addInputs(ts []*gpuhost.Tensor) []int32 {
	hs := make([]int32, len(ts))
	for i, t := range ts {
		hs[i] = newHandle()
		st.calls[hs[i]] = &entry{t: t, kind: kindInput}
	}
	return hs
}

// endCall drops every call-lived handle, so that they go stale. Without a
// tape it releases the tensors the call made, but its results (outputs and
// gradients), to the device; with one, they belong to the tape (see
// gpuhost.Tape.Release).
func (st *state) endCall() {
	if st.tape == nil {
		var done []*gpuhost.Tensor
		for _, e := range st.calls {
			if e.kind == kindResult || e.kind == kindNew {
				done = append(done, e.t)
			}
		}
		kept := slices.Concat(st.callOutputs, st.gradInputs)
		for _, g := range st.paramGrads {
			kept = append(kept, g)
		}
		done = slices.DeleteFunc(done, func(t *gpuhost.Tensor) bool { return slices.Contains(kept, t) })
		st.dev.Release(done...)
	}
	st.phase = phaseIdle
	st.calls = nil
	st.callInputs, st.callGradOutputs = nil, nil
	st.callOutputs, st.gradInputs, st.paramGrads = nil, nil, nil
	st.tape = nil
}

// lookup resolves a handle of the current call or a parameter handle.
func (st *state) lookup(h int32) (*entry, error) {
	if e, ok := st.calls[h]; ok {
		return e, nil
	}
	if e, ok := st.paramHandles[h]; ok {
		return e, nil
	}
	if h <= 0 {
		return nil, errf(abi.ErrInvalidHandle, "handle %d: handles are positive", h)
	}
	return nil, errf(abi.ErrInvalidHandle, "handle %d is not live in this instance and call (forged, stale or from another instance)", h)
}

// addResult gives an op's result a call-lived handle.
func (st *state) addResult(t *gpuhost.Tensor) int32 {
	h := newHandle()
	st.calls[h] = &entry{t: t, kind: kindResult}
	return h
}

// TensorOverhead is the host memory one tensor costs beyond its data: the
// tensor, its shape, its handle and the handle table's slot. It was
// measured at about 340 bytes on amd64 and is rounded up, so that a call
// that makes millions of one-byte tensors pays for them.
const TensorOverhead = 512

// charge counts objects new tensors of n data bytes in all against the
// call's byte budget, before they are allocated.
func (st *state) charge(what string, n, objects int64) error {
	total := n + objects*TensorOverhead
	if n < 0 || total < n || st.bytes+total > st.limits.BytesPerCall || st.bytes+total < st.bytes {
		return errf(abi.ErrBudgetExceeded, "%s would bring the call's host memory to %d bytes (%d tensor bytes, %d tensors); the budget is %d", what, uint64(st.bytes)+uint64(total), n, objects, st.limits.BytesPerCall)
	}
	st.bytes += total
	return nil
}

// countOp counts one op, op_multi or tensor_new against OpsPerCall.
func (st *state) countOp() error {
	if st.ops >= st.limits.OpsPerCall {
		return errf(abi.ErrBudgetExceeded, "more than %d ops in one call", st.limits.OpsPerCall)
	}
	st.ops++
	return nil
}
