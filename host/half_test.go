package host_test

import (
	"context"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/abi"
	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

// countingTransport counts the bytes of request and response bodies.
type countingTransport struct {
	next      http.RoundTripper
	sent, got atomic.Int64
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body = &countingBody{ReadCloser: req.Body, n: &c.sent}
	}
	res, err := c.next.RoundTrip(req)
	if err == nil {
		res.Body = &countingBody{ReadCloser: res.Body, n: &c.got}
	}
	return res, err
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// TestHalfWire sends float16 and bfloat16 tensors through sdk/client's
// WithWireDType, and checks that outputs and input gradients are within
// the format's precision of the float32 ones, and that the bytes on the
// wire are about halved.
func TestHalfWire(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const hidden, rows = 64, 16
	// SGD with a negligible rate: Backward still runs its optimizer step,
	// but the parameters stay put, so the float32 and half backward calls
	// see the same expert.
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()),
		host.WithOptimizer(host.OptimizerConfig{Name: "sgd", LR: 1e-30}),
		host.WithExperts(host.ExpertConfig{UID: "ffn.0", Module: host.ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": hidden}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)

	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, rows*hidden)
	g := make([]float32, rows*hidden)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
		g[i] = float32(rng.NormFloat64())
	}
	shape := []int64{rows, hidden}
	call := func(t *testing.T, wire abi.DType) (out, grad []float32, sent, got int64) {
		tr := &countingTransport{next: http2Transport()}
		c := client.New(srv.Addr(), client.WithWireDType(wire), client.WithHTTPClient(&http.Client{Transport: tr}))
		defer c.Close()
		e := c.Expert("ffn.0")
		outs, err := e.Forward(ctx, client.Float32(shape, x))
		if err != nil {
			t.Fatal(err)
		}
		grads, err := e.Backward(ctx, []client.Tensor{client.Float32(shape, x)}, []client.Tensor{client.Float32(shape, g)})
		if err != nil {
			t.Fatal(err)
		}
		out, err = outs[0].Float32s()
		if err != nil {
			t.Fatal(err)
		}
		grad, err = grads[0].Float32s()
		if err != nil {
			t.Fatal(err)
		}
		return out, grad, tr.sent.Load(), tr.got.Load()
	}
	out32, grad32, sent32, got32 := call(t, abi.DTypeFloat32)
	for _, tt := range []struct {
		dt  abi.DType
		eps float64 // unit roundoff of the format
	}{
		{abi.DTypeFloat16, 0x1p-11},
		{abi.DTypeBFloat16, 0x1p-8},
	} {
		t.Run(tt.dt.String(), func(t *testing.T) {
			out, grad, sent, got := call(t, tt.dt)
			// Rounding the input, and then the output, each move a value
			// by at most eps of itself; the layer norm and the two linear
			// layers add a few eps more. 4 eps of the tensor's scale
			// holds with room, and is far below what a wrong conversion
			// (a byte swapped, a dtype misread) would give.
			for _, c := range []struct {
				name      string
				got, want []float32
			}{{"output", out, out32}, {"grad input", grad, grad32}} {
				scale := 0.0
				for _, v := range c.want {
					scale = math.Max(scale, math.Abs(float64(v)))
				}
				worst := 0.0
				for i := range c.want {
					worst = math.Max(worst, math.Abs(float64(c.got[i]-c.want[i])))
				}
				t.Logf("%s: max error %.3g = %.2f eps of the scale %.3g", c.name, worst, worst/(tt.eps*scale), scale)
				if worst > 4*tt.eps*scale || math.IsNaN(worst) {
					t.Errorf("%s: max error %.3g > 4 eps (%.3g) of the scale %.3g", c.name, worst, tt.eps, scale)
				}
			}
			// Bodies carry the tensors plus a few bytes of framing.
			t.Logf("request bytes %d vs %d float32, response bytes %d vs %d", sent, sent32, got, got32)
			if r := float64(sent) / float64(sent32); r > 0.51 || r < 0.49 {
				t.Errorf("request bytes %d are %.3f of float32's %d, want about half", sent, r, sent32)
			}
			if r := float64(got) / float64(got32); r > 0.51 || r < 0.49 {
				t.Errorf("response bytes %d are %.3f of float32's %d, want about half", got, r, got32)
			}
		})
	}

	// The wire itself, without sdk/client: a half request gets a half
	// response of half the bytes, and a dtype that is no float gets
	// InvalidArgument.
	raw := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+srv.Addr())
	res, err := raw.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "ffn.0",
		Inputs:      []*moehostv1.Tensor{{Dtype: moehostv1.DType_DTYPE_BFLOAT16, Shape: shape, Data: make([]byte, 2*rows*hidden)}},
		OutputDtype: moehostv1.DType_DTYPE_FLOAT16}))
	if err != nil {
		t.Fatal(err)
	}
	if o := res.Msg.GetOutputs()[0]; o.GetDtype() != moehostv1.DType_DTYPE_FLOAT16 || len(o.GetData()) != 2*rows*hidden {
		t.Errorf("half request: output %v with %d bytes, want float16 with %d", o.GetDtype(), len(o.GetData()), 2*rows*hidden)
	}
	_, err = raw.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "ffn.0",
		Inputs:      []*moehostv1.Tensor{{Dtype: moehostv1.DType_DTYPE_FLOAT16, Shape: shape, Data: make([]byte, 2*rows*hidden)}},
		OutputDtype: moehostv1.DType_DTYPE_INT64}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("output_dtype int64: %v, want InvalidArgument", err)
	}
	_, err = raw.Backward(ctx, connect.NewRequest(&moehostv1.BackwardRequest{Uid: "ffn.0",
		Inputs:         []*moehostv1.Tensor{{Dtype: moehostv1.DType_DTYPE_FLOAT16, Shape: shape, Data: make([]byte, 2*rows*hidden)}},
		GradOutputs:    []*moehostv1.Tensor{{Dtype: moehostv1.DType_DTYPE_FLOAT16, Shape: shape, Data: make([]byte, 2*rows*hidden)}},
		GradInputDtype: moehostv1.DType_DTYPE_BOOL}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("grad_input_dtype bool: %v, want InvalidArgument", err)
	}
}

// http2Transport speaks HTTP/2 without TLS, as sdk/client's default does.
func http2Transport() *http.Transport {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Transport{Protocols: p}
}
