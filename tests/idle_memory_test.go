package tests

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/abi"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/sdk/wire"
)

// TestIdleServerGivesMemoryBack trains two ffn experts at hidden_dim 1024
// through a real `moehost serve` for a few seconds (every answer
// checked), stops, and waits for the pool's decay: the server's RSS must
// fall to 1.3 × (its live tensor bytes, the parameters and Adam's
// moments, + 64 MB), under make bench-memory's idle bar of 1.5 ×. Before
// the server gave memory back it kept what the load had grown to (519 MB
// against a bar of 333 MB), with nothing to collect it; now it keeps
// about 245 MB. A probe row then gets the same answer alone and
// inside a batch, from storage that was handed back and faulted in anew.
func TestIdleServerGivesMemoryBack(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads VmRSS from /proc")
	}
	t.Parallel()
	const hidden = 1024
	dir := t.TempDir()
	bin := buildMoehost(t, dir)
	cmd, addr := startServe(t, bin, "--data-dir", filepath.Join(dir, "data"), "--no-checkpoints",
		"--experts", "ffn.[0:2]", "--hidden-dim", strconv.Itoa(hidden))
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	pid := cmd.Process.Pid
	hc := &http.Client{Transport: &http.Transport{}}
	c := moehostv1connect.NewExpertServiceClient(hc, "http://"+addr)
	ctx := context.Background()

	// Load: 4 clients, each a Forward and a Backward of 1 to 64 rows at a
	// time, for 4 s, sampling RSS as it goes.
	var (
		mu      sync.Mutex
		steps   int
		loadErr error
		peak    int64
	)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if v, err := readRSS(pid); err == nil {
				peak = max(peak, v)
			}
		}
	}()
	var wg sync.WaitGroup
	end := time.Now().Add(4 * time.Second)
	for cl := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(cl), 39))
			for i := 0; time.Now().Before(end); i++ {
				err := trainStep(ctx, c, fmt.Sprintf("ffn.%d", (cl+i)%2), 1+rng.IntN(64), hidden, rng)
				mu.Lock()
				steps++
				if err != nil && loadErr == nil {
					loadErr = err
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	hc.CloseIdleConnections()
	if loadErr != nil {
		t.Fatal(loadErr)
	}

	// The pool is empty two decay periods after its last release at the
	// latest; the runtime's own free memory follows at once.
	loaded := vmRSS(t, pid)
	deadline := time.Now().Add(2*gpuhost.PoolDecay + 3*time.Second)
	for poolBytes(t, addr) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second)
	rss, live := vmRSS(t, pid), liveTensorBytes(t, addr)
	bar := 13 * (live + 64<<20) / 10
	t.Logf("%d steps; RSS peak %d MB, at the end of the load %d MB, idle %d MB; live tensors %d MB, bar %d MB", steps, peak>>20, loaded>>20, rss>>20, live>>20, bar>>20)
	if rss > bar {
		t.Errorf("RSS %d MB when idle, over 1.3 × (live tensors %d MB + 64 MB) = %d MB (peak under load %d MB)", rss>>20, live>>20, bar>>20, peak>>20)
	}

	// The storage given back works as new.
	probe := make([]float32, hidden)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range probe {
		probe[i] = float32(rng.NormFloat64())
	}
	alone, err := forwardRows(ctx, c, "ffn.0", probe, 1, hidden)
	if err != nil {
		t.Fatal(err)
	}
	const rows, at = 37, 11
	x := make([]float32, rows*hidden)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	copy(x[at*hidden:], probe)
	batch, err := forwardRows(ctx, c, "ffn.0", x, rows, hidden)
	if err != nil {
		t.Fatal(err)
	}
	for j, w := range alone {
		if g := batch[at*hidden+j]; math.Abs(float64(g-w)) > 1e-4*(1+math.Abs(float64(w))) {
			t.Fatalf("after the decay, the probe at row %d of %d gives %g at column %d, alone %g", at, rows, g, j, w)
		}
	}
}

// trainStep sends a Forward and a Backward of rows random rows to uid and
// checks both answers' shape and values.
func trainStep(ctx context.Context, c moehostv1connect.ExpertServiceClient, uid string, rows, hidden int, rng *rand.Rand) error {
	x := make([]float32, rows*hidden)
	gy := make([]float32, rows*hidden)
	for i := range x {
		x[i], gy[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	if _, err := forwardRows(ctx, c, uid, x, rows, hidden); err != nil {
		return err
	}
	shape := []int64{int64(rows), int64(hidden)}
	res, err := c.Backward(ctx, connect.NewRequest(&moehostv1.BackwardRequest{Uid: uid,
		Inputs:      []*moehostv1.Tensor{wire.Tensor(shape, x, abi.DTypeFloat32)},
		GradOutputs: []*moehostv1.Tensor{wire.Tensor(shape, gy, abi.DTypeFloat32)}}))
	if err != nil {
		return fmt.Errorf("backward of %d rows to %s: %w", rows, uid, err)
	}
	if _, err := finiteRows(res.Msg.GetGradInputs(), rows, hidden); err != nil {
		return fmt.Errorf("backward of %d rows to %s: %w", rows, uid, err)
	}
	return nil
}

// forwardRows sends x as rows × hidden to uid and returns the checked
// output.
func forwardRows(ctx context.Context, c moehostv1connect.ExpertServiceClient, uid string, x []float32, rows, hidden int) ([]float32, error) {
	res, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: uid,
		Inputs: []*moehostv1.Tensor{wire.Tensor([]int64{int64(rows), int64(hidden)}, x, abi.DTypeFloat32)}}))
	if err != nil {
		return nil, fmt.Errorf("forward of %d rows to %s: %w", rows, uid, err)
	}
	out, err := finiteRows(res.Msg.GetOutputs(), rows, hidden)
	if err != nil {
		return nil, fmt.Errorf("forward of %d rows to %s: %w", rows, uid, err)
	}
	return out, nil
}

// finiteRows checks that ts is one float32 [rows, hidden] tensor of
// finite values and returns them.
func finiteRows(ts []*moehostv1.Tensor, rows, hidden int) ([]float32, error) {
	if len(ts) != 1 || ts[0].GetDtype() != moehostv1.DType_DTYPE_FLOAT32 || len(ts[0].GetShape()) != 2 ||
		ts[0].GetShape()[0] != int64(rows) || ts[0].GetShape()[1] != int64(hidden) {
		return nil, fmt.Errorf("answer %v, want one float32 [%d %d]", ts, rows, hidden)
	}
	out, err := wire.Values(ts[0])
	if err != nil {
		return nil, err
	}
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("value %d of the answer is %g", i, v)
		}
	}
	return out, nil
}

// vmRSS returns the VmRSS of process pid in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	v, err := readRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func readRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		// VmRSS:	  123456 kB
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			if f := strings.Fields(v); len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// liveTensorBytes reads the server's live tensor bytes from /metrics.
func liveTensorBytes(t *testing.T, addr string) int64 {
	t.Helper()
	return deviceMetric(t, addr, "moehost_device_live_tensor_bytes")
}

// poolBytes reads the bytes the server's pool holds from /metrics.
func poolBytes(t *testing.T, addr string) int64 {
	t.Helper()
	return deviceMetric(t, addr, "moehost_device_pool_bytes")
}

// deviceMetric reads the server's one device's metric name.
func deviceMetric(t *testing.T, addr, name string) int64 {
	t.Helper()
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name+"{"); ok {
			f := strings.Fields(rest)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return int64(v)
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}
