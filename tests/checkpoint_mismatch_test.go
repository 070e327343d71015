package tests

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/sdk/client"
)

// TestServeAnotherModuleOnOneDataDir runs `moehost serve` twice on one
// data dir, the second time with other shapes and then another module: the
// second start is refused naming the ways out that work (and
// --allow-module-change only where the shapes match), and the first run's
// checkpoints are left as they were. The default module's twin, the ffn's
// Go build, restores them.
func TestServeAnotherModuleOnOneDataDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := buildMoehost(t, dir)
	data := filepath.Join(dir, "data")
	common := []string{"--data-dir", data, "--experts", "ffn.0", "--no-dht"}
	cmd, addr := startServe(t, bin, append(common, "--hidden-dim", "8")...)
	// One step, so that the shutdown saves (an untouched expert is not).
	c := client.New(addr)
	x := client.Float32([]int64{1, 8}, []float32{1, 2, 3, 4, 5, 6, 7, 8})
	if _, err := c.Expert("ffn.0").Backward(context.Background(), []client.Tensor{x}, []client.Tensor{x}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("first serve: %v", err)
	}
	ckDir := filepath.Join(data, "checkpoints", "ffn.0")
	snapshot := func() map[string][]byte {
		files, _ := filepath.Glob(filepath.Join(ckDir, "*"))
		out := map[string][]byte{}
		for _, f := range files {
			out[filepath.Base(f)] = mustReadFile(t, f)
		}
		return out
	}
	before := snapshot()
	if len(before) == 0 {
		t.Fatalf("the first serve left no checkpoint in %s", ckDir)
	}
	// A rebuild of the default module: the same code with a custom
	// section, so another digest.
	rebuilt := filepath.Join(dir, "rebuilt.wasm")
	section := append([]byte{7}, "rebuilt v2"...)
	wasm := append(slices.Clip(wasmexperts.FFNC), append([]byte{0, byte(len(section))}, section...)...)
	if err := os.WriteFile(rebuilt, wasm, 0o644); err != nil {
		t.Fatal(err)
	}
	refused := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var stderr bytes.Buffer
		c := exec.CommandContext(ctx, bin, append([]string{"serve", "--listen", "127.0.0.1:*"}, append(common, args...)...)...)
		c.Stderr = &stderr
		if err := c.Run(); err == nil {
			t.Fatalf("serve %v on the first run's data dir started", args)
		}
		return stderr.String()
	}
	tests := []struct {
		name            string
		args            []string
		want            []string
		offerAllowFlags bool
	}{
		{"other shapes", []string{"--hidden-dim", "16"},
			[]string{`"ffn.weight" is [32 8] in the checkpoint but [64 16] in the module`, "--data-dir", "--no-checkpoints", "rm -r " + ckDir}, false},
		{"other module", []string{"--module", rebuilt, "--hidden-dim", "8"},
			[]string{"was saved by module sha256:", "--allow-module-change", "--data-dir", "--no-checkpoints", "rm -r " + ckDir}, true},
	}
	for _, tt := range tests {
		msg := refused(tt.args...)
		for _, w := range tt.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: stderr lacks %q:\n%s", tt.name, w, msg)
			}
		}
		if got := strings.Contains(msg, "--allow-module-change"); got != tt.offerAllowFlags {
			t.Errorf("%s: offers --allow-module-change: %v, want %v:\n%s", tt.name, got, tt.offerAllowFlags, msg)
		}
		if n := strings.Count(msg, "moehost:"); n != 1 {
			t.Errorf("%s: %d \"moehost:\" prefixes, want 1:\n%s", tt.name, n, msg)
		}
	}
	after := snapshot()
	if len(after) != len(before) {
		t.Fatalf("checkpoint files %d after the refusals, %d before", len(after), len(before))
	}
	for name, b := range before {
		if !bytes.Equal(after[name], b) {
			t.Errorf("%s changed", name)
		}
	}
	if _, err := os.Stat(ckDir); err != nil {
		t.Fatal(err)
	}
	cmd, _ = startServe(t, bin, append(common, "--module", "ffn", "--hidden-dim", "8")...)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve --module ffn on ffn-c's checkpoints: %v", err)
	}
}
