package host

import (
	"context"
	"math/rand/v2"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/abi"
	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/gpuhost"
)

// BenchmarkForwardFFN measures Forward of ffn.0 (hidden 1024) at batch 64
// through the Connect protocol over loopback, one request at a time.
func BenchmarkForwardFFN(b *testing.B) {
	const batch = 64
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+testServer.Addr())
	x := tensor([]int64{batch, bigHidden}, randVec(rand.New(rand.NewPCG(5, 6)), batch*bigHidden))
	req := &moehostv1.ForwardRequest{Uid: "ffn.0", Inputs: []*moehostv1.Tensor{x}}
	ctx := context.Background()
	for b.Loop() {
		if _, err := c.Forward(ctx, connect.NewRequest(req)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "samples/s")
}

// BenchmarkExpertBatch runs ffn.0's batches in-process, without RPC or
// pools, and reports the bytes allocated per batch in the steady state.
func BenchmarkExpertBatch(b *testing.B) {
	const batch = 256
	e := testServer.expert("ffn.0")
	dev := e.Device()
	x, err := dev.FromFloat32([]int{batch, bigHidden}, make([]float32, batch*bigHidden))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("forward", func(b *testing.B) {
		// One batch first fills the device's pool.
		outs, err := e.ForwardBatch(ctx, []*gpuhost.Tensor{x})
		if err != nil {
			b.Fatal(err)
		}
		dev.Release(outs...)
		b.ReportAllocs()
		for b.Loop() {
			outs, err := e.ForwardBatch(ctx, []*gpuhost.Tensor{x})
			if err != nil {
				b.Fatal(err)
			}
			dev.Release(outs...)
		}
	})
	b.Run("backward", func(b *testing.B) {
		gy, err := dev.FromFloat32([]int{batch, bigHidden}, make([]float32, batch*bigHidden))
		if err != nil {
			b.Fatal(err)
		}
		grads, err := e.BackwardBatch(ctx, []*gpuhost.Tensor{x}, []*gpuhost.Tensor{gy})
		if err != nil {
			b.Fatal(err)
		}
		dev.Release(grads...)
		b.ReportAllocs()
		for b.Loop() {
			grads, err := e.BackwardBatch(ctx, []*gpuhost.Tensor{x}, []*gpuhost.Tensor{gy})
			if err != nil {
				b.Fatal(err)
			}
			dev.Release(grads...)
		}
	})
}

// BenchmarkWorstBatch measures the zoo's largest batches at the configs
// `moehost serve` deploys (hidden_dim 1024; the transformer at its
// defaults, seq_len 128 and 16 heads): a backward batch of max_batch_size
// (1024) rows of the ffn, and of 64 sequences of the transformer. The
// default CallTimeout is sized from it (RATIONALE).
func BenchmarkWorstBatch(b *testing.B) {
	tests := []struct {
		name   string
		module []byte
		config map[string]int64
		shapes [][]int
	}{
		{"ffn", wasmexperts.FFN, map[string]int64{"hidden_dim": 1024}, [][]int{{1024, 1024}}},
		{"transformer", wasmexperts.Transformer, map[string]int64{"hidden_dim": 1024}, [][]int{{64, 128, 1024}}},
	}
	for _, tt := range tests {
		b.Run(tt.name, func(b *testing.B) {
			srv := startTestServer(b, WithExperts(ExpertConfig{UID: "x.0", Module: ModuleBytes(tt.module), Config: tt.config}))
			e, dev := srv.expert("x.0"), srv.Device()
			var inputs []*gpuhost.Tensor
			schemaIn, schemaOut := e.Schema()
			for i, s := range schemaIn {
				shape := tt.shapes[0]
				if i > 0 { // the transformer's key padding mask
					shape = shape[:2]
				}
				x, err := dev.Zeros(abi.DType(s.GetDtype()), shape)
				if err != nil {
					b.Fatal(err)
				}
				inputs = append(inputs, x)
			}
			gy, err := dev.Zeros(abi.DType(schemaOut[0].GetDtype()), tt.shapes[0])
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				g, err := srv.Backward(context.Background(), "x.0", inputs, []*gpuhost.Tensor{gy})
				if err != nil {
					b.Fatal(err)
				}
				dev.Release(g...)
			}
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/batch")
		})
	}
}
