package host

import (
	"context"
	"flag"
	"math/rand/v2"
	"testing"
	"time"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/internal/benchenv"
)

// The device benchmark's settings; the device check
// (scripts/device-check.sh) runs it on a GPU at hidden 1024, batch 4096.
var (
	benchDevice = flag.String("bench.device", "cpu", "BenchmarkDeviceFFN's device (WithDevice): cpu, or cuda:N in a binary built with the cuda or cudaemu tag")
	benchHidden = flag.Int("bench.hidden", 1024, "BenchmarkDeviceFFN's ffn hidden_dim")
	benchBatch  = flag.Int("bench.batch", 256, "BenchmarkDeviceFFN's rows per call, and the server's --max-batch-size (the device check uses 4096)")
)

// BenchmarkDeviceFFN serves hivemind's ffn on -bench.device and calls it
// in-process (Server.Forward and Server.Backward: pools, batching, the
// sandbox and the device, without the wire), one call of -bench.batch
// rows at a time, on inputs that already live on the device.
//
// "forward" is a Forward; "train" is a Backward: hivemind's stateless
// recompute (a forward with the tape on), the tape's backward to the
// input and parameter gradients, and an Adam step. Each reports samples/s
// and the TFLOP/s of its GEMMs (forward 16·B·h², train 48·B·h²: two
// h×4h GEMMs forward, twice that backward). The clock stops after the
// last call's output is read back, so that work a GPU queued is counted.
func BenchmarkDeviceFFN(b *testing.B) {
	h, rows := *benchHidden, *benchBatch
	srv := startTestServer(b,
		WithDevice(*benchDevice),
		// The device check points the binary to cuBLAS through the
		// environment; the host reads none.
		WithDeviceOptions(gpuhost.WithCUBLAS(benchenv.CUBLASPaths()...)),
		WithExperts(ExpertConfig{UID: "ffn.bench", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": int64(h)}}),
		WithOptimizer(OptimizerConfig{Name: "adam"}),
		WithBatching(BatchLimits{MaxBatchSize: rows, QueueSize: 4}),
		WithGuestLimits(GuestLimits{BytesPerCall: 64 << 30, CallTimeout: 10 * time.Minute}),
	)
	dev := srv.Device()
	rng := rand.New(rand.NewPCG(7, 8))
	vec := func() []float32 {
		v := make([]float32, rows*h)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	x, err := dev.FromFloat32([]int{rows, h}, vec())
	if err != nil {
		b.Fatal(err)
	}
	gy, err := dev.FromFloat32([]int{rows, h}, vec())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	gemmFlops := 2 * 2 * float64(rows) * float64(h) * float64(4*h) // two GEMMs of B×h by h×4h
	for _, bb := range []struct {
		name  string
		flops float64
		call  func() ([]*gpuhost.Tensor, error)
	}{
		{"forward", gemmFlops, func() ([]*gpuhost.Tensor, error) {
			return srv.Forward(ctx, "ffn.bench", []*gpuhost.Tensor{x})
		}},
		{"train", 3 * gemmFlops, func() ([]*gpuhost.Tensor, error) {
			return srv.Backward(ctx, "ffn.bench", []*gpuhost.Tensor{x}, []*gpuhost.Tensor{gy})
		}},
	} {
		b.Run(bb.name, func(b *testing.B) {
			// One call first: the instance's first batch at this size
			// allocates, and a GPU's kernels load.
			outs, err := bb.call()
			if err != nil {
				b.Fatal(err)
			}
			dev.Release(outs...)
			var last []*gpuhost.Tensor
			b.ResetTimer()
			for range b.N {
				dev.Release(last...)
				if last, err = bb.call(); err != nil {
					b.Fatal(err)
				}
			}
			// Wait for the device: reading the output back waits for
			// every kernel queued before it.
			if _, err := dev.Float32s(last[0]); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			el := b.Elapsed().Seconds()
			dev.Release(last...)
			b.ReportMetric(float64(b.N*rows)/el, "samples/s")
			b.ReportMetric(bb.flops*float64(b.N)/el/1e12, "TFLOP/s")
		})
	}
}
