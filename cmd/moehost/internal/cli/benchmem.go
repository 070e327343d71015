package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/moehost/moehost/cmd/moehost/internal/loadgen"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
)

// benchMemoryCmd is `moehost bench-memory`: RSS and throughput of `moehost
// serve` under mixed batch sizes, against the analytic floor.
func benchMemoryCmd(stdout io.Writer) *cobra.Command {
	var (
		pattern, dataDir          string
		hiddenDim                 int64
		clients, minRows, maxRows int
		duration, stretch, idle   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "bench-memory",
		Short: "Measure RSS and throughput of `moehost serve` under mixed batch sizes",
		Long: `Start a ` + "`moehost serve`" + ` process with its defaults (4 ffn experts at
hidden_dim 1024) and load it with --clients clients sending --min-rows to
--max-rows rows per request over Connect (binary protobuf), checking every
response: --duration of Forward, then --duration of Forward+Backward (Adam),
in stretches of --stretch, then --idle without load. RSS is sampled from
/proc every 50 ms. The analytic floor of a phase is parameters +
optimizer state + the largest batch's activations; after --idle the RSS
is compared with 1.5 × (parameters + optimizer state + 64 MB), which is
what a server that gives its spare memory back holds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBenchMemory(cmd.Context(), stdout, benchMemConfig{
				pattern: pattern, dataDir: dataDir, hidden: int(hiddenDim), clients: clients,
				minRows: minRows, maxRows: maxRows, duration: duration, stretch: stretch, idle: idle,
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&pattern, "experts", "ffn.[0:4]", "expert uids to host and call")
	f.StringVar(&dataDir, "data-dir", host.DefaultDataDir, "data dir of the servers (for the compilation cache)")
	f.Int64Var(&hiddenDim, "hidden-dim", 1024, "the ffn experts' hidden_dim")
	f.IntVar(&clients, "clients", 16, "concurrent clients")
	f.IntVar(&minRows, "min-rows", 1, "fewest rows per request")
	f.IntVar(&maxRows, "max-rows", 64, "most rows per request")
	f.DurationVar(&duration, "duration", 90*time.Second, "load per phase and server")
	f.DurationVar(&stretch, "stretch", 30*time.Second, "how long one stretch of load runs")
	f.DurationVar(&idle, "idle", 30*time.Second, "how long the server idles after the load before its RSS is read")
	return cmd
}

type benchMemConfig struct {
	pattern, dataDir          string
	hidden                    int
	clients, minRows, maxRows int
	duration, stretch, idle   time.Duration
}

// memServer is one `moehost serve` child.
type memServer struct {
	name string
	cmd  *exec.Cmd
	addr string
	rss  *rssSampler
}

// phaseResult is one server's figures for one phase.
type phaseResult struct {
	res                 loadgen.Result
	peak, final         int64 // RSS bytes
	live, pool, hitRate float64
	granted, requested  float64
}

func runBenchMemory(ctx context.Context, w io.Writer, cfg benchMemConfig) error {
	uids, err := host.ExpandPattern(cfg.pattern)
	if err != nil {
		return fmt.Errorf("--experts: %w", err)
	}
	if cfg.minRows < 1 || cfg.maxRows < cfg.minRows || cfg.clients < 1 || cfg.stretch <= 0 {
		return errors.New("need 1 <= --min-rows <= --max-rows, --clients >= 1 and --stretch > 0")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// One server: the exact-length pool it was once compared against
	// is retired (RATIONALE.md, gpuhost).
	servers := []*memServer{{name: "size classes"}}
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()
	for _, s := range servers {
		if err := s.start(ctx, exe, cfg); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	fmt.Fprintf(w, "%d clients, %d–%d rows per request, experts %s (hidden_dim %d), Connect binary protobuf, every response checked\n",
		cfg.clients, cfg.minRows, cfg.maxRows, cfg.pattern, cfg.hidden)
	fmt.Fprintf(w, "RSS at start: %d MB\n\n", servers[0].rss.now()>>20)

	params := int64(len(uids)) * int64(4*(2*4*cfg.hidden*cfg.hidden+4*cfg.hidden+3*cfg.hidden))
	batch := int64(min(cfg.clients*cfg.maxRows, 1024)) // the default --max-batch-size
	// Per row, the ffn's forward keeps x, the 4h linear and its gelu, the
	// h linear, the sum and the layer norm: 12h floats; its backward
	// needs as many again for the gradients, and the parameters'
	// gradients once.
	act := batch * int64(12*cfg.hidden*4)
	phases := []struct {
		name     string
		backward bool
		floor    int64
	}{
		{"Forward", false, params + act},
		{"Forward+Backward (Adam)", true, 3*params + params + 2*act},
	}
	var fbPeak, fbFloor int64
	fmt.Fprintln(w, "| phase | pool | samples/s | peak RSS MB | final RSS MB | floor MB | live MB | pool MB | hit rate | class waste | errors |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, ph := range phases {
		results := make([]phaseResult, len(servers))
		checkers := make([]*loadgen.Checker, len(servers))
		for i, s := range servers {
			c, err := loadgen.NewChecker(ctx, loadgen.Checked{
				Addr: s.addr, Experts: uids, Hidden: cfg.hidden, Clients: cfg.clients,
				MinRows: cfg.minRows, MaxRows: cfg.maxRows, Backward: ph.backward,
			})
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			defer c.Close()
			checkers[i] = c
			s.rss.resetPeak()
		}
		for done := time.Duration(0); done < cfg.duration; done += cfg.stretch {
			d := min(cfg.stretch, cfg.duration-done)
			for i, s := range servers {
				s.rss.sampling(true)
				r := checkers[i].Run(ctx, d)
				s.rss.sampling(false)
				acc := &results[i].res
				acc.Requests += r.Requests
				acc.Rows += r.Rows
				acc.Errors += r.Errors
				acc.Elapsed += r.Elapsed
				if acc.FirstError == nil {
					acc.FirstError = r.FirstError
				}
			}
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		for i, s := range servers {
			r := &results[i]
			r.peak, r.final = s.rss.peakBytes(), s.rss.now()
			m := scrapeMetrics(s.addr)
			r.live, r.pool, r.hitRate = m["moehost_device_live_tensor_bytes"], m["moehost_device_pool_bytes"], m["moehost_device_pool_hit_rate"]
			r.granted, r.requested = m["moehost_device_granted_bytes_total"], m["moehost_device_requested_bytes_total"]
			waste := 0.0
			if r.requested > 0 {
				waste = r.granted/r.requested - 1
			}
			fmt.Fprintf(w, "| %s | %s | %.0f | %d | %d | %d | %.0f | %.0f | %.3f | %.1f%% | %d |\n", ph.name, s.name,
				r.res.RowsPerSecond(), r.peak>>20, r.final>>20, ph.floor>>20, r.live/(1<<20), r.pool/(1<<20), r.hitRate, 100*waste, r.res.Errors)
			if r.res.FirstError != nil {
				fmt.Fprintf(os.Stderr, "%s, %s: first error: %v\n", ph.name, s.name, r.res.FirstError)
			}
			if ph.backward {
				fbPeak, fbFloor = max(fbPeak, r.peak), ph.floor
			}
		}
		for _, c := range checkers {
			c.Close()
		}
	}
	// Idle: no load and no connection; what the server keeps is what it
	// did not give back.
	optim := 2 * params // Adam's two moments
	idleFloor := 3 * (params + optim + 64<<20) / 2
	fmt.Fprintf(w, "\nForward+Backward peak RSS: %d MB (%.2f× its floor of %d MB)\n", fbPeak>>20, float64(fbPeak)/float64(fbFloor), fbFloor>>20)
	if cfg.idle > 0 {
		var marks []string
		var idleRSS int64
		step := cfg.idle / 3
		for i := 1; i <= 3; i++ {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(step):
			}
			idleRSS = servers[0].rss.now()
			marks = append(marks, fmt.Sprintf("%s %d MB", time.Duration(i)*step, idleRSS>>20))
		}
		verdict := "within"
		if idleRSS > idleFloor {
			verdict = "OVER"
		}
		fmt.Fprintf(w, "RSS idle: %s; after %s %d MB against 1.5 × (parameters %d MB + optimizer state %d MB + 64 MB) = %d MB: %s\n",
			strings.Join(marks, ", "), cfg.idle, idleRSS>>20, params>>20, optim>>20, idleFloor>>20, verdict)
	}
	fmt.Fprintf(w, "\nfloor: parameters %d MB (+ Adam's 2× and the parameters' gradients in Forward+Backward) + the activations of a %d-row batch (%d MB forward, twice that with backward)\n",
		params>>20, batch, act>>20)
	return nil
}

// start runs `moehost serve` with the defaults on a free port and waits
// until it answers.
func (s *memServer) start(ctx context.Context, exe string, cfg benchMemConfig) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s.addr = ln.Addr().String()
	ln.Close()
	s.cmd = exec.CommandContext(ctx, exe, "serve", "--listen", s.addr, "--data-dir", cfg.dataDir,
		"--experts", cfg.pattern, "--hidden-dim", strconv.Itoa(cfg.hidden), "--log-level", "warn")
	s.cmd.Stderr = os.Stderr
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.rss = newRSSSampler(s.cmd.Process.Pid)
	client := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+s.addr)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		_, err := client.ListExperts(ctx, connect.NewRequest(&moehostv1.ListExpertsRequest{}))
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the server did not come up: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *memServer) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.rss.close()
	s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
}

// rssSampler reads a process's VmRSS every 50 ms while sampling is on,
// and keeps the highest.
type rssSampler struct {
	pid  int
	mu   sync.Mutex
	on   bool
	peak int64
	stop chan struct{}
}

func newRSSSampler(pid int) *rssSampler {
	r := &rssSampler{pid: pid, stop: make(chan struct{})}
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
			}
			v := r.now()
			r.mu.Lock()
			if r.on {
				r.peak = max(r.peak, v)
			}
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *rssSampler) sampling(on bool) {
	v := r.now()
	r.mu.Lock()
	r.on = on
	r.peak = max(r.peak, v)
	r.mu.Unlock()
}

func (r *rssSampler) resetPeak() {
	r.mu.Lock()
	r.peak = 0
	r.mu.Unlock()
}

func (r *rssSampler) peakBytes() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.peak
}

func (r *rssSampler) close() { close(r.stop) }

// now returns the process's VmRSS in bytes, 0 if unknown.
func (r *rssSampler) now() int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", r.pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// VmRSS:	  123456 kB
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			fields := strings.Fields(v)
			if len(fields) == 2 {
				kb, _ := strconv.ParseInt(fields[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// scrapeMetrics returns the unlabelled or single-series values of a
// server's /metrics, by name.
func scrapeMetrics(addr string) map[string]float64 {
	out := map[string]float64{}
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return out
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		name, _, _ := strings.Cut(fields[0], "{")
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			out[name] = v
		}
	}
	return out
}
