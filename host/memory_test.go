package host

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// TestMemoryLongTail sends Forward and Backward batches of many distinct
// sizes and checks, all along, that the pool stays under its bound (the
// recent high-water mark of live bytes, itself under the memory limit),
// and at the end that the live bytes are the parameters and Adam's two
// moments, nothing else.
func TestMemoryLongTail(t *testing.T) {
	t.Parallel()
	const hidden, limit = 64, 256 << 20
	srv := startTestServer(t, WithMemoryLimit(limit), WithExperts(
		ExpertConfig{UID: "ffn.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": hidden}},
	))
	params := srv.MemoryStats()[0].LiveBytes
	if params < 4*(2*4*hidden*hidden) {
		t.Fatalf("live bytes %d at start, less than the parameters", params)
	}
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+srv.Addr())
	ctx := context.Background()
	check := func(when string) {
		t.Helper()
		s := srv.MemoryStats()[0]
		if s.PoolBytes > s.PeakBytes-s.LiveBytes || s.LiveBytes+s.PoolBytes > limit {
			t.Fatalf("%s: pool %d bytes with %d live, peak %d, limit %d: over the bound", when, s.PoolBytes, s.LiveBytes, s.PeakBytes, limit)
		}
	}
	rng := rand.New(rand.NewPCG(15, 1))
	sizes := rng.Perm(240)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < len(sizes); i += 4 {
				rows := int64(sizes[i] + 1)
				x := tensor([]int64{rows, hidden}, randVec(rng2(i), int(rows)*hidden))
				if i%2 == 0 {
					_, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "ffn.0", Inputs: []*moehostv1.Tensor{x}}))
					if err != nil {
						t.Errorf("forward of %d rows: %v", rows, err)
						return
					}
				} else {
					gy := tensor([]int64{rows, hidden}, randVec(rng2(-i), int(rows)*hidden))
					_, err := c.Backward(ctx, connect.NewRequest(&moehostv1.BackwardRequest{Uid: "ffn.0", Inputs: []*moehostv1.Tensor{x}, GradOutputs: []*moehostv1.Tensor{gy}}))
					if err != nil {
						t.Errorf("backward of %d rows: %v", rows, err)
						return
					}
				}
				check(fmt.Sprintf("after %d rows", rows))
			}
		})
	}
	wg.Wait()
	// Tensors dropped without a Release stop counting when the collector
	// takes them; any that stay are held by something.
	s := srv.MemoryStats()[0]
	if s.LiveBytes != 3*params {
		t.Logf("live bytes %d right after the load: %d more than the parameters and Adam's moments, waiting for the collector", s.LiveBytes, s.LiveBytes-3*params)
	}
	for deadline := time.Now().Add(10 * time.Second); s.LiveBytes != 3*params && time.Now().Before(deadline); s = srv.MemoryStats()[0] {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	// Adam's moments come from Zeros, which never takes a larger pooled
	// buffer than their size class, so they cost exactly what the
	// parameters do (a best-fit buffer kept for the server's life once
	// left 24,640 bytes here).
	if s.LiveBytes != 3*params {
		t.Errorf("live bytes %d after the load, want %d: the parameters and Adam's two moments", s.LiveBytes, 3*params)
	}
	t.Logf("params %d bytes; after the load %+v, hit rate %.3f", params, s, s.HitRate())
}

func rng2(seed int) *rand.Rand { return rand.New(rand.NewPCG(uint64(seed), 2)) }

// memChildEnv, when set, makes the test binary a server under a small
// memory limit (TestMain runs runMemoryChild); its value is the data dir.
const memChildEnv = "MOEHOST_TEST_MEMORY_CHILD"

// childLimit, childHidden and childRows size TestMemoryLimitFlood: one
// ffn of 2.1 MB of parameters under a 16 MiB limit, one request of 128
// rows (128 KiB) per batch, of about 1.6 MB of activations.
const (
	childLimit  = 16 << 20
	childHidden = 256
	childRows   = 128
	childFlood  = 128 // requests at once: 16 MiB of inputs
)

// runMemoryChild serves ffn.0 under childLimit, prints "addr <host:port>",
// and serves until stdin closes or SIGTERM.
func runMemoryChild(dir string) int {
	srv, err := New(WithListen("127.0.0.1:*"), WithDataDir(dir), WithMemoryLimit(childLimit),
		WithBatching(BatchLimits{MaxBatchSize: childRows, QueueSize: 1 << 12}),
		WithExperts(ExpertConfig{UID: "ffn.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": childHidden}}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := srv.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Printf("addr %s\n", srv.Addr())
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestMemoryLimitFlood floods a server in a child process, under a small
// memory limit, with more concurrent work than fits: the work past the
// limit gets ResourceExhausted, every other request gets its right
// answer, and the process stays up and serves afterwards.
func TestMemoryLimitFlood(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memChildEnv+"="+testDataDir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
		}
	})
	addrCh := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "addr "); ok {
				addrCh <- a
			}
		}
		close(addrCh)
	}()
	var addr string
	select {
	case addr = <-addrCh:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the child server did not start; stderr: %s", stderr.String())
	}
	if addr == "" {
		t.Fatalf("the child server exited; stderr: %s", stderr.String())
	}
	c := moehostv1connect.NewExpertServiceClient(&http.Client{Transport: &http.Transport{}}, "http://"+addr)
	ctx := context.Background()

	// The answer to one input alone; the flood sends it childFlood times
	// at once, more than the limit.
	const rows = childRows
	x := tensor([]int64{rows, childHidden}, randVec(rand.New(rand.NewPCG(15, 2)), rows*childHidden))
	forward := func() (*moehostv1.ForwardResponse, error) {
		res, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "ffn.0", Inputs: []*moehostv1.Tensor{x}}))
		return msgOf(res), err
	}
	res, err := forward()
	if err != nil {
		t.Fatalf("a lone request: %v", err)
	}
	want := floats(t, res.GetOutputs()[0])

	var (
		mu                 sync.Mutex
		ok, exhausted, bad int
		firstBad           error
		wg                 sync.WaitGroup
	)
	for range childFlood {
		wg.Go(func() {
			res, err := forward()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				if d := maxDiff(floats(t, res.GetOutputs()[0]), want); d > 1e-4 {
					err = fmt.Errorf("output differs from the lone request's by %g", d)
				} else {
					ok++
					return
				}
			case codeOf(err) == connect.CodeResourceExhausted:
				if !strings.Contains(messageOf(err), "out of memory") {
					err = fmt.Errorf("ResourceExhausted without naming the memory limit: %w", err)
				} else {
					exhausted++
					return
				}
			}
			bad++
			if firstBad == nil {
				firstBad = err
			}
		})
	}
	wg.Wait()
	t.Logf("flood of %d: %d answered, %d ResourceExhausted, %d other", childFlood, ok, exhausted, bad)
	if bad > 0 {
		t.Errorf("%d requests failed otherwise, first: %v", bad, firstBad)
	}
	if exhausted == 0 {
		t.Errorf("no request got ResourceExhausted: the flood fit under the limit")
	}
	if ok == 0 {
		t.Errorf("no request was answered during the flood")
	}
	select {
	case err := <-exited:
		t.Fatalf("the child exited during the flood: %v; stderr: %s", err, stderr.String())
	default:
	}
	if res, err := forward(); err != nil {
		t.Errorf("after the flood: %v", err)
	} else if d := maxDiff(floats(t, res.GetOutputs()[0]), want); d > 1e-4 {
		t.Errorf("after the flood, output differs by %g", d)
	}
	if m := scrape(t, addr, "moehost_device_refused_allocations_total") + scrape(t, addr, "moehost_device_refused_admissions_total"); m == 0 {
		t.Errorf("/metrics shows no refused allocation or admission")
	}
}

func maxDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// scrape returns the value of a metric with one series on addr's
// /metrics.
func scrape(t *testing.T, addr, name string) float64 {
	t.Helper()
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("%s is not in /metrics", name)
	return 0
}

func TestParseMemoryLimit(t *testing.T) {
	t.Parallel()
	avail := availableMemory()
	tests := []struct {
		name    string
		in      string
		want    int64
		wantErr bool
	}{
		{"bytes", "1048576", 1 << 20, false},
		{"binary unit", "2GiB", 2 << 30, false},
		{"decimal unit", "1500MB", 1500e6, false},
		{"fraction of a unit", "1.5 KiB", 1536, false},
		{"none", "none", -1, false},
		{"percentage", "50%", int64(float64(avail) * 0.5), avail <= 0},
		{"zero", "0", 0, true},
		{"negative", "-1GiB", 0, true},
		{"percentage over 100", "150%", 0, true},
		{"unknown unit", "3 parsecs", 0, true},
		{"empty", "", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMemoryLimit(tt.in)
			if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
				t.Errorf("ParseMemoryLimit(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
	if avail > 0 && DefaultMemoryLimit() != int64(float64(avail)*DefaultMemoryFraction) {
		t.Errorf("DefaultMemoryLimit() = %d, want %v of %d", DefaultMemoryLimit(), DefaultMemoryFraction, avail)
	}
}
