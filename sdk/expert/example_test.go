package expert_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/expert"
)

// The SDK runs only inside a Wasm guest, so its example serves two experts
// written with it, examples/wasm-experts/nop (the identity) and
// examples/wasm-experts/ffn (hivemind's feed-forward block), in an
// in-process moehost server and calls them over Connect. The guest side of
// each is a short package main; ffn's Forward is
//
//	func (f *ffn) Forward(c *expert.Call) error {
//		x := c.Input(0)
//		h := expert.GeluTanh(f.ffn.Forward(x))
//		return c.SetOutput(0, f.norm.Forward(expert.Add(x, f.ffnOutput.Forward(h))))
//	}
func Example() {
	dir, err := os.MkdirTemp("", "moehost-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	srv, err := host.New(
		host.WithListen("127.0.0.1:*"),
		host.WithDataDir(dir),
		host.WithLogger(slog.New(slog.DiscardHandler)),
		host.WithExperts(
			host.ExpertConfig{UID: "nop.0", Module: host.ModuleBytes(wasmexperts.Nop), Config: map[string]int64{"hidden_dim": 4}},
			host.ExpertConfig{UID: "ffn.0", Module: host.ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": 4}},
		),
	)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := srv.Start(ctx); err != nil {
		panic(err)
	}
	defer srv.Shutdown(ctx)
	hc := &http.Client{}
	defer hc.CloseIdleConnections()
	client := moehostv1connect.NewExpertServiceClient(hc, "http://"+srv.Addr())

	// A batch of two rows of hidden_dim 4.
	x := []float32{1, 2, 3, 4, -1, 0, 1, 2}
	for _, uid := range []string{"nop.0", "ffn.0"} {
		res, err := client.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{
			Uid:    uid,
			Inputs: []*moehostv1.Tensor{encode([]int64{2, 4}, x)},
		}))
		if err != nil {
			panic(err)
		}
		y := res.Msg.GetOutputs()[0]
		fmt.Printf("%s: %v%v\n", uid, y.GetDtype(), y.GetShape())
		v := decode(y)
		if uid == "nop.0" {
			fmt.Println("  y =", v)
			continue
		}
		// ffn ends in a LayerNorm with weight 1 and bias 0 (the initial
		// values), so each row has mean 0 and variance 1.
		for r := range 2 {
			row := v[4*r : 4*r+4]
			var mean, sq float64
			for _, a := range row {
				mean += float64(a) / 4
				sq += float64(a) * float64(a) / 4
			}
			fmt.Printf("  row %d: mean %.3f, variance %.3f\n", r, math.Abs(mean), sq-mean*mean)
		}
	}
	// Output:
	// nop.0: DTYPE_FLOAT32[2 4]
	//   y = [1 2 3 4 -1 0 1 2]
	// ffn.0: DTYPE_FLOAT32[2 4]
	//   row 0: mean 0.000, variance 1.000
	//   row 1: mean 0.000, variance 1.000
}

// encode makes a float32 wire tensor.
func encode(shape []int64, v []float32) *moehostv1.Tensor {
	data := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x))
	}
	return &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: shape, Data: data}
}

// decode reads a float32 wire tensor.
func decode(t *moehostv1.Tensor) []float32 {
	v := make([]float32, len(t.GetData())/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.GetData()[4*i:]))
	}
	return v
}

// Split cuts a tensor into sections along an axis; here the fused
// query-key-value projection of attention, [B, T, 3d], into q, k and v.
// (Compiled, not run: the SDK works only inside a guest.)
func ExampleSplit() {
	var c expert.Call
	const d = 64
	qkv := expert.Split(c.Input(0), -1, d, d, d)
	q, k, v := qkv[0], qkv[1], qkv[2]
	_ = expert.Attention(q, k, v, expert.Tensor{}, true, 0) // causal, no padding mask
}

// A self-attention layer with torch.nn.MultiheadAttention's parameters,
// declared in Init and applied in Forward with a key padding mask input.
// (Compiled, not run: the SDK works only inside a guest.)
func ExampleMultiheadAttentionLayer() {
	var (
		ic   expert.InitContext
		call expert.Call
	)
	attn := expert.NewMultiheadAttention(&ic, "self_attn", 1024, 16)
	if err := attn.Err(); err != nil {
		return
	}
	x, mask := call.Input(0), call.Input(1) // float32 [B,T,1024], bool [B,T]
	_ = call.SetOutput(0, attn.Forward(x, mask, false))
}
