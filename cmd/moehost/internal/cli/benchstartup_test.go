package cli

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moehost/moehost/cmd/moehost/internal/loadgen"
)

// TestStartupStats checks bench-startup's figures: the median and least
// of samples, and a process's CPU time from /proc, which grows as it
// works.
func TestStartupStats(t *testing.T) {
	ss := []startupSample{{ready: 30}, {ready: 10}, {ready: 50}, {ready: 20}, {ready: 40}}
	if got := p50(ss, readyOf); got != 30 {
		t.Errorf("p50 of 10..50: %v, want 30", got)
	}
	if got := least(ss, readyOf); got != 10 {
		t.Errorf("least of 10..50: %v, want 10", got)
	}
	if got := p50(ss[:4], readyOf); got != 30 {
		t.Errorf("p50 of 30, 10, 50, 20: %v, want the upper median 30", got)
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	before, err := loadgen.ProcessTreeCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
		x++
	}
	after, err := loadgen.ProcessTreeCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("CPU time %v after 100 ms of spinning, %v before (%d spins)", after, before, x)
	}
	if !strings.Contains(cpuModel(), "(family") || numCPU() < 1 || len(strings.Fields(loadAvg())) != 3 {
		t.Errorf("machine: %q, %d CPUs, load %q", cpuModel(), numCPU(), loadAvg())
	}
}
