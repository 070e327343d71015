package sandbox_test

import (
	"context"
	"flag"
	"testing"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// zooCallBytes runs one forward of m with a tape (as a backward does) at
// batch rows and returns the host memory it charged.
func zooCallBytes(t *testing.T, m *sandbox.Module, config map[string]int64, rows int) int64 {
	t.Helper()
	ctx := context.Background()
	dev := gpuhost.NewCPU(0)
	inst, err := m.Instantiate(ctx, sandbox.Binding{Device: dev, Params: sandbox.NewParamStore(dev, []byte("zoo"), 0), Config: config})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	var ins []*gpuhost.Tensor
	for _, s := range inst.Inputs() {
		shape := []int{rows}
		for _, d := range s.Shape[1:] {
			shape = append(shape, int(d))
		}
		x, err := dev.Zeros(s.DType, shape)
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, x)
	}
	tape := gpuhost.NewTape()
	defer tape.Release(dev)
	if _, err := inst.Forward(ctx, ins, tape); err != nil {
		t.Fatal(err)
	}
	return inst.LastCall().Bytes
}

// zooBudget runs TestDefaultCallBudgetFitsZoo, which takes tens of
// seconds: make measure-budget.
var zooBudget = flag.Bool("zoobudget", false, "measure the zoo's per-call bytes against the default budget")

// TestDefaultCallBudgetFitsZoo measures what the zoo's experts charge per
// row at their default configs, with the tape on (a backward), and checks
// that the default per-call budget serves the batches RATIONALE.md names:
// a full default batch (1,024 rows) of ffn at hidden_dim 1024, and 16 rows
// of the transformer at its defaults.
func TestDefaultCallBudgetFitsZoo(t *testing.T) {
	if !*zooBudget {
		t.Skip("runs the zoo at full size; make measure-budget runs it")
	}
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(ctx, "", sandbox.Limits{BytesPerCall: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	budget := sandbox.Limits{}.WithDefaults().BytesPerCall
	tests := []struct {
		name   string
		module []byte
		config map[string]int64
		rows   int // the batch the default must serve
	}{
		{"ffn", wasmexperts.FFN, map[string]int64{"hidden_dim": 1024}, 1024},
		{"transformer", wasmexperts.Transformer, nil, 16},
		{"det_dropout", wasmexperts.DetDropout, map[string]int64{"hidden_dim": 1024}, 1024},
		{"nop", wasmexperts.Nop, map[string]int64{"hidden_dim": 1024}, 1024},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := rt.Compile(ctx, tt.module)
			if err != nil {
				t.Fatal(err)
			}
			one, two := zooCallBytes(t, m, tt.config, 1), zooCallBytes(t, m, tt.config, 2)
			perRow := two - one
			need := one + perRow*int64(tt.rows-1)
			t.Logf("%s: %d B fixed + %d B per row; %d rows need %d MiB of the %d MiB budget", tt.name, one-perRow, perRow, tt.rows, need>>20, budget>>20)
			if need > budget {
				t.Errorf("%d rows of %s need %d bytes; the default budget is %d", tt.rows, tt.name, need, budget)
			}
		})
	}
}
