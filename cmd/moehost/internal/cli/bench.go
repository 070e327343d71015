package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/moehost/moehost/cmd/moehost/internal/loadgen"
	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
)

func benchCmd(stdout io.Writer) *cobra.Command {
	var (
		pattern, dataDir          string
		hiddenDim                 int64
		clients, minRows, maxRows int
		duration                  time.Duration
		cmp                       compareFlags
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
forward and forward+backward+Adam, and print samples/s with the ratios.`,
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
			modes := []struct {
				name string
				lim  host.BatchLimits
			}{
				{"batching", host.BatchLimits{QueueSize: 1 << 16}},
				{"no batching (max 1)", host.BatchLimits{MaxBatchSize: 1, QueueSize: 1 << 16}},
			}
			fmt.Fprintf(stdout, "%d clients, %d–%d rows per request, experts %s (hidden_dim %d), %v per mode\n\n",
				clients, minRows, maxRows, pattern, hiddenDim, duration)
			fmt.Fprintln(stdout, loadgen.Header)
			var rates []float64
			for _, m := range modes {
				res, err := benchMode(cmd.Context(), uids, dataDir, hiddenDim, m.lim, loadgen.Config{
					Experts: uids, Hidden: int(hiddenDim), Clients: clients,
					MinRows: minRows, MaxRows: maxRows, Duration: duration,
				})
				if err != nil {
					return fmt.Errorf("%s: %w", m.name, err)
				}
				fmt.Fprintln(stdout, res.Row(m.name))
				if res.FirstError != nil {
					fmt.Fprintf(os.Stderr, "%s: first error: %v\n", m.name, res.FirstError)
				}
				rates = append(rates, res.RowsPerSecond())
			}
			if rates[1] > 0 {
				fmt.Fprintf(stdout, "\nbatching gives %.1f× the throughput of no batching\n", rates[0]/rates[1])
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
	cmp.register(f)
	return cmd
}

// benchMode serves the experts with lim and drives them with cfg.
func benchMode(ctx context.Context, uids []string, dataDir string, hidden int64, lim host.BatchLimits, cfg loadgen.Config) (loadgen.Result, error) {
	experts := make([]host.ExpertConfig, len(uids))
	for i, uid := range uids {
		experts[i] = host.ExpertConfig{UID: uid, Module: host.ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": hidden}}
	}
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(dataDir), host.WithExperts(experts...), host.WithBatching(lim))
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
	return loadgen.Run(ctx, cfg), nil
}
