package tests

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

func writeF32(t *testing.T, path string, v []float32) {
	t.Helper()
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPythonInterop trains an ffn expert a few steps, saves a checkpoint,
// and has PyTorch load it into hivemind's FeedforwardBlock
// (scripts/interop_ffn.py) and compare its output with the server's
// Forward. It runs under `make test-python-interop`, which sets
// MOEHOST_PYTHON to a Python with torch; without it, it is skipped.
func TestPythonInterop(t *testing.T) {
	python := os.Getenv("MOEHOST_PYTHON")
	if python == "" {
		t.Skip("MOEHOST_PYTHON is not set; run make test-python-interop")
	}
	const h = 32
	ctx := context.Background()
	dir := t.TempDir()
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(dir),
		host.WithExperts(host.ExpertConfig{UID: "ffn.0", Module: host.ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": h}}),
		host.WithOptimizer(host.OptimizerConfig{Name: "adamw", LR: 0.01}),
		host.WithCheckpoints(host.CheckpointConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	c := client.New(srv.Addr())
	defer c.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	randn := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	shape := []int64{16, h}
	for range 3 { // so that the checkpoint is not the seeded init
		if _, err := c.Expert("ffn.0").Backward(ctx, []client.Tensor{client.Float32(shape, randn(16*h))}, []client.Tensor{client.Float32(shape, randn(16*h))}); err != nil {
			t.Fatal(err)
		}
	}
	cc := moehostv1connect.NewCheckpointServiceClient(http.DefaultClient, "http://"+srv.Addr())
	saved, err := cc.Save(ctx, connect.NewRequest(&moehostv1.CheckpointServiceSaveRequest{Uid: "ffn.0"}))
	if err != nil {
		t.Fatal(err)
	}
	x := randn(16 * h)
	out, err := c.Expert("ffn.0").Forward(ctx, client.Float32(shape, x))
	if err != nil {
		t.Fatal(err)
	}
	y, err := out[0].Float32s()
	if err != nil {
		t.Fatal(err)
	}
	writeF32(t, filepath.Join(dir, "x.bin"), x)
	writeF32(t, filepath.Join(dir, "y.bin"), y)
	ckpt := filepath.Join(dir, "checkpoints", "ffn.0", "3.safetensors")
	if saved.Msg.GetCheckpoint().GetStep() != 3 {
		t.Fatalf("saved step %d, want 3", saved.Msg.GetCheckpoint().GetStep())
	}
	cmd := exec.Command(python, "../scripts/interop_ffn.py", ckpt, filepath.Join(dir, "x.bin"), filepath.Join(dir, "y.bin"), "32")
	res, err := cmd.CombinedOutput()
	t.Logf("%s", res)
	if err != nil {
		t.Fatalf("PyTorch disagrees with the server: %v", err)
	}
}
