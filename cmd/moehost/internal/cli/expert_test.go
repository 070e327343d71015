package cli

import (
	"encoding/binary"
	"net/http"

	"bytes"
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host"
)

// TestExpertNewBuildForward walks an author's first steps: scaffold an
// expert, build it, and run a Forward through the sandbox; and shows what
// forgetting -buildmode=c-shared gives.
func TestExpertNewBuildForward(t *testing.T) {
	skipUnderRace(t)
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command:", err)
	}
	dir := filepath.Join(t.TempDir(), "lin")
	var stdout, stderr bytes.Buffer
	// No --sdk: the test runs inside the checkout, which is the default.
	if code := Main([]string{"expert", "new", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("expert new: exit %d: %s", code, stderr.String())
	}
	root, err := filepath.Abs(filepath.Join("..", "..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"module lin\n", "require github.com/moehost/moehost ", "replace github.com/moehost/moehost => " + root + "\n"} {
		if !strings.Contains(string(gomod), want) {
			t.Errorf("go.mod lacks %q:\n%s", want, gomod)
		}
	}
	if mk, err := os.ReadFile(filepath.Join(dir, "Makefile")); err != nil || !strings.Contains(string(mk), "\tGOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o lin.wasm .") {
		t.Errorf("Makefile lacks the build recipe: %s %v", mk, err)
	}

	stdout.Reset()
	if code := Main([]string{"expert", "build", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("expert build: exit %d: %s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	wasmPath := filepath.Join(dir, "lin.wasm")
	if lines[len(lines)-1] != wasmPath {
		t.Errorf("expert build printed %q, want %s last", stdout.String(), wasmPath)
	}
	wasm, err := os.ReadFile(wasmPath)
	if err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	// A Go-built module takes a 2-core machine tens of seconds to compile,
	// and make test runs the race tests beside this one: the compile may
	// take longer than the 2-minute default without anything being wrong.
	slowCompile := host.WithGuestLimits(host.GuestLimits{Module: host.ModuleLimits{CompileTimeout: 8 * time.Minute}})
	startWith := func(wasm []byte, config map[string]int64) (*host.Server, error) {
		srv, err := host.New(slowCompile, host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()), host.WithoutDHT(),
			host.WithCheckpoints(host.CheckpointConfig{Disabled: true}),
			host.WithExperts(host.ExpertConfig{UID: "lin.0", Module: host.ModuleBytes(wasm), Config: config}))
		if err != nil {
			return nil, err
		}
		if err := srv.Start(ctx); err != nil {
			return nil, err
		}
		t.Cleanup(func() { srv.Shutdown(ctx) })
		return srv, nil
	}
	start := func(wasm []byte) (*host.Server, error) { return startWith(wasm, map[string]int64{"hidden_dim": 3}) }
	// The scaffold has no silent default: without hidden_dim, or with it
	// misspelt, the expert does not start, and the error says why.
	if _, err := startWith(wasm, nil); err == nil || !strings.Contains(err.Error(), "hidden_dim is not set") {
		t.Errorf("the scaffold without hidden_dim: %v, want it refused", err)
	}
	if _, err := startWith(wasm, map[string]int64{"hiden_dim": 3}); err == nil || !strings.Contains(err.Error(), `"hiden_dim": the module's moe_init does not read it (it reads: hidden_dim)`) {
		t.Errorf("the scaffold with hiden_dim: %v, want the known keys named", err)
	}
	srv, err := start(wasm)
	if err != nil {
		t.Fatal(err)
	}
	dev := srv.Device()
	xs := []float32{1, -2, 0.5, 3, 0, -1}
	x, err := dev.FromFloat32([]int{2, 3}, xs)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := srv.Forward(ctx, "lin.0", []*gpuhost.Tensor{x})
	if err != nil {
		t.Fatal(err)
	}
	y, err := dev.Float32s(outs[0])
	if err != nil {
		t.Fatal(err)
	}
	// The parameters, as any caller on loopback reads them.
	cc := moehostv1connect.NewCheckpointServiceClient(http.DefaultClient, "http://"+srv.Addr())
	pr, err := cc.GetParameters(ctx, connect.NewRequest(&moehostv1.CheckpointServiceGetParametersRequest{Uid: "lin.0"}))
	if err != nil {
		t.Fatal(err)
	}
	ps := pr.Msg.GetParameters()
	if len(ps) != 2 || ps[0].GetName() != "linear.weight" || ps[1].GetName() != "linear.bias" {
		t.Fatalf("params %v, want linear.weight and linear.bias", ps)
	}
	w, b := float32s(ps[0].GetTensor().GetData()), float32s(ps[1].GetTensor().GetData())
	for r := range 2 {
		for o := range 3 {
			want := b[o]
			for i := range 3 {
				want += xs[r*3+i] * w[o*3+i]
			}
			if got := y[r*3+o]; math.Abs(float64(got-want)) > 1e-5 {
				t.Errorf("y[%d][%d] = %g, want %g", r, o, got, want)
			}
		}
	}

	// The same expert built without -buildmode=c-shared: the host names
	// the fix.
	build := exec.Command("go", "build", "-o", "command.wasm", ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building without -buildmode=c-shared: %v\n%s", err, out)
	}
	cmdWasm, err := os.ReadFile(filepath.Join(dir, "command.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = start(cmdWasm)
	if err == nil || !strings.Contains(err.Error(), "-buildmode=c-shared") || !strings.Contains(err.Error(), "_start") {
		t.Errorf("a module built without -buildmode=c-shared: %v, want the fix named", err)
	}
}

func TestExpertNewErrors(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	notCheckout := filepath.Join(tmp, "other")
	if err := os.MkdirAll(notCheckout, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(notCheckout, "go.mod"), []byte("module example.com/other\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"exists", []string{"expert", "new", notCheckout}, "already exists"},
		{"bad name", []string{"expert", "new", filepath.Join(tmp, "9lives")}, `expert name "9lives"`},
		{"sdk not moehost", []string{"expert", "new", filepath.Join(tmp, "x"), "--sdk", notCheckout}, "is module example.com/other, not github.com/moehost/moehost"},
		{"sdk missing", []string{"expert", "new", filepath.Join(tmp, "y"), "--sdk", filepath.Join(tmp, "nope")}, "no such file"},
		{"build without go.mod", []string{"expert", "build", tmp}, "go.mod"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := Main(tt.args, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("exit %d, stderr %q; want 1 and %q", code, stderr.String(), tt.want)
			}
		})
	}
}

// float32s decodes little-endian float32s.
func float32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}
