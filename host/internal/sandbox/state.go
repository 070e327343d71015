package sandbox

import (
	"context"
	"math/rand/v2"
	"slices"

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

// stopped returns ErrBudgetExceeded once the current call has been
// stopped: its callers left, or its deadline passed.
func (st *state) stopped() error {
	if st.stop == nil || st.stop.Err() == nil {
		return nil
	}
	return errf(abi.ErrBudgetExceeded, "the call was stopped (%v); return now", st.stop.Err())
}

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

// Handles are per instance. Call handles are numbered from one counter of
// the instance that never goes back: a call's handles are the contiguous
// range [callBase, callBase+len(calls)), so a handle of an earlier call is
// below the range and never resolves, and lookup is an index. Parameter
// handles are paramBase+i in their own range above the call handles'. Both
// start at a random offset, so that a handle's value tells the guest
// nothing about other instances. When the call counter reaches
// callHandleEnd, the instance is spent: the host function fails and the
// instance is retired after the call (ErrTrap), rather than wrap.
const (
	callHandleEnd   = 1 << 30 // call handles are in [1, 2³⁰)
	paramHandleBase = 1 << 30 // parameter handles are in [2³⁰, 2³¹)
	// maxParams caps the parameters of one expert, so that its handles fit
	// [paramBase, 2³¹).
	maxParams = 1 << 20
)

// newHandleState returns the random starts of an instance's handles.
func newHandleState() (nextCall, paramBase int32) {
	return 1 + rand.Int32N(1<<20), paramHandleBase + rand.Int32N(paramHandleBase-maxParams)
}

// state is one instance's side of the ABI: declarations, handle tables,
// the current call and its budgets. Only the goroutine running an export
// of the instance touches it.
type state struct {
	dev    gpuhost.Device
	params *ParamStore
	config map[string]int64
	// configRead records every key the guest asked for during moe_init,
	// found or not: the keys the module declares it reads.
	configRead map[string]bool
	limits     Limits
	phase      phase

	lastErr  string // message of the last error returned to the guest
	guestErr string // message from FuncFail

	inputs, outputs []Spec
	paramEntries    []*entry    // handle paramBase+i
	paramDecls      []paramDecl // what moe_init declared, in order
	paramNames      map[string]bool
	inputNames      map[string]bool
	outputNames     map[string]bool
	paramBase       int32
	// gate is the batch's hold on the device during an export call
	// (see Gate), nil outside one or when the caller has none.
	gate Gate
	// hostCalls counts host function calls in the current export call.
	hostCalls int

	// nextCall is the next call handle; spent is set when it reached
	// callHandleEnd.
	nextCall int32
	spent    bool

	// The current call.
	callBase    int32
	calls       []*entry // handle callBase+i
	callInputs  []int32
	callOutputs []*gpuhost.Tensor
	batch       int
	tape        *gpuhost.Tape
	ops         int
	bytes       int64
	// stop is done once the call's callers have left or its time is up;
	// ops check it (see Instance.callContext).
	stop context.Context
	// sleepCut is set when stop ended a sleep of the guest's (see
	// guestClock): the call then fails as stopped.
	sleepCut bool

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
	st.callBase = st.nextCall
	st.calls = make([]*entry, 0, 64)
	st.callInputs = st.addInputs(inputs)
	st.callGradOutputs = st.addInputs(gradOutputs)
	st.gradInputs = make([]*gpuhost.Tensor, len(inputs))
	st.paramGrads = map[*gpuhost.Tensor]*gpuhost.Tensor{}
	st.callOutputs = make([]*gpuhost.Tensor, len(st.outputs))
	st.batch = batch
	st.tape = tape
	st.ops, st.bytes, st.hostCalls = 0, 0, 0
	st.sleepCut = false
	st.guestErr, st.lastErr = "", ""
}

// addInputs gives read-only call-lived handles to tensors. Their handles
// are 0 (never valid) when the instance is spent; the caller checks spent
// first.
func (st *state) addInputs(ts []*gpuhost.Tensor) []int32 {
	hs := make([]int32, len(ts))
	for i, t := range ts {
		hs[i], _ = st.add(t, kindInput)
	}
	return hs
}

// add gives t a call-lived handle.
func (st *state) add(t *gpuhost.Tensor, kind handleKind) (int32, error) {
	if st.nextCall >= callHandleEnd {
		st.spent = true
		return 0, errf(abi.ErrBudgetExceeded, "this instance has given out all of its %d call handles; it is retired after this call", callHandleEnd-1)
	}
	h := st.nextCall
	st.nextCall++
	st.calls = append(st.calls, &entry{t: t, kind: kind})
	return h, nil
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
	if i := int64(h) - int64(st.callBase); h < callHandleEnd && i >= 0 && i < int64(len(st.calls)) {
		return st.calls[i], nil
	}
	if i := int64(h) - int64(st.paramBase); h >= paramHandleBase && i >= 0 && i < int64(len(st.paramEntries)) {
		return st.paramEntries[i], nil
	}
	if h <= 0 {
		return nil, errf(abi.ErrInvalidHandle, "handle %d: handles are positive", h)
	}
	return nil, errf(abi.ErrInvalidHandle, "handle %d is not live in this instance and call (forged, stale or from another instance)", h)
}

// addResult gives an op's result a call-lived handle.
func (st *state) addResult(t *gpuhost.Tensor) (int32, error) {
	return st.add(t, kindResult)
}

// addParam gives a parameter an instance-lived handle.
func (st *state) addParam(t *gpuhost.Tensor) (int32, error) {
	if len(st.paramEntries) >= maxParams {
		return 0, errf(abi.ErrBudgetExceeded, "more than %d parameters", maxParams)
	}
	st.paramEntries = append(st.paramEntries, &entry{t: t, kind: kindParam})
	return st.paramBase + int32(len(st.paramEntries)-1), nil
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
