package tests

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/internal/testing/racebuild"
	"github.com/moehost/moehost/sdk/client"
)

// The moehost binary, built once for the tests that run it.
var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// buildMoehost returns the binary, building it on first use, once for all
// the package's tests. TestMain removes it. Under -race it skips the test.
func buildMoehost(t testing.TB, _ string) string {
	t.Helper()
	if racebuild.Enabled {
		t.Skip("runs moehost serve in a child process, built without -race: make test runs it in its run without -race (make test-e2e)")
	}
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "moehost-bin-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "moehost")
		// Stamped as make build stamps it, without Go's VCS stamping, so
		// that TestVersionStamped sees the Makefile's commit.
		ldflags, err := exec.Command("make", "-s", "--no-print-directory", "-C", "..", "print-ldflags").Output()
		if err != nil {
			binErr = fmt.Errorf("make print-ldflags: %w", err)
			return
		}
		build := exec.Command("go", "build", "-buildvcs=false", "-ldflags", strings.TrimSpace(string(ldflags)), "-o", binPath, "../cmd/moehost")
		if out, err := build.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// startServe starts `moehost serve` with args and returns it with its
// address once it serves.
func startServe(t testing.TB, bin string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:*"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrRE := regexp.MustCompile(`msg="moehost serving" addr=(\S+)`)
	found := make(chan string, 1)
	var log strings.Builder
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if m := addrRE.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	select {
	case addr := <-found:
		return cmd, addr
	case <-exited:
		cmd.Wait()
		t.Fatalf("serve exited before serving:\n%s", log.String())
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("serve did not start:\n%s", log.String())
	}
	return nil, ""
}

// savedStep returns the newest step with a parameter file on disk, or -1.
func savedStep(t *testing.T, store *checkpoint.Store, uid string) int64 {
	t.Helper()
	infos, err := store.List(uid)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) == 0 {
		return -1
	}
	return infos[0].Step
}

// TestKillDuringTraining SIGKILLs `moehost serve` at random points while it
// trains and saves every 30ms, 20 times. After each kill, every checkpoint
// left on disk must load, and the restarted server must resume from a
// step no older than the newest save completed before the kill.
func TestKillDuringTraining(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := buildMoehost(t, dir)
	data := filepath.Join(dir, "data")
	const uid, h = "ffn.0", 8
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	store, err := checkpoint.Open(filepath.Join(data, "checkpoints"), 0)
	if err != nil {
		t.Fatal(err)
	}
	lastSaved, lastRestored := int64(-1), int64(0)
	midWrite := 0
	for kill := range 20 {
		cmd, addr := startServe(t, bin, "--data-dir", data, "--experts", uid, "--hidden-dim", "8",
			"--update-period", "30ms", "--keep-checkpoints", "2", "--optimizer", "adamw", "--max-wait", "0s")
		c := client.New(addr)
		info, err := c.Expert(uid).Info(context.Background())
		if err != nil {
			cmd.Process.Kill()
			t.Fatal(err)
		}
		restored := info.GetStats().GetBackwardBatches()
		if restored < lastSaved || restored < lastRestored {
			cmd.Process.Kill()
			t.Fatalf("kill %d: restarted at step %d; the last completed save was %d, the last restore %d", kill, restored, lastSaved, lastRestored)
		}
		lastRestored = restored
		// Train until killed.
		ctx, cancel := context.WithCancel(context.Background())
		trained := make(chan int)
		go func() {
			n := 0
			defer func() { trained <- n }()
			x := client.Float32([]int64{4, h}, make([]float32, 4*h))
			g := make([]float32, 4*h)
			for i := range g {
				g[i] = float32(i%7) - 3
			}
			for ctx.Err() == nil {
				if _, err := c.Expert(uid).Backward(ctx, []client.Tensor{x}, []client.Tensor{client.Float32([]int64{4, h}, g)}); err != nil {
					return
				}
				n++
			}
		}()
		time.Sleep(time.Duration(20+rng.IntN(280)) * time.Millisecond)
		lastSaved = savedStep(t, store, uid)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		cancel()
		n := <-trained
		c.Close()
		tmps, _ := filepath.Glob(filepath.Join(data, "checkpoints", uid, ".tmp-*"))
		if len(tmps) > 0 {
			midWrite++
		}
		// Every checkpoint on disk loads.
		infos, err := store.List(uid)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			if _, err := store.Load(uid, in.Step, 0); err != nil && !errors.Is(err, checkpoint.ErrNotFound) {
				t.Fatalf("kill %d: checkpoint %d does not load: %v", kill, in.Step, err)
			}
		}
		t.Logf("kill %d: restored step %d, trained %d more, newest save before the kill %d, files %d", kill, restored, n, lastSaved, len(infos))
	}
	if lastSaved < 20 {
		t.Errorf("only %d steps were saved over 20 runs; the test did not exercise training", lastSaved)
	}
	t.Logf("%d of 20 kills left a half-written temp file behind", midWrite)
	entries, _ := os.ReadDir(filepath.Join(data, "checkpoints", uid))
	t.Logf("files at the end: %d", len(entries))
}
