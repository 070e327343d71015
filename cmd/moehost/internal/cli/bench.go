package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/cmd/moehost/internal/loadgen"
	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

func benchCmd(stdout io.Writer) *cobra.Command {
	var (
		pattern, dataDir, module  string
		dtypes                    []string
		hiddenDim                 int64
		clients, minRows, maxRows int
		duration                  time.Duration
		cmp                       compareFlags
		child                     bool
		serverProfiles            string
		serverExes                []string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure serving throughput and latency with and without batching",
		Long: `Start an in-process server twice, once with batching (the default limits) and
once without (max batch size 1), drive each with the same load of concurrent
Forward calls over loopback, and print the two side by side.

With --compare, measure hivemind's ffn (--hidden-dim, --batch) instead, in
alternating rounds: PyTorch eager in-process (--torch-script; make
bench-compare installs torch), moehost in-process and moehost over RPC, each
forward and forward+backward+Adam, and print samples/s with the ratios.

--dtype float32,float16,bfloat16 runs the batching mode once per wire
dtype (inputs sent and outputs asked for in it) and prints the bytes per
request and the throughput of each against the first. --module benchmarks
another module (a .wasm file or a built-in) whose one input is float32
[-1, hidden_dim].

--child serves the experts from a ` + "`moehost serve`" + ` child process instead,
batching only, and adds its CPU time per request (from /proc) to the
table: the load generator shares the cores, so requests/s alone would
charge the server for the clients' work. --server-profiles DIR has the
child write a CPU profile and an allocation profile of each mode there
(DIR/<dtype>.cpu.pprof, DIR/<dtype>.allocs.pprof) for go tool pprof.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmp.on {
				return runCompare(cmd.Context(), stdout, cmp, dataDir, int(hiddenDim))
			}
			uids, err := host.ExpandPattern(pattern)
			if err != nil {
				return fmt.Errorf("--experts: %w", err)
			}
			if minRows < 1 || maxRows < minRows || clients < 1 {
				return fmt.Errorf("need 1 <= --min-rows <= --max-rows and --clients >= 1")
			}
			src, err := moduleSource(module)
			if err != nil {
				return err
			}
			wires, err := parseWireDTypes(dtypes)
			if err != nil {
				return err
			}
			type mode struct {
				name string
				lim  host.BatchLimits
				dt   abi.DType
			}
			if cmp.prof != "" {
				stopProf, err := startCPUProfile(cmp.prof)
				if err != nil {
					return err
				}
				defer stopProf()
			}
			var modes []mode
			for _, dt := range wires {
				modes = append(modes, mode{"batching " + dt.String(), host.BatchLimits{QueueSize: 1 << 16}, dt})
			}
			if child {
				if serverProfiles != "" {
					if err := os.MkdirAll(serverProfiles, 0o755); err != nil {
						return fmt.Errorf("--server-profiles: %w", err)
					}
				}
				exes := serverExes
				if len(exes) == 0 {
					exes = []string{""}
				}
				rounds := 1
				if len(exes) > 1 || cmd.Flags().Changed("rounds") {
					rounds = cmp.rounds
				}
				if rounds < 1 {
					return fmt.Errorf("--rounds must be at least 1")
				}
				fmt.Fprintf(stdout, "%d clients, %d–%d rows per request, experts %s (%v, hidden_dim %d) on a `moehost serve` child, %v\n\n",
					clients, minRows, maxRows, pattern, src, hiddenDim, duration)
				fmt.Fprintln(stdout, loadgen.Header)
				var batches []string
				// runs[mode][exe] holds one result per round.
				runs := make([][][]loadgen.Result, len(modes))
				for mi := range modes {
					runs[mi] = make([][]loadgen.Result, len(exes))
				}
				for r := range rounds {
					for mi, m := range modes {
						for j := range exes {
							// Each build goes first in turn, so that none
							// always runs in another's wake.
							ei := (j + r) % len(exes)
							exe := exes[ei]
							var profile []string
							if serverProfiles != "" {
								base := filepath.Join(serverProfiles, m.dt.String())
								if len(exes) > 1 {
									base += "." + strconv.Itoa(ei)
								}
								if rounds > 1 {
									base += ".round" + strconv.Itoa(r+1)
								}
								profile = []string{"--cpuprofile", base + ".cpu.pprof", "--memprofile", base + ".allocs.pprof"}
							}
							res, meanBatch, err := benchChild(cmd.Context(), exe, pattern, module, dataDir, hiddenDim, profile, loadgen.Config{
								Experts: uids, Hidden: int(hiddenDim), Clients: clients,
								MinRows: minRows, MaxRows: maxRows, Duration: duration, DType: m.dt,
							})
							if err != nil {
								return fmt.Errorf("%s on %s: %w", m.name, serverLabel(exes, ei), err)
							}
							name := m.name + " (child)"
							if len(exes) > 1 || rounds > 1 {
								name = fmt.Sprintf("%s, %s, round %d", m.name, serverLabel(exes, ei), r+1)
							}
							fmt.Fprintln(stdout, res.Row(name))
							runs[mi][ei] = append(runs[mi][ei], res)
							batches = append(batches, fmt.Sprintf("%s: %.1f rows per forward batch, load generator %.0f CPU-µs per request",
								name, meanBatch, float64(res.ClientCPUPerRequest())/float64(time.Microsecond)))
							if res.FirstError != nil {
								fmt.Fprintf(os.Stderr, "%s: first error: %v\n", name, res.FirstError)
							}
						}
					}
				}
				sep := "; "
				if len(batches) > 1 {
					sep = "\n"
				}
				fmt.Fprintf(stdout, "\n%s\n(the server's counters over each run, warm-up included)\n", strings.Join(batches, sep))
				if rounds > 1 {
					fmt.Fprintf(stdout, "\nmedians of %d rounds:\n", rounds)
					for mi, m := range modes {
						fmt.Fprintln(stdout, childMedians(m.name, exes, runs[mi]))
					}
				}
				return nil
			}
			modes = append(modes, mode{"no batching (max 1) " + wires[0].String(), host.BatchLimits{MaxBatchSize: 1, QueueSize: 1 << 16}, wires[0]})
			fmt.Fprintf(stdout, "%d clients, %d–%d rows per request, experts %s (%v, hidden_dim %d), %v per mode\n\n",
				clients, minRows, maxRows, pattern, src, hiddenDim, duration)
			fmt.Fprintln(stdout, loadgen.Header)
			results := make([]loadgen.Result, len(modes))
			for i, m := range modes {
				res, err := benchMode(cmd.Context(), uids, dataDir, src, hiddenDim, m.lim, loadgen.Config{
					Experts: uids, Hidden: int(hiddenDim), Clients: clients,
					MinRows: minRows, MaxRows: maxRows, Duration: duration, DType: m.dt,
				})
				if err != nil {
					return fmt.Errorf("%s: %w", m.name, err)
				}
				fmt.Fprintln(stdout, res.Row(m.name))
				if res.FirstError != nil {
					fmt.Fprintf(os.Stderr, "%s: first error: %v\n", m.name, res.FirstError)
				}
				results[i] = res
			}
			fmt.Fprintln(stdout)
			base := results[0]
			baseReq, baseRes := base.BytesPerRequest()
			for i, dt := range wires[1:] {
				r := results[i+1]
				req, res := r.BytesPerRequest()
				if baseReq > 0 && baseRes > 0 && base.RowsPerSecond() > 0 {
					// Rows per request vary, so bytes per row is the fair
					// ratio; with one seed per client they match closely.
					fmt.Fprintf(stdout, "%v: %.2f× the request bytes and %.2f× the response bytes of %v per row, %.2f× its throughput\n",
						dt, (req/rowsPerReq(r))/(baseReq/rowsPerReq(base)), (res/rowsPerReq(r))/(baseRes/rowsPerReq(base)), wires[0], r.RowsPerSecond()/base.RowsPerSecond())
				}
			}
			if last := results[len(results)-1]; last.RowsPerSecond() > 0 {
				fmt.Fprintf(stdout, "batching gives %.1f× the throughput of no batching\n", base.RowsPerSecond()/last.RowsPerSecond())
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&pattern, "experts", "ffn.[0:4]", "expert uids to host and call")
	f.StringVar(&dataDir, "data-dir", host.DefaultDataDir, "data dir (for the compilation cache)")
	f.Int64Var(&hiddenDim, "hidden-dim", 1024, "the ffn experts' hidden_dim")
	f.IntVar(&clients, "clients", 64, "concurrent clients")
	f.IntVar(&minRows, "min-rows", 1, "fewest rows per request")
	f.IntVar(&maxRows, "max-rows", 16, "most rows per request")
	f.DurationVar(&duration, "duration", 10*time.Second, "measured time per mode (plus a quarter of it to warm up)")
	f.StringSliceVar(&dtypes, "dtype", []string{"float32"}, "wire dtypes to compare, comma-separated: float32, float16, bfloat16")
	f.StringVar(&module, "module", "ffn-c", "expert module: a .wasm file, or a built-in example ("+strings.Join(wasmexperts.BuiltinNames(), ", ")+")")
	f.BoolVar(&child, "child", false, "serve from a `moehost serve` child process and report its CPU time per request")
	f.StringVar(&serverProfiles, "server-profiles", "", "with --child, a directory where the child writes its CPU and allocation profiles of each mode")
	f.StringSliceVar(&serverExes, "server-exe", nil, "with --child, the moehost executables to serve from (default this one), repeated or comma-separated: one load generator measures each in turn, --rounds times")
	cmp.register(f)
	return cmd
}

// benchChild starts `moehost serve` (exe, or this executable) as a child
// on a free loopback port, with no DHT, waits until it answers, drives it
// with cfg,
// and reads its CPU time from /proc at both ends of the measured window.
// serveArgs are more flags for the child (its profiles). It also returns
// the mean rows of the forward batches that the load made, from the
// experts' pool counters (Info).
func benchChild(ctx context.Context, exe, pattern, module, dataDir string, hidden int64, serveArgs []string, cfg loadgen.Config) (loadgen.Result, float64, error) {
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return loadgen.Result{}, 0, err
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return loadgen.Result{}, 0, err
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.CommandContext(ctx, exe, "serve", "--listen", addr, "--data-dir", filepath.Join(dataDir, "bench-child"),
		"--experts", pattern, "--module", module, "--hidden-dim", strconv.FormatInt(hidden, 10),
		"--no-dht", "--no-checkpoints", "--log-level", "warn", "--queue-size", "65536")
	cmd.Args = append(cmd.Args, serveArgs...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return loadgen.Result{}, 0, fmt.Errorf("starting moehost serve: %w", err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	ready := time.Now().Add(2 * time.Minute)
	for {
		err := checkBenchSchema(ctx, addr, cfg.Experts[0], hidden)
		if err == nil {
			break
		}
		if time.Now().After(ready) {
			return loadgen.Result{}, 0, fmt.Errorf("moehost serve did not answer on %s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cfg.Addr = addr
	pid := cmd.Process.Pid
	cfg.ServerCPU = func() (time.Duration, error) { return loadgen.ProcessCPU(pid) }
	res := loadgen.Run(ctx, cfg)
	rows, batches, err := forwardBatches(ctx, addr, cfg.Experts)
	if err != nil || batches == 0 {
		return res, 0, err
	}
	return res, float64(rows) / float64(batches), nil
}

// forwardBatches adds up the rows and batches of the experts' forward
// pools.
func forwardBatches(ctx context.Context, addr string, uids []string) (rows, batches int64, err error) {
	c := client.New(addr)
	defer c.Close()
	for _, uid := range uids {
		info, err := c.Expert(uid).Info(ctx)
		if err != nil {
			return 0, 0, fmt.Errorf("reading %q's batch counters: %w", uid, err)
		}
		rows += info.GetForwardPool().GetSamples()
		batches += info.GetForwardPool().GetBatches()
	}
	return rows, batches, nil
}

// benchMode serves the experts with lim and drives them with cfg.
func benchMode(ctx context.Context, uids []string, dataDir string, src host.ModuleSource, hidden int64, lim host.BatchLimits, cfg loadgen.Config) (loadgen.Result, error) {
	experts := make([]host.ExpertConfig, len(uids))
	for i, uid := range uids {
		experts[i] = host.ExpertConfig{UID: uid, Module: src, Config: map[string]int64{"hidden_dim": hidden}}
	}
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(dataDir), host.WithExperts(experts...), host.WithBatching(lim), deviceEnv())
	if err != nil {
		return loadgen.Result{}, err
	}
	if err := srv.Start(ctx); err != nil {
		return loadgen.Result{}, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	cfg.Addr = srv.Addr()
	if err := checkBenchSchema(ctx, cfg.Addr, uids[0], hidden); err != nil {
		return loadgen.Result{}, err
	}
	return loadgen.Run(ctx, cfg), nil
}

// checkBenchSchema fails unless the expert takes what the load sends: one
// float32 [-1, hidden] input.
func checkBenchSchema(ctx context.Context, addr, uid string, hidden int64) error {
	c := client.New(addr)
	defer c.Close()
	info, err := c.Expert(uid).Info(ctx)
	if err != nil {
		return err
	}
	in := info.GetInputs()
	if len(in) != 1 || in[0].GetDtype() != moehostv1.DType_DTYPE_FLOAT32 || !slices.Equal(in[0].GetShape(), []int64{-1, hidden}) {
		return fmt.Errorf("bench sends one float32 [-1,%d] input; the module takes %v", hidden, in)
	}
	return nil
}

// parseWireDTypes parses --dtype.
func parseWireDTypes(names []string) ([]abi.DType, error) {
	var out []abi.DType
	for _, n := range names {
		switch n {
		case "float32":
			out = append(out, abi.DTypeFloat32)
		case "float16":
			out = append(out, abi.DTypeFloat16)
		case "bfloat16":
			out = append(out, abi.DTypeBFloat16)
		default:
			return nil, fmt.Errorf("--dtype %q: want float32, float16 or bfloat16", n)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--dtype: name at least one dtype")
	}
	return out, nil
}

// rowsPerReq is the mean rows of a successful request.
func rowsPerReq(r loadgen.Result) float64 {
	if n := r.Requests - r.Errors; n > 0 {
		return float64(r.Rows) / float64(n)
	}
	return 1
}

// serverLabel names a --server-exe in the table: its file name, or this
// build for the default.
func serverLabel(exes []string, i int) string {
	exe := exes[i]
	if exe == "" {
		return "this build"
	}
	// Two builds of one name (a/moehost, b/moehost) are told apart by
	// the paths as given.
	for j, other := range exes {
		if j != i && other != "" && filepath.Base(other) == filepath.Base(exe) {
			return exe
		}
	}
	return filepath.Base(exe)
}

// childMedians is one line per build: the median requests/s and server
// CPU-µs per request of its rounds, and both against the first build's.
func childMedians(mode string, exes []string, runs [][]loadgen.Result) string {
	var b strings.Builder
	var base [2]float64
	for i, rs := range runs {
		rps := make([]float64, len(rs))
		cpu := make([]float64, len(rs))
		for j, r := range rs {
			rps[j] = r.RequestsPerSecond()
			cpu[j] = float64(r.ServerCPUPerRequest()) / float64(time.Microsecond)
		}
		med := [2]float64{medianOf(rps), medianOf(cpu)}
		fmt.Fprintf(&b, "%s, %s: %.0f requests/s, %.0f server CPU-µs per request", mode, serverLabel(exes, i), med[0], med[1])
		if i == 0 {
			base = med
		} else if base[0] > 0 && base[1] > 0 {
			fmt.Fprintf(&b, " (%.2f× the requests/s and %.2f× the CPU per request of %s)", med[0]/base[0], med[1]/base[1], serverLabel(exes, 0))
		}
		if i < len(runs)-1 {
			b.WriteByte('\n')
		}
	}
	return b.String()
}
