//go:build cudaemu

package host

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/experts"
	"github.com/moehost/moehost/sdk/client"
)

// closeTo reports the first element of got that is not within tol of
// want (relative to max(1, |want|)), or "".
func closeTo(got, want []float32, tol float64) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d elements, want %d", len(got), len(want))
	}
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if d > tol*math.Max(1, math.Abs(float64(want[i]))) || math.IsNaN(float64(got[i])) {
			return fmt.Sprintf("element %d is %g, want %g", i, got[i], want[i])
		}
	}
	return ""
}

// TestServeOnEmulatedCUDA serves hivemind's ffn on the CUDA device (the
// emulator) and on the CPU, and calls both over gRPC (HTTP/2) through
// sdk/client: forward outputs and backward input gradients agree within
// float32 tolerance, and so do the forwards after each backward's Adam
// step, so the tape and the optimizer ran on the device too.
func TestServeOnEmulatedCUDA(t *testing.T) {
	ctx := context.Background()
	const h, rows = 16, 6
	cfg := map[string]int64{"hidden_dim": h}
	experts := WithExperts(ExpertConfig{UID: "ffn.0", Module: ModuleBytes(wasmexperts.FFN), Config: cfg})
	cpu := startTestServer(t, experts)
	gpu := startTestServer(t, experts, WithDevice("cuda:0"))
	if got := gpu.Device().Name(); got != "cuda:0" {
		t.Fatalf("the server's device is %q, want cuda:0", got)
	}
	if got := cpu.Device().Name(); got != "cpu" {
		t.Fatalf("the reference server's device is %q, want cpu", got)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	vec := func() []float32 {
		v := make([]float32, rows*h)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	call := func(srv *Server) *client.RemoteExpert {
		c := client.New(srv.Addr(), client.WithGRPC())
		t.Cleanup(func() { c.Close() })
		return c.Expert("ffn.0")
	}
	onCPU, onGPU := call(cpu), call(gpu)
	shape := []int64{rows, h}
	forward := func(e *client.RemoteExpert, x []float32) []float32 {
		t.Helper()
		out, err := e.Forward(ctx, client.Float32(shape, x))
		if err != nil {
			t.Fatal(err)
		}
		v, err := out[0].Float32s()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for step := range 3 {
		x, gy := vec(), vec()
		want, got := forward(onCPU, x), forward(onGPU, x)
		if msg := closeTo(got, want, 1e-4); msg != "" {
			t.Fatalf("step %d: forward on cuda:0: %s", step, msg)
		}
		grads := func(e *client.RemoteExpert) []float32 {
			t.Helper()
			g, err := e.Backward(ctx, []client.Tensor{client.Float32(shape, x)}, []client.Tensor{client.Float32(shape, gy)})
			if err != nil {
				t.Fatal(err)
			}
			v, err := g[0].Float32s()
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		if msg := closeTo(grads(onGPU), grads(onCPU), 1e-3); msg != "" {
			t.Fatalf("step %d: input gradient on cuda:0: %s", step, msg)
		}
	}
	// After three Adam steps the parameters moved (the output differs
	// from the first) and moved alike on both devices.
	x := vec()
	if msg := closeTo(forward(onGPU, x), forward(onCPU, x), 1e-3); msg != "" {
		t.Fatalf("forward after training: %s", msg)
	}
}

// TestExpertsRoundRobinOnTwoGPUs serves five experts on two emulated GPUs:
// they alternate between the devices in the order they are listed, each
// device's worker runs its own experts' batches (every expert answers as
// on the CPU), two experts of one module and config share an instance
// only on one device, and a deploy after an undeploy fills the device
// with fewer experts.
func TestExpertsRoundRobinOnTwoGPUs(t *testing.T) {
	ctx := context.Background()
	const h = 8
	cfg := map[string]int64{"hidden_dim": h}
	var ecs []ExpertConfig
	for i := range 8 {
		ecs = append(ecs, ExpertConfig{UID: fmt.Sprintf("ffn.%d", i), Module: ModuleBytes(wasmexperts.FFN), Config: cfg})
	}
	// The reference serves all eight from the start; srv the first five,
	// and the others are deployed below.
	ref := startTestServer(t, WithExperts(ecs...))
	ecs, later := ecs[:5], ecs[5:]
	srv := startTestServer(t, WithExperts(ecs...), WithDevice("cuda:0,1"), WithDeviceOptions(gpuhost.WithEmulatedGPUs(2, 0)))
	// Deployments go into the shared data dir's deployments file: take
	// them out before the server stops, so that no later server restores
	// them.
	t.Cleanup(func() {
		for _, ec := range later {
			_ = srv.Undeploy(ctx, ec.UID)
		}
	})
	if n := len(srv.MemoryStats()); n != 2 {
		t.Fatalf("MemoryStats lists %d devices, want 2", n)
	}
	on := func(uid string) string { return srv.expert(uid).Device().Name() }
	for i, ec := range ecs {
		if got, want := on(ec.UID), fmt.Sprintf("cuda:%d", i%2); got != want {
			t.Errorf("%s is on %s, want %s", ec.UID, got, want)
		}
	}
	a, b, c := srv.expert("ffn.0"), srv.expert("ffn.1"), srv.expert("ffn.2")
	if a.InstanceKey() != c.InstanceKey() {
		t.Error("ffn.0 and ffn.2 (both on cuda:0) do not share an instance")
	}
	if a.InstanceKey() == b.InstanceKey() {
		t.Error("ffn.0 (cuda:0) and ffn.1 (cuda:1) share an instance")
	}
	devs := srv.experts.Devices()
	for i, e := range []*experts.Expert{a, b} {
		if n := srv.experts.LaneIndex(e); n != i || devs[n] != e.Device() {
			t.Errorf("%s's lane (%d) is not its device's", e.UID(), n)
		}
	}
	if n := srv.experts.DistinctWorkers(); n != 2 {
		t.Errorf("the two GPUs have %d workers, want 2", n)
	}
	x := make([]float32, 3*h)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	cs, cr := client.New(srv.Addr(), client.WithGRPC()), client.New(ref.Addr(), client.WithGRPC())
	defer cs.Close()
	defer cr.Close()
	check := func(uid string) {
		t.Helper()
		got, err := cs.Expert(uid).Forward(ctx, client.Float32([]int64{3, h}, x))
		if err != nil {
			t.Fatalf("%s: %v", uid, err)
		}
		want, err := cr.Expert(uid).Forward(ctx, client.Float32([]int64{3, h}, x))
		if err != nil {
			t.Fatalf("%s on the CPU: %v", uid, err)
		}
		g, _ := got[0].Float32s()
		w, _ := want[0].Float32s()
		if msg := closeTo(g, w, 1e-4); msg != "" {
			t.Errorf("%s on %s: %s", uid, on(uid), msg)
		}
	}
	for _, ec := range ecs {
		check(ec.UID)
	}
	// cuda:0 has ffn.0, 2, 4 and cuda:1 ffn.1, 3. Take two off cuda:0:
	// the next deploy goes to cuda:0 (1 expert against 2), the one after
	// too (2 against 2: the first on a tie), and the third to cuda:1.
	for _, uid := range []string{"ffn.0", "ffn.2"} {
		if err := srv.Undeploy(ctx, uid); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []string{"cuda:0", "cuda:0", "cuda:1"} {
		ec := later[i]
		if err := srv.Deploy(ctx, ec); err != nil {
			t.Fatal(err)
		}
		if got := on(ec.UID); got != want {
			t.Errorf("deployed %s went to %s, want %s", ec.UID, got, want)
		}
		check(ec.UID)
	}
}
