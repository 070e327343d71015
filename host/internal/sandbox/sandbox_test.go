package sandbox_test

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// probeWasm is a hostile guest: x[0] picks a misuse of the ABI.
//
// Rebuild: wat2wasm testdata/probe.wat -o testdata/probe.wasm
//
//go:embed testdata/probe.wasm
var probeWasm []byte

type probe struct {
	t    *testing.T
	dev  gpuhost.Device
	inst *sandbox.Instance
}

func newProbe(t *testing.T, rt *sandbox.Runtime, m *sandbox.Module) *probe {
	t.Helper()
	dev := gpuhost.NewCPU(1)
	inst, err := m.Instantiate(context.Background(), sandbox.Binding{Device: dev, Params: sandbox.NewParamStore(dev, []byte("probe"), 0), Config: map[string]int64{"seed": 42}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Close(context.Background()) })
	return &probe{t: t, dev: dev, inst: inst}
}

// call runs moe_forward with x = [c, arg] and returns the raw bits of the
// output.
func (p *probe) call(c, arg float32) ([]uint32, error) {
	x, err := p.dev.FromFloat32([]int{1, 2}, []float32{c, arg})
	if err != nil {
		p.t.Fatal(err)
	}
	outs, err := p.inst.Forward(context.Background(), []*gpuhost.Tensor{x}, nil)
	if err != nil {
		return nil, err
	}
	b := make([]byte, outs[0].ByteSize())
	if err := p.dev.ReadBytes(outs[0], b); err != nil {
		p.t.Fatal(err)
	}
	return []uint32{binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])}, nil
}

func TestHostileGuest(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(ctx, t.TempDir(), sandbox.Limits{OpsPerCall: 100, BytesPerCall: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	m, err := rt.Compile(ctx, probeWasm)
	if err != nil {
		t.Fatal(err)
	}
	a, b := newProbe(t, rt, m), newProbe(t, rt, m)

	// A valid call first, so that case 3 has a stale handle to use, and
	// instance b's parameter handle, live in b only, for case 4.
	if _, err := a.call(0, 0); err != nil {
		t.Fatal(err)
	}
	bits, err := b.call(5, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The handle goes to a's guest as x[1]'s bits.
	otherParam := math.Float32frombits(bits[0])

	tests := []struct {
		name string
		c    float32
		arg  float32
		code abi.Errno // what the host returned to the guest
		msg  string    // in the host's message
	}{
		{"forged handle", 1, 0, abi.ErrInvalidHandle, "not live"},
		{"zero handle", 2, 0, abi.ErrInvalidHandle, "positive"},
		{"handle from an earlier call", 3, 0, abi.ErrInvalidHandle, "not live"},
		{"handle from another instance", 4, otherParam, abi.ErrInvalidHandle, "not live"},
		{"pointer out of bounds", 6, 0, abi.ErrOutOfBounds, "outside guest memory"},
		{"negative length", 7, 0, abi.ErrOutOfBounds, "negative"},
		{"op budget", 8, 0, abi.ErrBudgetExceeded, "more than 100 ops"},
		{"byte budget", 9, 0, abi.ErrBudgetExceeded, "budget"},
		{"unknown op", 10, 0, abi.ErrUnknownOp, "op code 999"},
		{"declaration during forward", 11, 0, abi.ErrWrongPhase, "moe_init"},
		{"shape mismatch", 12, 0, abi.ErrShapeMismatch, "matmul"},
		{"too many args", 14, 0, abi.ErrInvalidArgument, "at most 64"},
		{"write to a parameter", 15, 0, abi.ErrInvalidArgument, "tensor_new"},
		{"output of the wrong shape", 16, 0, abi.ErrShapeMismatch, "output 0"},
		{"negative capacity", 17, 0, abi.ErrOutOfBounds, ""}, // last_error keeps the previous message
		{"args off the end of memory", 18, 0, abi.ErrOutOfBounds, "outside guest memory"},
		{"negative arg count", 19, 0, abi.ErrOutOfBounds, "not negative"},
		{"op_multi without room", 20, 0, abi.ErrInvalidArgument, "out_cap is 1"},
		{"op_multi handles off memory", 21, 0, abi.ErrOutOfBounds, "outside guest memory"},
		{"tensor_shape off memory", 24, 0, abi.ErrOutOfBounds, "outside guest memory"},
		{"unknown config key", 25, 0, abi.ErrNotFound, `"nope"`},
		{"the guest's own error", 27, 0, abi.ErrInvalidArgument, "probe refused"},
		{"fail message off memory", 28, 0, abi.ErrOutOfBounds, "outside guest memory"},
		{"grad_output in forward", 29, 0, abi.ErrWrongPhase, "grad_output is only allowed during moe_backward"},
		{"grad_input in forward", 30, 0, abi.ErrWrongPhase, "grad_input is only allowed during moe_backward"},
		{"param_grad in forward", 31, 0, abi.ErrWrongPhase, "param_grad is only allowed during moe_backward"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.call(tt.c, tt.arg)
			var ge *sandbox.GuestError
			if !errors.As(err, &ge) {
				t.Fatalf("got %v, want a GuestError with %v", err, tt.code)
			}
			if ge.Code != tt.code || !strings.Contains(ge.Msg, tt.msg) {
				t.Errorf("got code %v, message %q; want %v and a message with %q", ge.Code, ge.Msg, tt.code, tt.msg)
			}
			// The instance is still usable and right.
			bits, err := a.call(0, 7)
			if err != nil {
				t.Fatalf("valid call after the bad one: %v", err)
			}
			if math.Float32frombits(bits[1]) != 7 {
				t.Errorf("valid call after the bad one returned %v", bits)
			}
		})
	}

	// Valid uses of op_multi, tensor_shape and config_i64: the guest
	// checks what it got and answers x, or [x1, x0] for case 22.
	for _, tt := range []struct {
		name string
		c    float32
		want [2]float32
	}{
		{"op_multi split and concat", 22, [2]float32{9, 22}},
		{"tensor_shape", 23, [2]float32{23, 9}},
		{"config_i64", 26, [2]float32{26, 9}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bits, err := a.call(tt.c, 9)
			if err != nil {
				t.Fatal(err)
			}
			if got := [2]float32{math.Float32frombits(bits[0]), math.Float32frombits(bits[1])}; got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}

	// moe_backward: misuses of the gradient functions, then a valid call.
	backward := func(c, arg float32, gy []float32) ([]*gpuhost.Tensor, map[*gpuhost.Tensor]*gpuhost.Tensor, error) {
		x, err := a.dev.FromFloat32([]int{1, 2}, []float32{c, arg})
		if err != nil {
			t.Fatal(err)
		}
		g, err := a.dev.FromFloat32([]int{1, 2}, gy)
		if err != nil {
			t.Fatal(err)
		}
		return a.inst.Backward(context.Background(), []*gpuhost.Tensor{x}, []*gpuhost.Tensor{g})
	}
	for _, tt := range []struct {
		name string
		c    float32
		code abi.Errno
		msg  string
	}{
		{"grad_output that does not exist", 40, abi.ErrInvalidArgument, "output 5 does not exist"},
		{"param_grad of a non-parameter", 41, abi.ErrInvalidArgument, "is not a parameter"},
		{"grad_input of the wrong shape", 42, abi.ErrShapeMismatch, "gradient of input 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := backward(tt.c, 0, []float32{1, 2})
			var ge *sandbox.GuestError
			if !errors.As(err, &ge) || ge.Code != tt.code || !strings.Contains(ge.Msg, tt.msg) {
				t.Fatalf("got %v, want code %v and a message with %q", err, tt.code, tt.msg)
			}
		})
	}
	t.Run("valid backward", func(t *testing.T) {
		gradInputs, byParam, err := backward(43, 5, []float32{0.5, -3})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := a.dev.Float32s(gradInputs[0]); err != nil || !slices.Equal(got, []float32{0.5, -3}) {
			t.Errorf("input gradient %v, %v; want the output's [0.5 -3]", got, err)
		}
		if len(byParam) != 1 {
			t.Fatalf("%d parameter gradients, want 1", len(byParam))
		}
		for _, g := range byParam {
			if got, err := a.dev.Float32s(g); err != nil || !slices.Equal(got, []float32{5, 5}) {
				t.Errorf("parameter gradient %v, %v; want [5 5]", got, err)
			}
		}
	})

	t.Run("errors ignored", func(t *testing.T) {
		// The guest ignores every error and claims success: the host
		// refuses to return an output that was never set.
		if _, err := a.call(13, 0); !errors.Is(err, sandbox.ErrGuest) || !strings.Contains(err.Error(), "without setting output 0") {
			t.Fatalf("got %v, want an error for the missing output", err)
		}
		if _, err := a.call(0, 1); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		if _, err := a.call(99, 0); !errors.Is(err, sandbox.ErrTrap) || !strings.Contains(err.Error(), "unreachable") {
			t.Fatalf("got %v, want a trap", err)
		}
		if !a.inst.Closed() {
			t.Error("a trapped instance is still open")
		}
		// The other instance of the module is unaffected.
		if _, err := b.call(0, 1); err != nil {
			t.Fatal(err)
		}
	})
}
