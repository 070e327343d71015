package host

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/internal/testing/ref"
)

// trapWasm is an identity expert that traps on a negative first element.
//
// Rebuild: wat2wasm testdata/trap.wat -o testdata/trap.wasm
//
//go:embed testdata/trap.wasm
var trapWasm []byte

const (
	bigHidden   = 1024 // ffn.0: the default expert
	smallHidden = 8    // small.0: small enough for finite differences
	testLR      = 1.0  // SGD, so a step moves params by exactly -grad
)

// testServer is shared by the tests in this file; they run one at a time
// because Backward trains the experts.
var testServer *Server

// testDataDir is the data dir of every server the tests start.
var testDataDir string

func TestMain(m *testing.M) {
	if dir := os.Getenv(memChildEnv); dir != "" {
		os.Exit(runMemoryChild(dir)) // TestMemoryLimitFlood's server
	}
	dir, err := os.MkdirTemp("", "moehost-test-")
	if err != nil {
		panic(err)
	}
	testDataDir = dir
	if os.Getenv(CompileCacheEnv) == "" {
		// Every server of the run shares one compilation cache, as under
		// make test, so that each does not compile the modules again.
		os.Setenv(CompileCacheEnv, filepath.Join(dir, "cache", "wazero"))
	}
	srv, err := New(
		WithListen("127.0.0.1:*"),
		WithDataDir(dir),
		WithOptimizer(OptimizerConfig{Name: "sgd", LR: testLR}),
		WithExperts(
			ExpertConfig{UID: "ffn.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": bigHidden}},
			ExpertConfig{UID: "small.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": smallHidden}},
			ExpertConfig{UID: "trap.0", Module: ModuleBytes(trapWasm)},
		),
	)
	if err == nil {
		// Generous: under -race on a loaded 2-core machine the ffn's
		// _initialize alone has taken over two minutes.
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		err = srv.Start(ctx)
		cancel()
	}
	if err != nil {
		panic(err)
	}
	testServer = srv
	code := m.Run()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := srv.Shutdown(ctx); err != nil {
		panic(err)
	}
	cancel()
	os.RemoveAll(dir)
	// Every server the tests started is down: no goroutine may be left.
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// caller is one client protocol.
type caller struct {
	name     string
	forward  func(context.Context, *moehostv1.ForwardRequest) (*moehostv1.ForwardResponse, error)
	backward func(context.Context, *moehostv1.BackwardRequest) (*moehostv1.BackwardResponse, error)
	info     func(context.Context, *moehostv1.InfoRequest) (*moehostv1.ExpertInfo, error)
}

// callers returns a grpc-go client (gRPC), and connect-go clients speaking
// Connect and gRPC-Web, all over real loopback HTTP.
func callers(t testing.TB) []caller {
	t.Helper()
	addr := testServer.Addr()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cs := []caller{{
		name: "grpc-go",
		forward: func(ctx context.Context, req *moehostv1.ForwardRequest) (*moehostv1.ForwardResponse, error) {
			res := new(moehostv1.ForwardResponse)
			return res, conn.Invoke(ctx, moehostv1connect.ExpertServiceForwardProcedure, req, res)
		},
		backward: func(ctx context.Context, req *moehostv1.BackwardRequest) (*moehostv1.BackwardResponse, error) {
			res := new(moehostv1.BackwardResponse)
			return res, conn.Invoke(ctx, moehostv1connect.ExpertServiceBackwardProcedure, req, res)
		},
		info: func(ctx context.Context, req *moehostv1.InfoRequest) (*moehostv1.ExpertInfo, error) {
			res := new(moehostv1.ExpertInfo)
			return res, conn.Invoke(ctx, moehostv1connect.ExpertServiceInfoProcedure, req, res)
		},
	}}
	for _, p := range []struct {
		name string
		opts []connect.ClientOption
	}{
		{"connect-go/connect", nil},
		{"connect-go/grpc-web", []connect.ClientOption{connect.WithGRPCWeb()}},
	} {
		c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+addr, p.opts...)
		cs = append(cs, caller{
			name: p.name,
			forward: func(ctx context.Context, req *moehostv1.ForwardRequest) (*moehostv1.ForwardResponse, error) {
				res, err := c.Forward(ctx, connect.NewRequest(req))
				return msgOf(res), err
			},
			backward: func(ctx context.Context, req *moehostv1.BackwardRequest) (*moehostv1.BackwardResponse, error) {
				res, err := c.Backward(ctx, connect.NewRequest(req))
				return msgOf(res), err
			},
			info: func(ctx context.Context, req *moehostv1.InfoRequest) (*moehostv1.ExpertInfo, error) {
				res, err := c.Info(ctx, connect.NewRequest(req))
				return msgOf(res), err
			},
		})
	}
	return cs
}

func msgOf[T any](res *connect.Response[T]) *T {
	if res == nil {
		return nil
	}
	return res.Msg
}

// codeOf returns the status code of an error from either client library.
func codeOf(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	if s, ok := status.FromError(err); ok {
		return connect.Code(s.Code())
	}
	return connect.CodeUnknown
}

func messageOf(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}

func randVec(rng *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = rng.NormFloat64()
	}
	return v
}

func tensor(shape []int64, v []float64) *moehostv1.Tensor {
	data := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(x)))
	}
	return &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: shape, Data: data}
}

func floats(t testing.TB, pb *moehostv1.Tensor) []float32 {
	t.Helper()
	if pb.GetDtype() != moehostv1.DType_DTYPE_FLOAT32 {
		t.Fatalf("dtype %v, want float32", pb.GetDtype())
	}
	out := make([]float32, len(pb.GetData())/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(pb.GetData()[4*i:]))
	}
	return out
}

// reference copies an expert's current parameters into a float64 ffn.
func reference(t testing.TB, uid string, h int) *ffnRef {
	t.Helper()
	e := testServer.expert(uid)
	ps := e.Params()
	if len(ps) != 6 {
		t.Fatalf("%s has %d params, want 6", uid, len(ps))
	}
	vals := make([][]float64, len(ps))
	for i, p := range ps {
		f32, err := e.Device().Float32s(p.Tensor)
		if err != nil {
			t.Fatal(err)
		}
		vals[i] = make([]float64, len(f32))
		for j, x := range f32 {
			vals[i][j] = float64(x)
		}
	}
	return &ffnRef{h: h, w1: vals[0], b1: vals[1], w2: vals[2], b2: vals[3], lnW: vals[4], lnB: vals[5], eps: 1e-12}
}

func TestFFNForwardMatchesReference(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	const batch = 3
	for _, c := range callers(t) {
		t.Run(c.name, func(t *testing.T) {
			model := reference(t, "ffn.0", bigHidden)
			x := randVec(rng, batch*bigHidden)
			res, err := c.forward(ctx, &moehostv1.ForwardRequest{Uid: "ffn.0", Inputs: []*moehostv1.Tensor{tensor([]int64{batch, bigHidden}, x)}})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.GetOutputs()) != 1 {
				t.Fatalf("got %d outputs, want 1", len(res.GetOutputs()))
			}
			out := res.GetOutputs()[0]
			if got := out.GetShape(); len(got) != 2 || got[0] != batch || got[1] != bigHidden {
				t.Fatalf("output shape %v, want [%d %d]", got, batch, bigHidden)
			}
			if e := ref.RelErr(floats(t, out), model.forward(x)); e > 1e-4 {
				t.Errorf("relative error %.3g > 1e-4", e)
			} else {
				t.Logf("relative error %.3g", e)
			}
		})
	}
}

func TestFFNBackwardMatchesFiniteDifferences(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	const batch, h = 3, smallHidden
	for _, c := range callers(t) {
		t.Run(c.name, func(t *testing.T) {
			model := reference(t, "small.0", h)
			before := model.params()
			x, r := randVec(rng, batch*h), randVec(rng, batch*h)
			loss := func() float64 { return ref.Dot(model.forward(x), r) }
			res, err := c.backward(ctx, &moehostv1.BackwardRequest{
				Uid:         "small.0",
				Inputs:      []*moehostv1.Tensor{tensor([]int64{batch, h}, x)},
				GradOutputs: []*moehostv1.Tensor{tensor([]int64{batch, h}, r)},
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.GetGradInputs()) != 1 {
				t.Fatalf("got %d grad_inputs, want 1", len(res.GetGradInputs()))
			}
			if e := ref.RelErr(floats(t, res.GetGradInputs()[0]), finiteDiff(x, loss)); e > 1e-3 {
				t.Errorf("grad x: relative error %.3g > 1e-3", e)
			}
			// SGD with lr 1 moved every parameter by exactly -grad, so
			// before - after is the parameter gradient the host used.
			after := reference(t, "small.0", h).params()
			names := []string{"ffn.weight", "ffn.bias", "ffn_output.weight", "ffn_output.bias", "layer_norm.weight", "layer_norm.bias"}
			for i, p := range before {
				want := finiteDiff(p, loss)
				got := make([]float32, len(p))
				for j := range p {
					got[j] = float32((p[j] - after[i][j]) / testLR)
				}
				if e := ref.RelErr(got, want); e > 1e-3 {
					t.Errorf("grad %s: relative error %.3g > 1e-3", names[i], e)
				}
			}
		})
	}
}

func TestBadInputGetsPreciseError(t *testing.T) {
	ctx := context.Background()
	const h = smallHidden
	good := func() []*moehostv1.Tensor { return []*moehostv1.Tensor{tensor([]int64{2, h}, make([]float64, 2*h))} }
	schema := "x:float32[-1,8]"
	tests := []struct {
		name   string
		uid    string
		inputs []*moehostv1.Tensor
		code   connect.Code
		msg    string // a substring of the message
	}{
		{"unknown uid", "nope.7", good(), connect.CodeNotFound, `no expert "nope.7" on this server; it serves "ffn.0", "small.0", "trap.0"; ListExperts describes them all`},
		{"no inputs", "small.0", nil, connect.CodeInvalidArgument, schema},
		{"two inputs", "small.0", append(good(), good()...), connect.CodeInvalidArgument, schema},
		{"wrong rank", "small.0", []*moehostv1.Tensor{tensor([]int64{2 * h}, make([]float64, 2*h))}, connect.CodeInvalidArgument, schema},
		{"wrong shape", "small.0", []*moehostv1.Tensor{tensor([]int64{2, h + 1}, make([]float64, 2*(h+1)))}, connect.CodeInvalidArgument, schema},
		{"wrong dtype", "small.0", []*moehostv1.Tensor{{Dtype: moehostv1.DType_DTYPE_INT32, Shape: []int64{2, h}, Data: make([]byte, 4*2*h)}}, connect.CodeInvalidArgument, schema},
		{"short data", "small.0", []*moehostv1.Tensor{{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{2, h}, Data: make([]byte, 4*2*h-1)}}, connect.CodeInvalidArgument, schema},
		{"long data", "small.0", []*moehostv1.Tensor{{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{2, h}, Data: make([]byte, 4*2*h+4)}}, connect.CodeInvalidArgument, schema},
		{"empty batch", "small.0", []*moehostv1.Tensor{tensor([]int64{0, h}, nil)}, connect.CodeInvalidArgument, "at least one example"},
		{"negative batch", "small.0", []*moehostv1.Tensor{tensor([]int64{-2, h}, nil)}, connect.CodeInvalidArgument, schema},
		{"huge shape", "small.0", []*moehostv1.Tensor{tensor([]int64{1 << 40, h}, nil)}, connect.CodeInvalidArgument, "too large"},
		{"guest trap", "trap.0", []*moehostv1.Tensor{tensor([]int64{1, 4}, []float64{-1, 0, 0, 0})}, connect.CodeFailedPrecondition, "unreachable"},
	}
	for _, c := range callers(t) {
		for _, tt := range tests {
			t.Run(c.name+"/"+tt.name, func(t *testing.T) {
				_, err := c.forward(ctx, &moehostv1.ForwardRequest{Uid: tt.uid, Inputs: tt.inputs})
				if got := codeOf(err); got != tt.code {
					t.Fatalf("code %v (%v), want %v", got, err, tt.code)
				}
				if !strings.Contains(messageOf(err), tt.msg) {
					t.Errorf("message %q does not contain %q", messageOf(err), tt.msg)
				}
				// The code is the code's job: the message does not say it
				// again ("invalid argument: ...").
				if spoken := strings.ReplaceAll(tt.code.String(), "_", " "); strings.Contains(messageOf(err), spoken) {
					t.Errorf("message %q repeats the code %q", messageOf(err), spoken)
				}
				t.Logf("%v: %s", codeOf(err), messageOf(err))
				// The server is still up, and the same expert still works.
				valid := good()
				if tt.uid == "trap.0" {
					valid = []*moehostv1.Tensor{tensor([]int64{1, 4}, []float64{1, 2, 3, 4})}
				}
				uid := tt.uid
				if tt.code == connect.CodeNotFound {
					uid = "small.0"
				}
				if _, err := c.forward(ctx, &moehostv1.ForwardRequest{Uid: uid, Inputs: valid}); err != nil {
					t.Fatalf("valid request after the bad one: %v", err)
				}
			})
		}
	}
}

func TestBackwardBadGradOutputs(t *testing.T) {
	ctx := context.Background()
	const h = smallHidden
	x := tensor([]int64{2, h}, make([]float64, 2*h))
	for _, c := range callers(t) {
		for _, tt := range []struct {
			name  string
			grads []*moehostv1.Tensor
		}{
			{"missing", nil},
			{"other batch", []*moehostv1.Tensor{tensor([]int64{3, h}, make([]float64, 3*h))}},
			{"other width", []*moehostv1.Tensor{tensor([]int64{2, h + 1}, make([]float64, 2*(h+1)))}},
		} {
			t.Run(c.name+"/"+tt.name, func(t *testing.T) {
				_, err := c.backward(ctx, &moehostv1.BackwardRequest{Uid: "small.0", Inputs: []*moehostv1.Tensor{x}, GradOutputs: tt.grads})
				if codeOf(err) != connect.CodeInvalidArgument || !strings.Contains(messageOf(err), "y:float32[-1,8]") {
					t.Fatalf("got %v, want InvalidArgument naming y:float32[-1,8]", err)
				}
			})
		}
	}
}

func TestInfo(t *testing.T) {
	ctx := context.Background()
	sum := sha256.Sum256(wasmexperts.FFN)
	for _, c := range callers(t) {
		t.Run(c.name, func(t *testing.T) {
			before, err := c.info(ctx, &moehostv1.InfoRequest{Uid: "ffn.0"})
			if err != nil {
				t.Fatal(err)
			}
			x := tensor([]int64{2, bigHidden}, make([]float64, 2*bigHidden))
			if _, err := c.forward(ctx, &moehostv1.ForwardRequest{Uid: "ffn.0", Inputs: []*moehostv1.Tensor{x}}); err != nil {
				t.Fatal(err)
			}
			info, err := c.info(ctx, &moehostv1.InfoRequest{Uid: "ffn.0"})
			if err != nil {
				t.Fatal(err)
			}
			h := int64(bigHidden)
			checks := []struct {
				name      string
				got, want any
			}{
				{"uid", info.GetUid(), "ffn.0"},
				{"digest", info.GetModuleDigest(), "sha256:" + hex.EncodeToString(sum[:])},
				{"abi", info.GetAbiVersion(), int32(1)},
				{"params", info.GetParameterCount(), h*4*h + 4*h + 4*h*h + h + 2*h},
				{"inputs", len(info.GetInputs()), 1},
				{"outputs", len(info.GetOutputs()), 1},
				{"input", info.GetInputs()[0].GetName() + fmt.Sprint(info.GetInputs()[0].GetShape()), "x[-1 1024]"},
				{"output", info.GetOutputs()[0].GetName() + fmt.Sprint(info.GetOutputs()[0].GetShape()), "y[-1 1024]"},
				{"config", info.GetConfig()["hidden_dim"], h},
				{"healthy", info.GetHealthy(), true},
				{"forward batches", info.GetStats().GetForwardBatches() - before.GetStats().GetForwardBatches(), int64(1)},
				{"forward examples", info.GetStats().GetForwardExamples() - before.GetStats().GetForwardExamples(), int64(2)},
			}
			for _, ck := range checks {
				if ck.got != ck.want {
					t.Errorf("%s: got %v, want %v", ck.name, ck.got, ck.want)
				}
			}
		})
	}
	if _, err := callers(t)[0].info(ctx, &moehostv1.InfoRequest{Uid: "nope"}); codeOf(err) != connect.CodeNotFound {
		t.Errorf("Info of an unknown uid: %v, want NotFound", err)
	}
}

func TestListExperts(t *testing.T) {
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+testServer.Addr())
	res, err := c.ListExperts(context.Background(), connect.NewRequest(&moehostv1.ListExpertsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var uids []string
	for _, e := range res.Msg.GetExperts() {
		uids = append(uids, e.GetUid())
	}
	if got, want := strings.Join(uids, ","), "ffn.0,small.0,trap.0"; got != want {
		t.Errorf("experts %s, want %s", got, want)
	}
}
