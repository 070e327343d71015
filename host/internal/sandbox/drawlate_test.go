package sandbox_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// TestParamsDrawnLate checks the late draw of initial values: moe_init
// leaves them undrawn; a call, Params or Draw draws them, to the values an
// eager draw gives; a parameter written by Set is never drawn over; and a
// Set that fails half way gives the parameter its initial values back.
func TestParamsDrawnLate(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(ctx, "", sandbox.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	m, err := rt.Compile(ctx, wasmexperts.FFNC) // compiles in milliseconds
	if err != nil {
		t.Fatal(err)
	}
	dev := gpuhost.NewCPU(1)
	// Storage that the parameters may reuse holds junk, so that a
	// parameter nobody drew does not pass for zeros.
	junk, err := dev.FromFloat32([]int{1 << 12}, slices.Repeat([]float32{7}, 1<<12))
	if err != nil {
		t.Fatal(err)
	}
	dev.Release(junk)
	config := map[string]int64{"hidden_dim": 16}
	instantiate := func(ps *sandbox.ParamStore) *sandbox.Instance {
		inst, err := m.Instantiate(ctx, sandbox.Binding{Device: dev, Params: ps, Config: config})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { inst.Close(ctx) })
		return inst
	}
	values := func(ps []sandbox.Param) [][]float32 {
		out := make([][]float32, len(ps))
		for i, p := range ps {
			out[i], err = dev.Float32s(p.Tensor)
			if err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	x, err := dev.FromFloat32([]int{2, 16}, make16x2())
	if err != nil {
		t.Fatal(err)
	}
	forward := func(inst *sandbox.Instance) []float32 {
		outs, err := inst.Forward(ctx, []*gpuhost.Tensor{x}, nil)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := dev.Float32s(outs[0])
		return v
	}

	// The reference: drawn at once, through Params.
	refStore := sandbox.NewParamStore(dev, []byte("ffn.0"), 0)
	refInst := instantiate(refStore)
	ref := values(refStore.Params())
	n := len(ref)
	if n < 2 {
		t.Fatalf("ffn-c declared %d parameters; the test needs two or more", n)
	}
	refOut := forward(refInst)

	t.Run("a call draws", func(t *testing.T) {
		ps := sandbox.NewParamStore(dev, []byte("ffn.0"), 0)
		inst := instantiate(ps)
		if got := ps.Undrawn(); got != n {
			t.Fatalf("after moe_init %d of %d parameters are undrawn, want all", got, n)
		}
		if got := forward(inst); !slices.Equal(got, refOut) {
			t.Fatalf("a forward before any draw computed %v, want %v (the drawn parameters')", got, refOut)
		}
		if got := ps.Undrawn(); got != 0 {
			t.Fatalf("after a forward %d parameters are undrawn", got)
		}
	})
	t.Run("Set replaces the draw", func(t *testing.T) {
		ps := sandbox.NewParamStore(dev, []byte("ffn.0"), 0)
		instantiate(ps)
		decl := ps.Declared()
		want := make([]float32, decl[1].Tensor.Len())
		for i := range want {
			want[i] = float32(i%5) + 0.25
		}
		if err := ps.Set(1, func(dst []float32) error { copy(dst, want); return nil }); err != nil {
			t.Fatal(err)
		}
		if got := ps.Undrawn(); got != n-1 {
			t.Fatalf("after one Set %d parameters are undrawn, want %d", got, n-1)
		}
		if err := ps.Draw(); err != nil {
			t.Fatal(err)
		}
		got := values(ps.Params())
		for i := range got {
			w := ref[i]
			if i == 1 {
				w = want
			}
			if !slices.Equal(got[i], w) {
				t.Fatalf("parameter %d (%s) after Set of parameter 1 and Draw: not the values it should hold", i, decl[i].Name)
			}
		}
	})
	t.Run("a failed Set draws again", func(t *testing.T) {
		ps := sandbox.NewParamStore(dev, []byte("ffn.0"), 0)
		instantiate(ps)
		for _, drawFirst := range []bool{false, true} {
			if drawFirst {
				ps.Params()
			}
			boom := errors.New("read error")
			err := ps.Set(0, func(dst []float32) error {
				copy(dst[:len(dst)/2], make([]float32, len(dst)/2))
				return boom
			})
			if !errors.Is(err, boom) {
				t.Fatalf("drawn first %v: Set returned %v, want the write's error", drawFirst, err)
			}
			if got := values(ps.Params()); !slices.Equal(got[0], ref[0]) {
				t.Fatalf("drawn first %v: after a failed Set parameter 0 holds other values than its initial ones", drawFirst)
			}
		}
	})
	t.Run("Reinit draws every parameter again", func(t *testing.T) {
		ps := sandbox.NewParamStore(dev, []byte("ffn.0"), 0)
		instantiate(ps)
		for i, p := range ps.Declared() {
			if err := ps.Set(i, func(dst []float32) error { clear(dst); return nil }); err != nil {
				t.Fatalf("param %s: %v", p.Name, err)
			}
		}
		ps.Reinit()
		if got := ps.Undrawn(); got != n {
			t.Fatalf("after Reinit %d of %d parameters are undrawn", got, n)
		}
		got := values(ps.Params())
		for i := range got {
			if !slices.Equal(got[i], ref[i]) {
				t.Fatalf("parameter %d after Reinit: not its initial values", i)
			}
		}
	})
}
