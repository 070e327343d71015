package cli

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/moehost/moehost/cmd/moehost/internal/loadgen"
	"github.com/spf13/cobra"
)

// benchStartupCmd is `moehost bench-startup`: how long `moehost serve`
// takes to become Ready, for one binary or several side by side.
func benchStartupCmd(stdout io.Writer) *cobra.Command {
	var cfg startupConfig
	cmd := &cobra.Command{
		Use:   "bench-startup [-- serve flags]",
		Short: "Measure how long `moehost serve` takes from exec to Ready",
		Long: `Start ` + "`moehost serve`" + ` (its defaults, plus any flags after --) --runs times
in each mode and print, per binary, the wall time from exec to its
"moehost serving" log line and the CPU time it had used by then (its own
and its compile children's, from /proc), as p50 and min, and the wall time
from SIGINT to exit.

Modes:
  restart  the data dir holds what the previous run left: a warm compile
           cache and a checkpoint per expert (the usual restart)
  fresh    a new data dir each run, with the warm compile cache of the
           restart runs (--compile-cache)

Each binary (--bin, repeatable; default this one) gets data dirs of its
own under --data-dir, warmed by one unmeasured run, and the runs
interleave the binaries, so that they share the machine's state. The CPU
model and the load average are printed beside the figures: compare
binaries within one run, never across runs.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg.serveArgs = args
			if len(cfg.bins) == 0 {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				cfg.bins = []string{exe}
			}
			return runBenchStartup(cmd.Context(), stdout, cfg)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&cfg.bins, "bin", nil, "moehost binary to measure, repeatable (the first is the one the ratios are of); default this one")
	f.IntVar(&cfg.runs, "runs", 10, "measured starts per binary and mode")
	f.StringSliceVar(&cfg.modes, "mode", []string{"restart", "fresh"}, "modes to measure: restart, fresh")
	f.StringVar(&cfg.dataDir, "data-dir", filepath.Join(".tmp", "bench-startup"), "directory for the servers' data dirs and compile caches (its bin* subdirectories are replaced)")
	return cmd
}

type startupConfig struct {
	bins      []string
	runs      int
	modes     []string
	dataDir   string
	serveArgs []string
}

// startupSample is one start of one binary.
type startupSample struct {
	ready, cpu, stop time.Duration
}

func runBenchStartup(ctx context.Context, w io.Writer, cfg startupConfig) error {
	if cfg.runs < 1 {
		return errors.New("--runs must be at least 1")
	}
	for _, m := range cfg.modes {
		if m != "restart" && m != "fresh" {
			return fmt.Errorf("--mode %q: want restart or fresh", m)
		}
	}
	dirs := make([]string, len(cfg.bins))
	for i, b := range cfg.bins {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("--bin: %w", err)
		}
		dirs[i] = filepath.Join(cfg.dataDir, fmt.Sprintf("bin%d", i))
		if err := os.RemoveAll(dirs[i]); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "cpu: %s, %d logical CPUs\n", cpuModel(), numCPU())
	fmt.Fprintf(w, "load average before: %s\n", loadAvg())
	// Warm each binary's compile cache and leave its checkpoints.
	for i, b := range cfg.bins {
		if _, err := startOnce(ctx, b, dirs[i], "restart", cfg.serveArgs); err != nil {
			return fmt.Errorf("warming %s: %w", b, err)
		}
	}
	samples := map[string][][]startupSample{}
	for _, m := range cfg.modes {
		samples[m] = make([][]startupSample, len(cfg.bins))
	}
	for r := range cfg.runs {
		for _, m := range cfg.modes {
			// Rotate the order, so that no binary always runs first.
			for k := range cfg.bins {
				i := (k + r) % len(cfg.bins)
				s, err := startOnce(ctx, cfg.bins[i], dirs[i], m, cfg.serveArgs)
				if err != nil {
					return fmt.Errorf("%s, %s run %d: %w", cfg.bins[i], m, r+1, err)
				}
				samples[m][i] = append(samples[m][i], s)
			}
		}
	}
	fmt.Fprintf(w, "load average after:  %s\n\n", loadAvg())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tbinary\tready p50\tready min\tcpu p50\tcpu min\tstop p50\t")
	for _, m := range cfg.modes {
		for i, b := range cfg.bins {
			ss := samples[m][i]
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", m, b,
				ms(p50(ss, readyOf)), ms(least(ss, readyOf)), ms(p50(ss, cpuOf)), ms(least(ss, cpuOf)), ms(p50(ss, stopOf)))
		}
	}
	tw.Flush()
	if len(cfg.bins) > 1 {
		fmt.Fprintln(w)
		for _, m := range cfg.modes {
			first := samples[m][0]
			for i, b := range cfg.bins[1:] {
				other := samples[m][i+1]
				fmt.Fprintf(w, "%s: %s against %s: ready p50 %.2f×, cpu p50 %.2f×\n", m, cfg.bins[0], b,
					ratio(p50(first, readyOf), p50(other, readyOf)), ratio(p50(first, cpuOf), p50(other, cpuOf)))
			}
		}
	}
	fmt.Fprintf(w, "(%d runs per binary and mode; CPU time has the kernel's 10 ms tick)\n", cfg.runs)
	return nil
}

// startOnce starts bin serving from its data dir under dir in mode, waits
// for its "moehost serving" line, reads its CPU time, then stops it with
// SIGINT and waits for it to exit.
func startOnce(ctx context.Context, bin, dir, mode string, serveArgs []string) (startupSample, error) {
	dataDir := filepath.Join(dir, "restart")
	if mode == "fresh" {
		dataDir = filepath.Join(dir, "fresh")
		if err := os.RemoveAll(dataDir); err != nil {
			return startupSample{}, err
		}
	}
	args := append([]string{"serve", "--listen", "127.0.0.1:*", "--data-dir", dataDir,
		"--compile-cache", filepath.Join(dir, "cache"), "--log-level", "info", "--log-format", "text"}, serveArgs...)
	cmd := exec.CommandContext(ctx, bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return startupSample{}, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return startupSample{}, err
	}
	ready := make(chan time.Duration, 1)
	var tail bytes.Buffer // the last lines, for errors
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			if !sent && strings.Contains(line, `msg="moehost serving"`) {
				ready <- time.Since(start)
				sent = true
			}
			if tail.Len() > 8<<10 {
				tail.Reset()
			}
			tail.WriteString(line + "\n")
		}
		io.Copy(io.Discard, stderr)
	}()
	var s startupSample
	select {
	case s.ready = <-ready:
	case <-drained:
		cmd.Wait()
		return s, fmt.Errorf("moehost serve exited before Ready: %s", tail.String())
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		<-drained
		cmd.Wait()
		return s, fmt.Errorf("moehost serve was not Ready in 2 minutes: %s", tail.String())
	}
	s.cpu, err = loadgen.ProcessTreeCPU(cmd.Process.Pid)
	if err != nil {
		cmd.Process.Kill()
		<-drained
		cmd.Wait()
		return s, err
	}
	stopAt := time.Now()
	cmd.Process.Signal(os.Interrupt)
	<-drained
	err = cmd.Wait()
	s.stop = time.Since(stopAt)
	if err != nil {
		return s, fmt.Errorf("moehost serve: %w: %s", err, tail.String())
	}
	return s, nil
}

func readyOf(s startupSample) time.Duration { return s.ready }
func cpuOf(s startupSample) time.Duration   { return s.cpu }
func stopOf(s startupSample) time.Duration  { return s.stop }

// p50 is the median of f over ss (the upper one of an even count).
func p50(ss []startupSample, f func(startupSample) time.Duration) time.Duration {
	if len(ss) == 0 {
		return 0
	}
	v := make([]time.Duration, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	return medianOf(v)
}

// medianOf is the median of v (the upper one of an even count), 0 for
// none; v is sorted in place.
func medianOf[T cmp.Ordered](v []T) T {
	var zero T
	if len(v) == 0 {
		return zero
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func least(ss []startupSample, f func(startupSample) time.Duration) time.Duration {
	if len(ss) == 0 {
		return 0
	}
	m := f(ss[0])
	for _, s := range ss[1:] {
		m = min(m, f(s))
	}
	return m
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// cpuModel is the first processor's model name, family and model from
// /proc/cpuinfo, as lscpu prints them, and whether it has AVX-512.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	fields := map[string]string{}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			break // the first processor's block ends at a blank line
		}
		fields[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	avx := "AVX2"
	if flags := strings.Fields(fields["flags"]); slices.Contains(flags, "avx512f") {
		avx = "AVX-512"
	} else if !slices.Contains(flags, "avx2") {
		avx = "no AVX2"
	}
	return fmt.Sprintf("%s (family %s, model %s, %s)", fields["model name"], fields["cpu family"], fields["model"], avx)
}

// numCPU counts /proc/cpuinfo's processors.
func numCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	n := 0
	for line := range strings.Lines(string(b)) {
		if k, _, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "processor" {
			n++
		}
	}
	return n
}

// loadAvg is /proc/loadavg's three load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
