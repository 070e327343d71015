package compare

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
)

func benchInProc(b *testing.B, bwd bool) {
	ctx := context.Background()
	cfg := Config{Module: wasmexperts.FFN, Hidden: 1024, Batch: 256, Threads: 2, DataDir: b.TempDir()}
	p, err := newInProc(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer p.close(ctx)
	shape := []int{cfg.Batch, cfg.Hidden}
	for b.Loop() {
		if bwd {
			err = p.Backward(ctx, shape)
		} else {
			err = p.Forward(ctx, shape)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*cfg.Batch)/b.Elapsed().Seconds(), "samples/s")
}

func BenchmarkInProcForward(b *testing.B)  { benchInProc(b, false) }
func BenchmarkInProcBackward(b *testing.B) { benchInProc(b, true) }

func BenchmarkRPCForward(b *testing.B) {
	ctx := context.Background()
	cfg := Config{Module: wasmexperts.FFN, Hidden: 1024, Batch: 256, Threads: 2, DataDir: b.TempDir()}
	r, err := newRemote(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer r.close(ctx)
	for b.Loop() {
		if _, err := r.client.Forward(ctx, connect.NewRequest(r.fwd)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*cfg.Batch)/b.Elapsed().Seconds(), "samples/s")
}
