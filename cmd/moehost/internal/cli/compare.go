package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/spf13/pflag"

	"github.com/moehost/moehost/cmd/moehost/internal/compare"
	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
)

// compareFlags are the flags of `moehost bench --compare`.
type compareFlags struct {
	on                   bool
	batch, threads       int
	rounds               int
	seconds              time.Duration
	python, script, prof string
	minTorchGFLOPS       float64
}

func (c *compareFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&c.on, "compare", false, "compare the ffn expert with PyTorch eager instead (see make bench-compare)")
	f.IntVar(&c.batch, "batch", 256, "--compare: rows per batch")
	f.IntVar(&c.threads, "threads", 2, "--compare: threads for PyTorch and for moehost (GOMAXPROCS)")
	f.IntVar(&c.rounds, "rounds", 3, "--compare: measurement rounds per side; --child: rounds per --server-exe (default 1 with one build)")
	f.DurationVar(&c.seconds, "seconds", 3*time.Second, "--compare: measured time per mode and round")
	f.StringVar(&c.python, "python", "python3", "--compare: the Python interpreter with torch")
	f.StringVar(&c.script, "torch-script", "scripts/bench_torch_ffn.py", "--compare: the PyTorch side; empty skips it")
	f.StringVar(&c.prof, "cpuprofile", "", "write a CPU profile of the whole run (this process: with --child, the load generator) to this file")
	f.Float64Var(&c.minTorchGFLOPS, "min-torch-gflops", 20, "--compare: refuse to compare when torch's float32 GEMM runs below this many GFLOP/s (a reference BLAS)")
}

func runCompare(ctx context.Context, stdout io.Writer, c compareFlags, dataDir string, hidden int) error {
	runtime.GOMAXPROCS(c.threads)
	if c.prof != "" {
		stop, err := startCPUProfile(c.prof)
		if err != nil {
			return err
		}
		defer stop()
	}
	fmt.Fprintf(stdout, "hivemind ffn, hidden %d, batch %d, %d threads, %d rounds of %v per mode and side\n\n",
		hidden, c.batch, c.threads, c.rounds, c.seconds)
	res, err := compare.Run(ctx, compare.Config{
		Module: wasmexperts.FFN, Hidden: hidden, Batch: c.batch, Threads: c.threads,
		Rounds: c.rounds, Measure: c.seconds, Python: c.python, Script: c.script, DataDir: dataDir,
		MinTorchGFLOPS: c.minTorchGFLOPS, HostOptions: []host.Option{deviceEnv()},
	}, stdout)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nbest round of each side; ratios are to PyTorch's best, and in brackets round by round\n%s", res.Table())
	return nil
}

// startCPUProfile writes a CPU profile to path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
