package host

import (
	"context"
	"math/rand/v2"
	"net/http"
	"testing"

	"connectrpc.com/connect"

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
	e := testServer.experts["ffn.0"]
	dev := e.Device()
	x, err := dev.FromFloat32([]int{batch, bigHidden}, make([]float32, batch*bigHidden))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("forward", func(b *testing.B) {
		// One batch first fills the device's pool.
		outs, err := e.forward(ctx, []*gpuhost.Tensor{x})
		if err != nil {
			b.Fatal(err)
		}
		dev.Release(outs...)
		b.ReportAllocs()
		for b.Loop() {
			outs, err := e.forward(ctx, []*gpuhost.Tensor{x})
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
		grads, err := e.backward(ctx, []*gpuhost.Tensor{x}, []*gpuhost.Tensor{gy})
		if err != nil {
			b.Fatal(err)
		}
		dev.Release(grads...)
		b.ReportAllocs()
		for b.Loop() {
			grads, err := e.backward(ctx, []*gpuhost.Tensor{x}, []*gpuhost.Tensor{gy})
			if err != nil {
				b.Fatal(err)
			}
			dev.Release(grads...)
		}
	})
}
