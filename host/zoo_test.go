package host

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/abi"
	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host/internal/hivemind"
	"github.com/moehost/moehost/internal/testing/ref"
)

// Small configs of the zoo experts, so that finite differences over every
// parameter stay fast under -race.
const (
	zooHidden = 16 // hidden_dim of every zoo expert
	zooSeq    = 6  // transformer seq_len
	zooHeads  = 4  // transformer num_heads (head dim 4)
	zooBatch  = 3
	zooDelay  = 200 * time.Millisecond // nop_delay's delay_ms
)

// TestZoo checks hivemind's expert zoo (examples/wasm-experts: nop,
// nop_delay, det_dropout, transformer) through a real server over Connect: forward
// against a float64 reference written here, and backward (input gradients
// over the wire, parameter gradients as before − after an SGD step with
// lr 1) against central finite differences of that reference.
func TestZoo(t *testing.T) {
	tests := []struct {
		name   string
		module []byte
		config map[string]int64
		run    func(z *zoo, t *testing.T)
	}{
		{"nop", wasmexperts.Nop, map[string]int64{"hidden_dim": zooHidden}, (*zoo).nop},
		{"nop_delay", wasmexperts.NopDelay, map[string]int64{"hidden_dim": zooHidden, "delay_ms": zooDelay.Milliseconds()}, (*zoo).nopDelay},
		{"det_dropout", wasmexperts.DetDropout, map[string]int64{"hidden_dim": zooHidden}, (*zoo).detDropout},
		{"transformer", wasmexperts.Transformer, map[string]int64{"hidden_dim": zooHidden, "seq_len": zooSeq, "num_heads": zooHeads}, (*zoo).transformer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// One server per expert, so that the modules compile in
			// parallel (the slow part under -race).
			t.Parallel()
			srv := startTestServer(t,
				// Go guests start slowly under -race on a busy machine:
				// the zoo tests what they compute, not how fast.
				WithGuestLimits(GuestLimits{InitTimeout: 3 * time.Minute}),
				WithOptimizer(OptimizerConfig{Name: "sgd", LR: testLR}),
				WithExperts(ExpertConfig{UID: tt.name + ".0", Module: ModuleBytes(tt.module), Config: tt.config}),
			)
			hc := &http.Client{}
			t.Cleanup(hc.CloseIdleConnections)
			tt.run(&zoo{srv: srv, c: moehostv1connect.NewExpertServiceClient(hc, "http://"+srv.Addr())}, t)
		})
	}
}

// zoo is a client of one zoo expert's server.
type zoo struct {
	srv *Server
	c   moehostv1connect.ExpertServiceClient
}

// params returns the names and float64 copies of an expert's parameters,
// in declaration order.
func (z *zoo) params(t *testing.T, uid string) ([]string, [][]float64) {
	t.Helper()
	e := z.srv.expert(uid)
	ps := e.Params()
	names := make([]string, len(ps))
	vals := make([][]float64, len(ps))
	for i, p := range ps {
		f32, err := e.Device().Float32s(p.Tensor)
		if err != nil {
			t.Fatal(err)
		}
		names[i] = p.Name
		vals[i] = make([]float64, len(f32))
		for j, x := range f32 {
			vals[i][j] = float64(x)
		}
	}
	return names, vals
}

func (z *zoo) forward(t *testing.T, uid string, inputs ...*moehostv1.Tensor) *moehostv1.Tensor {
	t.Helper()
	res, err := z.c.Forward(context.Background(), connect.NewRequest(&moehostv1.ForwardRequest{Uid: uid, Inputs: inputs}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.Msg.GetOutputs()); n != 1 {
		t.Fatalf("%d outputs, want 1", n)
	}
	return res.Msg.GetOutputs()[0]
}

func (z *zoo) backward(t *testing.T, uid string, inputs []*moehostv1.Tensor, gy *moehostv1.Tensor) []*moehostv1.Tensor {
	t.Helper()
	res, err := z.c.Backward(context.Background(), connect.NewRequest(&moehostv1.BackwardRequest{
		Uid: uid, Inputs: inputs, GradOutputs: []*moehostv1.Tensor{gy},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(res.Msg.GetGradInputs()), len(inputs); got != want {
		t.Fatalf("%d grad_inputs, want %d", got, want)
	}
	return res.Msg.GetGradInputs()
}

// checkGrads runs one backward of loss = Σ y·r and compares the gradient
// of the float input x (input 0) and of every parameter with central
// finite differences of the reference, reloaded by forward from ps.
// It returns the wire gradients of all inputs.
func (z *zoo) checkGrads(t *testing.T, uid string, inputs []*moehostv1.Tensor, x []float64, r []float64, outShape []int64, forward func(ps [][]float64) []float64) []*moehostv1.Tensor {
	t.Helper()
	names, before := z.params(t, uid)
	loss := func() float64 { return ref.Dot(forward(before), r) }
	grads := z.backward(t, uid, inputs, tensor(outShape, r))
	check := func(what string, got []float32, want []float64) {
		t.Helper()
		e := ref.RelErr(got, want)
		if e > 1e-3 || math.IsNaN(e) {
			t.Errorf("grad %s: relative error %.3g > 1e-3", what, e)
		} else {
			t.Logf("grad %s: relative error %.3g", what, e)
		}
	}
	check("x", floats(t, grads[0]), finiteDiff(x, loss))
	_, after := z.params(t, uid)
	for i, p := range before {
		want := finiteDiff(p, loss)
		got := make([]float32, len(p))
		for j := range p {
			got[j] = float32((p[j] - after[i][j]) / testLR)
		}
		check(names[i], got, want)
	}
	return grads
}

func (z *zoo) nop(t *testing.T) {
	const uid, n, h = "nop.0", zooBatch, zooHidden
	rng := rand.New(rand.NewPCG(11, 12))
	x := tensor([]int64{n, h}, randVec(rng, n*h))
	y := z.forward(t, uid, x)
	if !bytes.Equal(y.GetData(), x.GetData()) || y.GetDtype() != x.GetDtype() || len(y.GetShape()) != 2 || y.GetShape()[0] != n || y.GetShape()[1] != h {
		t.Errorf("forward: got %v%v, want the input %v%v back unchanged", y.GetDtype(), y.GetShape(), x.GetDtype(), x.GetShape())
	}
	gy := tensor([]int64{n, h}, randVec(rng, n*h))
	gx := z.backward(t, uid, []*moehostv1.Tensor{x}, gy)[0]
	if !bytes.Equal(gx.GetData(), gy.GetData()) || gx.GetDtype() != gy.GetDtype() {
		t.Errorf("backward: grad x differs from grad y")
	}
	if _, ps := z.params(t, uid); len(ps) != 0 {
		t.Errorf("nop has %d params, want 0", len(ps))
	}
}

// nopDelay checks that nop_delay is the identity, forward and backward,
// and that each takes its delay, as hivemind's sleeps in every forward
// (a backward reruns it).
func (z *zoo) nopDelay(t *testing.T) {
	const uid, n, h = "nop_delay.0", zooBatch, zooHidden
	rng := rand.New(rand.NewPCG(17, 18))
	x := tensor([]int64{n, h}, randVec(rng, n*h))
	start := time.Now()
	y := z.forward(t, uid, x)
	fwd := time.Since(start)
	if !bytes.Equal(y.GetData(), x.GetData()) || !slices.Equal(y.GetShape(), x.GetShape()) {
		t.Errorf("forward: got %v%v, want the input back unchanged", y.GetDtype(), y.GetShape())
	}
	gy := tensor([]int64{n, h}, randVec(rng, n*h))
	start = time.Now()
	gx := z.backward(t, uid, []*moehostv1.Tensor{x}, gy)[0]
	bwd := time.Since(start)
	if !bytes.Equal(gx.GetData(), gy.GetData()) {
		t.Errorf("backward: grad x differs from grad y")
	}
	t.Logf("forward took %v, backward %v (delay %v)", fwd, bwd, zooDelay)
	for what, took := range map[string]time.Duration{"forward": fwd, "backward": bwd} {
		if took < zooDelay {
			t.Errorf("%s took %v, want at least %v", what, took, zooDelay)
		}
	}
}

func (z *zoo) detDropout(t *testing.T) {
	const uid, n, h = "det_dropout.0", zooBatch, zooHidden
	rng := rand.New(rand.NewPCG(13, 14))
	names, ps := z.params(t, uid)
	if want := []string{"linear_in.weight", "linear_in.bias", "linear_out.weight", "linear_out.bias"}; !slices.Equal(names, want) {
		t.Fatalf("params %v, want %v", names, want)
	}
	x := randVec(rng, n*h)
	// The mask is int64, as hivemind's server declares it (its sample
	// input is torch.randint): mostly 0 and 1, and, as torch's x·mask
	// takes any integer, one 3 and one −2.
	mask := make([]float64, n*h)
	for i := range mask {
		if rng.Float64() < 0.8 {
			mask[i] = 1
		}
	}
	mask[5], mask[n*h-1] = 3, -2
	shape := []int64{n, h}
	inputs := []*moehostv1.Tensor{tensor(shape, x), int64Tensor(shape, mask)}
	forward := func(ps [][]float64) []float64 { return detDropoutRef(h, x, mask, ps) }

	y := floats(t, z.forward(t, uid, inputs...))
	if e := ref.RelErr(y, forward(ps)); e > 1e-4 || math.IsNaN(e) {
		t.Errorf("forward: relative error %.3g > 1e-4", e)
	} else {
		t.Logf("forward: relative error %.3g", e)
	}

	grads := z.checkGrads(t, uid, inputs, x, randVec(rng, n*h), shape, forward)
	// Like hivemind's ModuleBackend, the mask (not floating point) gets
	// zeros of its own dtype.
	if g := grads[1]; g.GetDtype() != moehostv1.DType_DTYPE_INT64 || !slices.Equal(g.GetShape(), shape) || !bytes.Equal(g.GetData(), make([]byte, 8*n*h)) {
		t.Errorf("grad mask: %v%v with %d bytes, want int64 zeros of %v", g.GetDtype(), g.GetShape(), len(g.GetData()), shape)
	}

	// Admission: what does not fit the int64 mask is refused whole, on
	// both wires, with the input named.
	x32 := tensor(shape, x)
	z.refuses(t, uid, []*moehostv1.Tensor{x32, tensor(shape, mask)}, "input 1: dtype float32, want mask:int64[-1,16] with batch 3")
	short := int64Tensor(shape, mask)
	short.Data = short.Data[:4*n*h]
	z.refuses(t, uid, []*moehostv1.Tensor{x32, short}, "input 1: 192 data bytes for shape [3 16] of int64, want 384 bytes (mask:int64[-1,16])")
	z.refuses(t, uid, []*moehostv1.Tensor{x32, int64Tensor([]int64{n, h + 1}, make([]float64, n*(h+1)))}, "input 1: shape [3 17], want mask:int64[-1,16] with batch 3")
}

// int64Tensor is v as an int64 wire tensor.
func int64Tensor(shape []int64, v []float64) *moehostv1.Tensor {
	data := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(data[8*i:], uint64(int64(x)))
	}
	return &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_INT64, Shape: shape, Data: data}
}

// refuses checks that a forward with inputs is refused with
// InvalidArgument and a message ending in msg over Connect, and with
// hivemind's ErrInvalid and the same message on the hivemind room's
// path, before any batch runs.
func (z *zoo) refuses(t *testing.T, uid string, inputs []*moehostv1.Tensor, msg string) {
	t.Helper()
	before := z.srv.expert(uid).Info().GetForwardPool().GetBatches()
	_, err := z.c.Forward(context.Background(), connect.NewRequest(&moehostv1.ForwardRequest{Uid: uid, Inputs: inputs}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.HasSuffix(messageOf(err), msg) {
		t.Errorf("Connect: %v, want InvalidArgument ending in %q", err, msg)
	}
	hm := make([]hivemind.Tensor, len(inputs))
	for i, pb := range inputs {
		shape := make([]int, len(pb.GetShape()))
		for j, d := range pb.GetShape() {
			shape[j] = int(d)
		}
		hm[i] = hivemind.Tensor{DType: abi.DType(pb.GetDtype()), Shape: shape, Data: pb.GetData()}
	}
	_, err = hivemindExperts{z.srv.experts}.HivemindForward(context.Background(), uid, hm)
	if !errors.Is(err, hivemind.ErrInvalid) || !strings.HasSuffix(err.Error(), msg) {
		t.Errorf("hivemind: %v, want ErrInvalid ending in %q", err, msg)
	}
	if after := z.srv.expert(uid).Info().GetForwardPool().GetBatches(); after != before {
		t.Errorf("%d batches ran for refused requests", after-before)
	}
}

func (z *zoo) transformer(t *testing.T) {
	const uid, n, seq, h = "transformer.0", zooBatch, zooSeq, zooHidden
	rng := rand.New(rand.NewPCG(15, 16))
	names, _ := z.params(t, uid)
	want := []string{
		"self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
		"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
		"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("params %v, want %v", names, want)
	}

	x := randVec(rng, n*seq*h)
	// Batch element 0 pads its last two positions, 1 none, 2 its last.
	pad := make([]bool, n*seq)
	for b, k := range []int{2, 0, 1} {
		for j := seq - k; j < seq; j++ {
			pad[b*seq+j] = true
		}
	}
	padBytes := make([]byte, len(pad))
	for i, p := range pad {
		if p {
			padBytes[i] = 1
		}
	}
	shape := []int64{n, seq, h}
	inputs := []*moehostv1.Tensor{
		tensor(shape, x),
		{Dtype: moehostv1.DType_DTYPE_BOOL, Shape: []int64{n, seq}, Data: padBytes},
	}
	forward := func(ps [][]float64) []float64 { return transformerRef(n, seq, h, zooHeads, x, pad, ps) }

	// The LayerNorms start as the identity affine map and the biases at
	// zero. One training step on a small random gradient moves every
	// parameter, so that the checks below run at a general point.
	small := randVec(rng, n*seq*h)
	for i := range small {
		small[i] *= 0.05
	}
	z.backward(t, uid, inputs, tensor(shape, small))
	_, ps := z.params(t, uid)

	y := floats(t, z.forward(t, uid, inputs...))
	if e := ref.RelErr(y, forward(ps)); e > 1e-4 || math.IsNaN(e) {
		t.Errorf("forward: relative error %.3g > 1e-4", e)
	} else {
		t.Logf("forward: relative error %.3g", e)
	}
	// The mask matters: without it the outputs differ.
	if e := ref.RelErr(y, transformerRef(n, seq, h, zooHeads, x, make([]bool, n*seq), ps)); e < 1e-3 {
		t.Errorf("forward ignores the key padding mask (relative change %.3g)", e)
	}

	grads := z.checkGrads(t, uid, inputs, x, randVec(rng, n*seq*h), shape, forward)
	// The bool mask gets a gradient of its own dtype, all false.
	if g := grads[1]; g.GetDtype() != moehostv1.DType_DTYPE_BOOL || !bytes.Equal(g.GetData(), make([]byte, n*seq)) {
		t.Errorf("grad key_padding_mask: %v%v %v, want bool zeros", g.GetDtype(), g.GetShape(), g.GetData())
	}

	// Admission: a bool is 0 or 1, as torch.bool is; 2 is refused
	// (a device would read it as true), as are other dtypes and sizes.
	x32 := inputs[0]
	two := slices.Clone(padBytes)
	two[7] = 2
	z.refuses(t, uid, []*moehostv1.Tensor{x32, {Dtype: moehostv1.DType_DTYPE_BOOL, Shape: []int64{n, seq}, Data: two}},
		"input 1: bool element 7 is 2, want 0 or 1 (key_padding_mask:bool[-1,6])")
	z.refuses(t, uid, []*moehostv1.Tensor{x32, {Dtype: moehostv1.DType_DTYPE_BOOL, Shape: []int64{n, seq}, Data: padBytes[:n*seq-1]}},
		"input 1: 17 data bytes for shape [3 6] of bool, want 18 bytes (key_padding_mask:bool[-1,6])")
	z.refuses(t, uid, []*moehostv1.Tensor{x32, int64Tensor([]int64{n, seq}, make([]float64, n*seq))},
		"input 1: dtype int64, want key_padding_mask:bool[-1,6] with batch 3")
}

// detDropoutRef is hivemind's DeterministicDropoutNetwork in training
// mode: linear_out(relu(linear_in(x·mask/0.8))).
func detDropoutRef(h int, x, mask []float64, ps [][]float64) []float64 {
	d := make([]float64, len(x))
	for i := range x {
		d[i] = x[i] * mask[i] / 0.8
	}
	a := ref.Linear(d, ps[0], ps[1], h, 2*h)
	for i, v := range a {
		a[i] = math.Max(v, 0)
	}
	return ref.Linear(a, ps[2], ps[3], 2*h, h)
}

// transformerRef is torch.nn.TransformerEncoderLayer (post-norm, exact
// GELU, eval mode) on batch-first x [n, seq, h] with key padding mask pad
// [n, seq], with the params in state_dict order.
func transformerRef(n, seq, h, heads int, x []float64, pad []bool, ps [][]float64) []float64 {
	inW, inB, outW, outB := ps[0], ps[1], ps[2], ps[3]
	l1W, l1B, l2W, l2B := ps[4], ps[5], ps[6], ps[7]
	n1W, n1B, n2W, n2B := ps[8], ps[9], ps[10], ps[11]
	dh := h / heads
	qkv := ref.Linear(x, inW, inB, h, 3*h) // [n*seq, 3h]: q | k | v
	at := make([]float64, n*seq*h)         // heads concatenated, [n*seq, h]
	scores := make([]float64, seq)
	for b := 0; b < n; b++ {
		for hd := 0; hd < heads; hd++ {
			for i := 0; i < seq; i++ {
				q := qkv[(b*seq+i)*3*h+hd*dh:][:dh]
				mx := math.Inf(-1)
				for j := 0; j < seq; j++ {
					if pad[b*seq+j] {
						continue
					}
					k := qkv[(b*seq+j)*3*h+h+hd*dh:][:dh]
					scores[j] = ref.Dot(q, k) / math.Sqrt(float64(dh))
					mx = math.Max(mx, scores[j])
				}
				var sum float64
				for j := 0; j < seq; j++ {
					if !pad[b*seq+j] {
						scores[j] = math.Exp(scores[j] - mx)
						sum += scores[j]
					}
				}
				o := at[(b*seq+i)*h+hd*dh:][:dh]
				for j := 0; j < seq; j++ {
					if pad[b*seq+j] {
						continue
					}
					v := qkv[(b*seq+j)*3*h+2*h+hd*dh:][:dh]
					for d := range o {
						o[d] += scores[j] / sum * v[d]
					}
				}
			}
		}
	}
	sa := ref.Linear(at, outW, outB, h, h)
	for i := range sa {
		sa[i] += x[i]
	}
	a := ref.LayerNorm(sa, n1W, n1B, 1e-5)
	f := ref.Linear(a, l1W, l1B, h, 4*h)
	for i, v := range f {
		f[i] = 0.5 * v * (1 + math.Erf(v/math.Sqrt2))
	}
	f = ref.Linear(f, l2W, l2B, 4*h, h)
	for i := range f {
		f[i] += a[i]
	}
	return ref.LayerNorm(f, n2W, n2B, 1e-5)
}
