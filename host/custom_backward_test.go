package host

import (
	"context"
	_ "embed"
	"net/http"
	"slices"
	"testing"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// customBackwardWasm computes y = x·w with its own moe_backward.
//
// Rebuild: wat2wasm testdata/custom_backward.wat -o testdata/custom_backward.wasm
//
//go:embed testdata/custom_backward.wasm
var customBackwardWasm []byte

func TestCustomBackwardReplacesTape(t *testing.T) {
	srv := startTestServer(t,
		WithOptimizer(OptimizerConfig{Name: "sgd", LR: 1}),
		WithExperts(ExpertConfig{UID: "custom.0", Module: ModuleBytes(customBackwardWasm)}))
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+srv.Addr())
	ctx := context.Background()
	x := []float64{1, 2, 3, 4}
	gy := []float64{0.5, -1, 2, 0.25}
	res, err := c.Backward(ctx, connect.NewRequest(&moehostv1.BackwardRequest{
		Uid:         "custom.0",
		Inputs:      []*moehostv1.Tensor{tensor([]int64{2, 2}, x)},
		GradOutputs: []*moehostv1.Tensor{tensor([]int64{2, 2}, gy)},
	}))
	if err != nil {
		t.Fatal(err)
	}
	// The module's rule (grad_y·w + 1 with w = 1), not autograd's (grad_y).
	if got, want := floats(t, res.Msg.GetGradInputs()[0]), []float32{1.5, 0, 3, 1.25}; !slices.Equal(got, want) {
		t.Errorf("grad x %v, want the custom rule's %v", got, want)
	}
	// One SGD step with the module's grad_w = Σ grad_y·x = [0.5+6, -2+1].
	fwd, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{
		Uid: "custom.0", Inputs: []*moehostv1.Tensor{tensor([]int64{1, 2}, []float64{1, 1})},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := floats(t, fwd.Msg.GetOutputs()[0]), []float32{1 - 6.5, 1 + 1}; !slices.Equal(got, want) {
		t.Errorf("w after one step %v, want %v", got, want)
	}
}

// TestGoCustomBackward runs a Go expert whose Backward (a straight-through
// relu) replaces the tape, through the SDK's custombackward package.
func TestGoCustomBackward(t *testing.T) {
	const h = 4
	srv := startTestServer(t,
		WithOptimizer(OptimizerConfig{Name: "sgd", LR: 1}),
		WithExperts(ExpertConfig{UID: "ste.0", Module: ModuleBytes(wasmexperts.STEReLU), Config: map[string]int64{"hidden_dim": h}}))
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+srv.Addr())
	ctx := context.Background()
	x := []float64{-1, 2, -3, 4, 5, -6, 7, -8}
	gy := []float64{1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5}
	res, err := c.Backward(ctx, connect.NewRequest(&moehostv1.BackwardRequest{
		Uid:         "ste.0",
		Inputs:      []*moehostv1.Tensor{tensor([]int64{2, h}, x)},
		GradOutputs: []*moehostv1.Tensor{tensor([]int64{2, h}, gy)},
	}))
	if err != nil {
		t.Fatal(err)
	}
	// Straight through: grad_x = grad_y·s with s = 1, even where x < 0
	// (autograd would give 0 there).
	if got, want := floats(t, res.Msg.GetGradInputs()[0]), []float32{1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5}; !slices.Equal(got, want) {
		t.Errorf("grad x %v, want %v", got, want)
	}
	// s -= Σ_batch grad_y·relu(x) = [2.5, 2, 3.5, 4].
	fwd, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{
		Uid: "ste.0", Inputs: []*moehostv1.Tensor{tensor([]int64{1, h}, []float64{1, 1, 1, 1})},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := floats(t, fwd.Msg.GetOutputs()[0]), []float32{1 - 2.5, 1 - 2, 1 - 3.5, 1 - 4}; !slices.Equal(got, want) {
		t.Errorf("relu(1)·s after one step %v, want %v", got, want)
	}
}

// aliasBackwardWasm returns the output gradient as both the input's and
// the parameter's gradient.
//
// Rebuild: wat2wasm testdata/alias_backward.wat -o testdata/alias_backward.wasm
//
//go:embed testdata/alias_backward.wasm
var aliasBackwardWasm []byte

func TestCustomBackwardAliasedGradients(t *testing.T) {
	srv := startTestServer(t,
		WithOptimizer(OptimizerConfig{Name: "sgd", LR: 1}),
		WithExperts(ExpertConfig{UID: "alias.0", Module: ModuleBytes(aliasBackwardWasm)}))
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+srv.Addr())
	ctx := context.Background()
	for i := range 3 {
		gy := []float64{0.25 * float64(i+1), -1}
		res, err := c.Backward(ctx, connect.NewRequest(&moehostv1.BackwardRequest{
			Uid:         "alias.0",
			Inputs:      []*moehostv1.Tensor{tensor([]int64{1, 2}, []float64{3, 4})},
			GradOutputs: []*moehostv1.Tensor{tensor([]int64{1, 2}, gy)},
		}))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := floats(t, res.Msg.GetGradInputs()[0]), []float32{float32(gy[0]), float32(gy[1])}; !slices.Equal(got, want) {
			t.Fatalf("round %d: grad x %v, want the output gradient %v", i, got, want)
		}
	}
	// w = 1 - Σ rounds' gy = [1 - 1.5, 1 + 3].
	fwd, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{
		Uid: "alias.0", Inputs: []*moehostv1.Tensor{tensor([]int64{1, 2}, []float64{1, 1})},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := floats(t, fwd.Msg.GetOutputs()[0]), []float32{-0.5, 4}; !slices.Equal(got, want) {
		t.Errorf("w after three steps %v, want %v", got, want)
	}
}
