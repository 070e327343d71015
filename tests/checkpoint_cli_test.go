package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/sdk/client"
)

// TestCheckpointCommands drives `moehost checkpoint save|list|restore|export`
// against a running `moehost serve`.
func TestCheckpointCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := buildMoehost(t, dir)
	cmd, addr := startServe(t, bin, "--data-dir", filepath.Join(dir, "data"), "--experts", "ffn.[0:2]", "--hidden-dim", "4", "--max-wait", "0s", "--no-dht")
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	c := client.New(addr)
	defer c.Close()
	x := client.Float32([]int64{1, 4}, []float32{1, 2, 3, 4})
	g := client.Float32([]int64{1, 4}, []float32{1, -1, 1, -1})
	backward := func() {
		if _, err := c.Expert("ffn.0").Backward(context.Background(), []client.Tensor{x}, []client.Tensor{g}); err != nil {
			t.Fatal(err)
		}
	}
	exportDir := t.TempDir() // the working directory, where export writes by default
	try := func(args ...string) (string, error) {
		c := exec.Command(bin, append([]string{"checkpoint", "--server", addr}, args...)...)
		c.Dir = exportDir
		out, err := c.CombinedOutput()
		return string(out), err
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := try(args...)
		if err != nil {
			t.Fatalf("moehost checkpoint %v: %v\n%s", args, err, out)
		}
		return out
	}
	backward()
	if out := run("save", "ffn.0"); !strings.Contains(out, "ffn.0\tstep 1\t") {
		t.Errorf("save printed %q", out)
	}
	backward()
	run("save", "ffn.0")
	if out := run("list", "ffn.0"); !strings.HasPrefix(out, "ffn.0\tstep 2\t") || !strings.Contains(out, "\nffn.0\tstep 1\t") {
		t.Errorf("list printed %q", out)
	}
	run("save", "ffn.1")
	// With no uid, every expert's, in uid order.
	if out := run("list"); !strings.HasPrefix(out, "ffn.0\tstep 2\t") || !strings.Contains(out, "\nffn.0\tstep 1\t") || !strings.Contains(out, "\nffn.1\tstep 0\t") {
		t.Errorf("list with no uid printed %q", out)
	}
	// export without -o writes <uid>.safetensors, and does not overwrite
	// it without --force.
	run("export", "ffn.1")
	def := filepath.Join(exportDir, "ffn.1.safetensors")
	first := mustReadFile(t, def)
	if err := os.WriteFile(def, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := try("export", "ffn.1"); err == nil || !strings.Contains(out, "--force") || strings.Count(out, "moehost:") != 1 {
		t.Errorf("a second export without -o: %v, %q; want a refusal naming --force", err, out)
	}
	if b := mustReadFile(t, def); string(b) != "mine" {
		t.Errorf("the refused export overwrote %s", def)
	}
	run("export", "--force", "ffn.1")
	if b := mustReadFile(t, def); !slices.Equal(b, first) {
		t.Errorf("export --force did not write %s", def)
	}
	if out := run("restore", "--step", "1", "ffn.0"); !strings.Contains(out, "step 1") {
		t.Errorf("restore printed %q", out)
	}
	file := filepath.Join(dir, "ffn.0.safetensors")
	run("export", "-o", file, "ffn.0")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	ts, md, err := checkpoint.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tt := range ts {
		names = append(names, tt.Name)
	}
	slices.Sort(names)
	if want := []string{"ffn.bias", "ffn.weight", "ffn_output.bias", "ffn_output.weight", "layer_norm.bias", "layer_norm.weight"}; !slices.Equal(names, want) || md["step"] != "1" {
		t.Errorf("exported %v at step %q, want %v at step 1", names, md["step"], want)
	}
	// The restored step-1 weights are the ones saved at step 1.
	saved, _, err := checkpoint.Decode(mustReadFile(t, filepath.Join(dir, "data", "checkpoints", "ffn.0", "1.safetensors")))
	if err != nil {
		t.Fatal(err)
	}
	for i := range ts {
		j := slices.IndexFunc(saved, func(s checkpoint.Tensor) bool { return s.Name == ts[i].Name })
		if j < 0 || !slices.Equal(saved[j].Data, ts[i].Data) {
			t.Errorf("exported %q differs from the step-1 checkpoint", ts[i].Name)
		}
	}
}

func mustReadFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
