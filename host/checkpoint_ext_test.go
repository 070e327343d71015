package host_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/modules"
	"github.com/moehost/moehost/sdk/client"
)

// ckptServer starts a server with checkpoints in dir hosting uid from
// module with hidden_dim h.
func ckptServer(t *testing.T, dir string, wasm []byte, h int64, ck host.CheckpointConfig, extra ...host.Option) (*host.Server, error) {
	t.Helper()
	return ckptServerOf(t, dir, host.ModuleBytes(wasm), h, ck, extra...)
}

// ckptServerOf is ckptServer for any module source.
func ckptServerOf(t *testing.T, dir string, src host.ModuleSource, h int64, ck host.CheckpointConfig, extra ...host.Option) (*host.Server, error) {
	t.Helper()
	ck.Dir = dir
	opts := append([]host.Option{
		host.WithListen("127.0.0.1:*"),
		host.WithDataDir(t.TempDir()),
		host.WithOptimizer(host.OptimizerConfig{Name: "adam", LR: 0.01}),
		host.WithExperts(host.ExpertConfig{UID: "ffn.0", Module: src, Config: map[string]int64{"hidden_dim": h}}),
		host.WithCheckpoints(ck),
		host.WithUpdatePeriod(time.Hour),
	}, extra...)
	srv, err := host.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		return nil, err
	}
	return srv, nil
}

func train(t *testing.T, c *client.Client, h int, steps int, rng *rand.Rand) {
	t.Helper()
	for range steps {
		x := make([]float32, 2*h)
		g := make([]float32, 2*h)
		for i := range x {
			x[i], g[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
		if _, err := c.Expert("ffn.0").Backward(context.Background(), []client.Tensor{client.Float32([]int64{2, int64(h)}, x)}, []client.Tensor{client.Float32([]int64{2, int64(h)}, g)}); err != nil {
			t.Fatal(err)
		}
	}
}

func forward(t *testing.T, c *client.Client, h int) []float32 {
	t.Helper()
	x := make([]float32, h)
	for i := range x {
		x[i] = float32(i%5) - 2
	}
	out, err := c.Expert("ffn.0").Forward(context.Background(), client.Float32([]int64{1, int64(h)}, x))
	if err != nil {
		t.Fatal(err)
	}
	v, err := out[0].Float32s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestCheckpointRestoreResumes trains, shuts down (which saves), and
// checks that a new server restores the parameters, the counters and the
// optimizer state: 3 more steps after the restart land where 3 more steps
// without it do.
func TestCheckpointRestoreResumes(t *testing.T) {
	t.Parallel()
	const h = 8
	ctx := context.Background()
	dirA, dirB := t.TempDir(), t.TempDir()
	// A: 5 steps, restart, 3 steps. B: 8 steps in one run.
	a, err := ckptServer(t, dirA, wasmexperts.FFN, h, host.CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ca := client.New(a.Addr())
	defer ca.Close()
	train(t, ca, h, 5, rand.New(rand.NewPCG(1, 2)))
	before := forward(t, ca, h)
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dirA, "ffn.0", "*.safetensors"))
	if want := []string{"5.optim.safetensors", "5.safetensors"}; len(files) != 2 || filepath.Base(files[0]) != want[0] || filepath.Base(files[1]) != want[1] {
		t.Fatalf("after shutdown: %v, want %v", files, want)
	}
	a2, err := ckptServer(t, dirA, wasmexperts.FFN, h, host.CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Shutdown(ctx)
	ca2 := client.New(a2.Addr())
	defer ca2.Close()
	if after := forward(t, ca2, h); !slices.Equal(after, before) {
		t.Fatalf("restored forward %v, before the restart %v", after, before)
	}
	info, err := ca2.Expert("ffn.0").Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.GetStats().GetBackwardBatches(); got != 5 {
		t.Errorf("restored backward batches %d, want 5", got)
	}
	if got := info.GetStats().GetBackwardExamples(); got != 10 {
		t.Errorf("restored examples %d, want 10", got)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	b, err := ckptServer(t, dirB, wasmexperts.FFN, h, host.CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(ctx)
	cb := client.New(b.Addr())
	defer cb.Close()
	train(t, cb, h, 5, rng)
	train(t, cb, h, 3, rng)
	rngA := rand.New(rand.NewPCG(1, 2))
	for range 5 { // skip the 5 steps A took before the restart
		for range 4 * h {
			rngA.NormFloat64()
		}
	}
	train(t, ca2, h, 3, rngA)
	if fa, fb := forward(t, ca2, h), forward(t, cb, h); !slices.Equal(fa, fb) {
		t.Fatalf("resumed run %v, uninterrupted run %v", fa, fb)
	}
}

// TestCheckpointRefusals checks that a checkpoint of another module or of
// other shapes is refused, naming what differs, and that a corrupt newest
// checkpoint falls back to the one before with a warning.
func TestCheckpointRefusals(t *testing.T) {
	t.Parallel()
	const h = 8
	ctx := context.Background()
	dir := t.TempDir()
	srv, err := ckptServer(t, dir, wasmexperts.FFN, h, host.CheckpointConfig{Keep: -1})
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(srv.Addr())
	train(t, c, h, 2, rand.New(rand.NewPCG(3, 4)))
	want := forward(t, c, h)
	c.Close()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("digest", func(t *testing.T) {
		_, err := ckptServer(t, dir, wasmexperts.FFNC, h, host.CheckpointConfig{})
		if !errors.Is(err, host.ErrCheckpointMismatch) || !strings.Contains(err.Error(), "module sha256:") || !strings.Contains(err.Error(), "--allow-module-change") {
			t.Fatalf("start with another module: %v", err)
		}
	})
	t.Run("allow-module-change", func(t *testing.T) {
		srv, err := ckptServer(t, dir, wasmexperts.FFNC, h, host.CheckpointConfig{AllowModuleChange: true})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Shutdown(ctx)
		c := client.New(srv.Addr())
		defer c.Close()
		got := forward(t, c, h)
		for i := range want {
			if d := got[i] - want[i]; d > 1e-5 || d < -1e-5 {
				t.Fatalf("ffn-c with ffn's checkpoint: %v, want %v", got, want)
			}
		}
	})
	t.Run("twin", func(t *testing.T) {
		// The C build declares the Go build its twin: it restores the
		// checkpoint without --allow-module-change, and serves the same
		// bytes.
		src := host.ModuleBytes(wasmexperts.FFNC).RestoresCheckpointsOf(modules.Digest(wasmexperts.FFN))
		srv, err := ckptServerOf(t, dir, src, h, host.CheckpointConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Shutdown(ctx)
		c := client.New(srv.Addr())
		defer c.Close()
		if got := forward(t, c, h); !slices.Equal(got, want) {
			t.Fatalf("ffn-c restoring ffn's checkpoint: %v, want %v", got, want)
		}
	})
	t.Run("shape", func(t *testing.T) {
		_, err := ckptServer(t, dir, wasmexperts.FFN, 2*h, host.CheckpointConfig{})
		if !errors.Is(err, host.ErrCheckpointMismatch) || !strings.Contains(err.Error(), "[32 8] in the checkpoint but [64 16] in the module") {
			t.Fatalf("start with other shapes: %v", err)
		}
		// Only the ways out that work: --allow-module-change cannot
		// restore other shapes.
		for _, want := range []string{"--data-dir", "--no-checkpoints", "rm -r " + filepath.Join(dir, "ffn.0")} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("start with other shapes: %v, want %q named", err, want)
			}
		}
		if strings.Contains(err.Error(), "--allow-module-change") {
			t.Errorf("start with other shapes: %v offers --allow-module-change, which cannot help", err)
		}
	})
	t.Run("corrupt-newest-falls-back", func(t *testing.T) {
		// Step 2 is newest; truncate it. Step 1 does not exist (the
		// shutdown saved only step 2), so write one by copying step 2's
		// optimizer and parameters under a new store.
		d2 := t.TempDir()
		st, _ := checkpoint.Open(d2, -1)
		good, err := checkpoint.Open(dir, -1)
		if err != nil {
			t.Fatal(err)
		}
		ck, err := good.Load("ffn.0", 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Save(ck); err != nil {
			t.Fatal(err)
		}
		ck.Step = 3
		ck.Params[0].Data[0] += 1
		if err := st.Save(ck); err != nil {
			t.Fatal(err)
		}
		p3 := filepath.Join(d2, "ffn.0", "3.safetensors")
		b, _ := os.ReadFile(p3)
		os.WriteFile(p3, b[:len(b)/2], 0o644)
		var logs strings.Builder
		srv, err := ckptServer(t, d2, wasmexperts.FFN, h, host.CheckpointConfig{}, host.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Shutdown(ctx)
		c := client.New(srv.Addr())
		defer c.Close()
		if got := forward(t, c, h); !slices.Equal(got, want) {
			t.Fatalf("fell back to %v, want step 2's %v", got, want)
		}
		if !strings.Contains(logs.String(), "skipping a checkpoint") || !strings.Contains(logs.String(), "step=3") {
			t.Errorf("no warning about step 3 in the log:\n%s", logs.String())
		}
	})
}

// TestRestoreAtStartWritesEveryParam checks a start that restores
// checkpoints, which reads the parameters straight into their tensors
// and draws no initial values: every value of every parameter of two
// experts that share an instance is the checkpoint's (a parameter left
// undrawn, or drawn over the checkpoint, shows as other values), and a
// fresh start still gets the initial values that the uids give.
func TestRestoreAtStartWritesEveryParam(t *testing.T) {
	const h = 8
	ctx := context.Background()
	dir := t.TempDir()
	uids := []string{"ffn.0", "ffn.1"}
	start := func() (*host.Server, moehostv1connect.CheckpointServiceClient) {
		t.Helper()
		srv, err := ckptServer(t, dir, wasmexperts.FFN, h, host.CheckpointConfig{},
			host.WithExperts(host.ExpertConfig{UID: "ffn.1", Module: host.ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": h}}))
		if err != nil {
			t.Fatal(err)
		}
		return srv, moehostv1connect.NewCheckpointServiceClient(http.DefaultClient, "http://"+srv.Addr())
	}
	params := func(cc moehostv1connect.CheckpointServiceClient, uid string) (int64, map[string][]float32) {
		t.Helper()
		p, err := cc.GetParameters(ctx, connect.NewRequest(&moehostv1.CheckpointServiceGetParametersRequest{Uid: uid}))
		if err != nil {
			t.Fatal(err)
		}
		return p.Msg.GetStep(), paramValues(t, p.Msg.GetParameters())
	}
	same := func(a, b map[string][]float32) bool {
		if len(a) != len(b) || len(a) == 0 {
			return false
		}
		for k, v := range a {
			if !slices.Equal(v, b[k]) {
				return false
			}
		}
		return true
	}

	srv, cc := start()
	initial := map[string]map[string][]float32{}
	for _, uid := range uids {
		_, initial[uid] = params(cc, uid)
	}
	if same(initial["ffn.0"], initial["ffn.1"]) {
		t.Fatal("two uids got the same initial values; the test cannot tell them apart")
	}
	c := client.New(srv.Addr())
	train(t, c, h, 2, rand.New(rand.NewPCG(7, 8))) // ffn.0 only
	// And ffn.1 one step, so that both are restored (an expert that
	// never trained is not saved).
	x := client.Float32([]int64{1, h}, []float32{1, -2, 3, -4, 5, -6, 7, -8})
	if _, err := c.Expert("ffn.1").Backward(ctx, []client.Tensor{x}, []client.Tensor{x}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	trained := map[string]map[string][]float32{}
	for _, uid := range uids {
		_, trained[uid] = params(cc, uid)
	}
	for _, uid := range uids {
		if same(trained[uid], initial[uid]) {
			t.Fatalf("training changed no parameter of %s", uid)
		}
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	srv, cc = start()
	for _, uid := range uids {
		step, got := params(cc, uid)
		if !same(got, trained[uid]) {
			t.Errorf("%s after a restart (step %d): not the checkpoint's values", uid, step)
		}
	}
	// A restored expert that trains is saved at shutdown; one that did
	// not is left as it is on disk.
	c = client.New(srv.Addr())
	train(t, c, h, 1, rand.New(rand.NewPCG(9, 10)))
	c.Close()
	_, trained["ffn.0"] = params(cc, "ffn.0")
	ffn1 := filepath.Join(dir, "ffn.1", "1.safetensors")
	before, err := os.Stat(ffn1)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if after, err := os.Stat(ffn1); err != nil || !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("the shutdown rewrote the checkpoint of ffn.1, which did not change (%v)", err)
	}
	srv, cc = start()
	for _, uid := range uids {
		step, got := params(cc, uid)
		if !same(got, trained[uid]) {
			t.Errorf("%s after training and a second restart (step %d): not what it trained to", uid, step)
		}
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// A fresh start draws what the uids give, as the first one did.
	dir = t.TempDir()
	srv, cc = start()
	defer srv.Shutdown(ctx)
	for _, uid := range uids {
		if _, got := params(cc, uid); !same(got, initial[uid]) {
			t.Errorf("%s on a fresh start: not the initial values its uid gives", uid)
		}
	}
}

// TestUntouchedExpertNotSaved checks the README's "saves when the step
// changed": an expert that never trained gets no checkpoint (its uid
// draws the same initial values again).
func TestUntouchedExpertNotSaved(t *testing.T) {
	t.Parallel()
	const h = 8
	dir := t.TempDir()
	srv, err := ckptServer(t, dir, wasmexperts.FFN, h, host.CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(srv.Addr())
	forward(t, c, h) // serving is not training
	c.Close()
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "ffn.0", "*")); len(files) != 0 {
		t.Errorf("an untouched expert was saved: %v", files)
	}
}

// TestCheckpointSavesLogged checks that each save that wrote, periodic or
// at shutdown, is logged at Info with its uid and step, as restores are.
func TestCheckpointSavesLogged(t *testing.T) {
	t.Parallel()
	const h = 8
	var logs lockedBuffer
	srv, err := ckptServer(t, t.TempDir(), wasmexperts.FFN, h, host.CheckpointConfig{},
		host.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), host.WithUpdatePeriod(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(srv.Addr())
	defer c.Close()
	train(t, c, h, 2, rand.New(rand.NewPCG(5, 6)))
	const periodic = `level=INFO msg="saved checkpoint" uid=ffn.0 step=2`
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(logs.String(), periodic); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no periodic save logged as %s:\n%s", periodic, logs.String())
		}
	}
	train(t, c, h, 1, rand.New(rand.NewPCG(7, 8)))
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := `level=INFO msg="saved checkpoint" uid=ffn.0 step=3`; !strings.Contains(logs.String(), want) {
		t.Errorf("the shutdown's save is not logged as %s:\n%s", want, logs.String())
	}
}

// TestCheckpointMismatchNamesEveryExpert starts two trained experts'
// checkpoints with another hidden_dim: the one error names both uids and
// the config key that differs, not the first expert only.
func TestCheckpointMismatchNamesEveryExpert(t *testing.T) {
	t.Parallel()
	const h = 8
	dir := t.TempDir()
	second := func(h int64) host.Option {
		return host.WithExperts(host.ExpertConfig{UID: "ffn.1", Module: host.ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": h}})
	}
	srv, err := ckptServer(t, dir, wasmexperts.FFN, h, host.CheckpointConfig{}, second(h))
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(srv.Addr())
	x := client.Float32([]int64{1, h}, []float32{1, -2, 3, -4, 5, -6, 7, -8})
	for _, uid := range []string{"ffn.0", "ffn.1"} {
		if _, err := c.Expert(uid).Backward(context.Background(), []client.Tensor{x}, []client.Tensor{x}); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err = ckptServer(t, dir, wasmexperts.FFN, 2*h, host.CheckpointConfig{}, second(2*h))
	if !errors.Is(err, host.ErrCheckpointMismatch) {
		t.Fatalf("start with another hidden_dim: %v, want ErrCheckpointMismatch", err)
	}
	for _, want := range []string{
		"2 experts' checkpoints do not match",
		`"ffn.0" step 1: parameter "ffn.weight" is [32 8] in the checkpoint but [64 16] in the module (the config differs: hidden_dim 8 → 16)`,
		`"ffn.1" step 1: parameter "ffn.weight" is [32 8] in the checkpoint but [64 16] in the module (the config differs: hidden_dim 8 → 16)`,
		"rm -r " + filepath.Join(dir, "ffn.0"),
		"rm -r " + filepath.Join(dir, "ffn.1"),
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal lacks %q:\n%v", want, err)
		}
	}
}
