package gpuhost

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/moehost/moehost/gpuhost/internal/cpu"
	"github.com/moehost/moehost/internal/benchenv"
)

// testPath is the path new devices of this test binary run: the best
// one, or MOEHOST_GEMM's (export_test.go).
func testPath() cpu.Path { return NewCPU(1).(*cpuDevice).kpath() }

// TestGemmPathFromEnv fails when MOEHOST_GEMM names a path that new
// devices do not run, with WithGEMMPath or with this test binary's
// defaults: one this CPU or build lacks, or an AVX-512 kernel that failed
// its first-use check. A run that asks for a path (make test-avx512-emu
// asks for avx512) then cannot pass on the others alone.
func TestGemmPathFromEnv(t *testing.T) {
	v := os.Getenv(benchenv.GEMM)
	if v == "" {
		t.Skipf("%s is not set", benchenv.GEMM)
	}
	want, err := cpu.Named(v)
	if err != nil {
		t.Fatal(err)
	}
	if got := NewCPU(1, WithGEMMPath(v)).(*cpuDevice).kpath(); got != want {
		t.Fatalf("WithGEMMPath(%q): new devices run %v", v, got)
	}
	if got := testPath(); got != want {
		t.Fatalf("%s=%s: new devices run %v", benchenv.GEMM, v, got)
	}
	t.Logf("%s=%s: new devices run %v; this CPU and build run %v", benchenv.GEMM, v, want, cpu.Paths())
}

// TestGEMMPathFallbackWarns checks that a path the CPU and build lack
// gives the best one, and a warning through the device's logger that
// names what was asked for; a path it has warns of nothing.
func TestGEMMPathFallbackWarns(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		want       cpu.Path
		warn       bool
	}{
		{name: "unknown", path: "sse9", want: cpu.Paths()[0], warn: true},
		{name: "go", path: "go", want: cpu.PathGo},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			d := NewCPU(1, WithGEMMPath(tc.path), WithLogger(log)).(*cpuDevice)
			if got := d.kpath(); got != tc.want {
				t.Errorf("WithGEMMPath(%q) runs %v, want %v", tc.path, got, tc.want)
			}
			if warned := buf.Len() > 0 && strings.Contains(buf.String(), tc.path); warned != tc.warn {
				t.Errorf("WithGEMMPath(%q): warned %t, want %t; the log: %q", tc.path, warned, tc.warn, buf.String())
			}
		})
	}
}
