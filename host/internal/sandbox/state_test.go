package sandbox

import (
	"errors"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// TestHandles checks the handle rules of ABI § 7 on the state alone: a
// handle of an earlier call, another instance or a wrapped counter never
// resolves, and parameter and call handles never meet.
func TestHandles(t *testing.T) {
	t.Parallel()
	dev := gpuhost.NewCPU(1)
	x, err := dev.Zeros(abi.DTypeFloat32, []int{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	newState := func() *state {
		st := &state{dev: dev, limits: Limits{}.WithDefaults()}
		st.nextCall, st.paramBase = newHandleState()
		if _, err := st.addParam(x); err != nil {
			t.Fatal(err)
		}
		return st
	}
	a, b := newState(), newState()
	resolves := func(st *state, h int32) bool {
		_, err := st.lookup(h)
		return err == nil
	}

	a.beginCall(phaseForward, []*gpuhost.Tensor{x}, nil, 1, nil)
	first := a.callInputs[0]
	r1, err := a.addResult(x)
	if err != nil {
		t.Fatal(err)
	}
	if !resolves(a, first) || !resolves(a, r1) {
		t.Fatal("live call handles do not resolve")
	}
	a.endCall()
	if resolves(a, first) || resolves(a, r1) {
		t.Error("a handle resolves after its call ended")
	}
	a.beginCall(phaseForward, []*gpuhost.Tensor{x}, nil, 1, nil)
	for _, h := range []int32{first, r1} {
		if resolves(a, h) {
			t.Errorf("handle %d of an earlier call resolves in the next call", h)
		}
	}
	if p := a.paramBase; p < paramHandleBase || a.callInputs[0] >= callHandleEnd {
		t.Errorf("param handle %d and call handle %d are not in their ranges", p, a.callInputs[0])
	}
	if b.paramBase != a.paramBase && resolves(a, b.paramBase) {
		t.Error("another instance's parameter handle resolves")
	}
	for _, h := range []int32{0, -1, -1 << 31, callHandleEnd, paramHandleBase - 1, 1<<31 - 1} {
		if resolves(a, h) {
			t.Errorf("handle %d resolves", h)
		}
	}
	a.endCall()

	// The counter at its end: the instance is spent, and no handle is
	// given twice.
	a.nextCall = callHandleEnd - 2
	a.beginCall(phaseForward, []*gpuhost.Tensor{x}, nil, 1, nil)
	last, err := a.addResult(x)
	if err != nil || last != callHandleEnd-1 {
		t.Fatalf("last handle %d, %v; want %d", last, err, callHandleEnd-1)
	}
	if _, err := a.addResult(x); !isCode(err, abi.ErrBudgetExceeded) || !a.spent {
		t.Errorf("past the end: %v, spent %t; want ErrBudgetExceeded and spent", err, a.spent)
	}
	a.endCall()
}

func isCode(err error, code abi.Errno) bool {
	var ae *abiError
	return errors.As(err, &ae) && ae.code == code
}
