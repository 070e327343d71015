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

// TestSharedInstance checks that experts of one module and config can
// share an instance: NewParamStore gives another expert the parameters a
// fresh instance would have given it, and after Bind the shared instance
// computes exactly what that expert's own instance computes.
func TestSharedInstance(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(ctx, "", sandbox.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	m, err := rt.Compile(ctx, wasmexperts.FFNC) // the C ffn: it compiles in milliseconds under -race
	if err != nil {
		t.Fatal(err)
	}
	dev := gpuhost.NewCPU(1)
	config := map[string]int64{"hidden_dim": 16}
	instantiate := func(ps *sandbox.ParamStore) *sandbox.Instance {
		inst, err := m.Instantiate(ctx, sandbox.Binding{Device: dev, Params: ps, Config: config})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { inst.Close(ctx) })
		return inst
	}
	psA := sandbox.NewParamStore(dev, []byte("ffn.0"), 0)
	shared := instantiate(psA)
	psB, err := shared.NewParamStore([]byte("ffn.1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	soloA := instantiate(sandbox.NewParamStore(dev, []byte("ffn.0"), 0))
	psBSolo := sandbox.NewParamStore(dev, []byte("ffn.1"), 0)
	soloB := instantiate(psBSolo)

	// The same parameters as a fresh instance's.
	got, want := psB.Params(), psBSolo.Params()
	if len(got) != len(want) || len(got) == 0 {
		t.Fatalf("%d parameters, want %d", len(got), len(want))
	}
	for i := range got {
		g, _ := dev.Float32s(got[i].Tensor)
		w, _ := dev.Float32s(want[i].Tensor)
		if got[i].Name != want[i].Name || !slices.Equal(g, w) {
			t.Fatalf("parameter %d (%s) differs from a fresh instance's (%s)", i, got[i].Name, want[i].Name)
		}
	}

	x, err := dev.FromFloat32([]int{2, 16}, make16x2())
	if err != nil {
		t.Fatal(err)
	}
	run := func(inst *sandbox.Instance) []float32 {
		outs, err := inst.Forward(ctx, []*gpuhost.Tensor{x}, nil)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := dev.Float32s(outs[0])
		return v
	}
	refA, refB := run(soloA), run(soloB)
	if slices.Equal(refA, refB) {
		t.Fatal("two experts compute the same outputs; the test cannot tell them apart")
	}
	for range 2 { // and back again
		for _, c := range []struct {
			ps   *sandbox.ParamStore
			want []float32
		}{{psB, refB}, {psA, refA}} {
			if err := shared.Bind(c.ps); err != nil {
				t.Fatal(err)
			}
			if got := run(shared); !slices.Equal(got, c.want) {
				t.Fatalf("the shared instance bound to another expert computes %v, its own instance %v", got[:4], c.want[:4])
			}
		}
	}

	// A store of another layout is refused.
	if err := shared.Bind(sandbox.NewParamStore(dev, nil, 0)); !errors.Is(err, sandbox.ErrInvalidInput) {
		t.Errorf("binding an empty store: %v", err)
	}
}

func make16x2() []float32 {
	v := make([]float32, 32)
	for i := range v {
		v[i] = float32(i%7) - 3
	}
	return v
}
