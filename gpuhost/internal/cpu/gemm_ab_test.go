//go:build unix

package cpu

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	abModes  = flag.String("gemmab", "", "TestGemmAB: comma-separated values of gemmAB to run against each other, e.g. 1,0")
	abShape  = flag.String("abshape", "", "TestGemmAB: one shape m,k,n,tb instead of the x·W shapes of make bench-kernels")
	abRounds = flag.Int("abrounds", 20, "TestGemmAB: rounds")
	abCaches = flag.String("abcaches", "", "TestGemmAB: semicolon-separated cache sets L1,L2,L3 (e.g. 32K,256K,2M;48K,1M,4M) whose blockings run against each other, at the first -gemmab value")
)

// parseCacheSet parses "48K,1M,4M" (bytes, with K or M).
func parseCacheSet(s string) (cacheSizes, error) {
	f := strings.Split(s, ",")
	if len(f) != 3 {
		return cacheSizes{}, fmt.Errorf("cache set %q: want L1,L2,L3", s)
	}
	var v [3]int
	for i, x := range f {
		n, ok := parseSize(x)
		if !ok || n <= 0 {
			return cacheSizes{}, fmt.Errorf("cache set %q: %q is not a size", s, x)
		}
		v[i] = n
	}
	return cacheSizes{l1: v[0], l2: v[1], l3: v[2]}, nil
}

// TestGemmAB runs variants of the AVX2 GEMM (values of gemmAB, which
// switch optimisations off) against each other in one process, in turns,
// and prints per variant the best GFLOP/s of wall time and per CPU-second
// and, against the first variant, the ratio of the bests and the median
// of the per-round ratios (paired rounds cancel slow drift in the load of
// a shared machine). It runs only with -gemmab, e.g.
//
//	go test -run TestGemmAB -gemmab 1,0 ./gpuhost/internal/cpu/
func TestGemmAB(t *testing.T) {
	if *abModes == "" || !gemmHaveAsm {
		t.Skip("run with -gemmab on a CPU with AVX2")
	}
	var modes []int
	for _, f := range strings.Split(*abModes, ",") {
		v, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("-gemmab: %v", err)
		}
		modes = append(modes, v)
	}
	type shape struct {
		m, k, n int
		tb      bool
	}
	shapes := []shape{{64, 1024, 4096, false}, {256, 1024, 4096, false}, {256, 4096, 1024, false}, {1024, 1024, 1024, false}}
	if *abShape != "" {
		var s shape
		if _, err := fmt.Sscanf(*abShape, "%d,%d,%d,%t", &s.m, &s.k, &s.n, &s.tb); err != nil {
			t.Fatalf("-abshape: %v", err)
		}
		shapes = []shape{s}
	}
	// With -abcaches the variants are blockings of the default path's
	// kernel, all at the first gemmAB value.
	kn := pathKernel(testPath())
	if kn == nil {
		t.Skip("the Go path has no assembly kernel to A/B")
	}
	saved := kn.gemmBlocking
	defer func() { gemmAB, kn.gemmBlocking = 0, saved }()
	type variant struct {
		ab    int
		block gemmBlocking
		label string
	}
	var vars []variant
	if *abCaches != "" {
		for _, cs := range strings.Split(*abCaches, ";") {
			c, err := parseCacheSet(cs)
			if err != nil {
				t.Fatalf("-abcaches: %v", err)
			}
			b := blockingFor(c, kn.mr, kn.nr)
			vars = append(vars, variant{modes[0], b, fmt.Sprintf("%s {kc:%d mc:%d nc:%d}", cs, b.kc, b.mc, b.nc)})
		}
	} else {
		for _, md := range modes {
			vars = append(vars, variant{md, saved, fmt.Sprintf("gemmAB=%d", md)})
		}
	}
	for _, s := range shapes {
		rng := rand.New(rand.NewPCG(1, 2))
		a, b, c := randSlice(rng, s.m*s.k), randSlice(rng, s.k*s.n), make([]float32, s.m*s.n)
		for _, th := range []int{1, 2} {
			d, p := &GEMM{Threads: th}, testPath()
			flop := 2 * float64(s.m) * float64(s.n) * float64(s.k)
			best := make([][2]float64, len(vars))
			ratios := make([][]float64, len(vars))
			for range *abRounds {
				var first float64
				for i, v := range vars {
					gemmAB, kn.gemmBlocking = v.ab, v.block
					w, c := gflops(func() { d.F32(p, false, s.tb, s.m, s.n, s.k, a, b, c, false) }, flop, 20*time.Millisecond)
					best[i][0] = max(best[i][0], w)
					best[i][1] = max(best[i][1], c*float64(th))
					if i == 0 {
						first = c
					}
					ratios[i] = append(ratios[i], c/first)
				}
			}
			line := fmt.Sprintf("%dx%dx%d tb=%t %dT:", s.m, s.k, s.n, s.tb, th)
			for i, v := range vars {
				slices.Sort(ratios[i])
				line += fmt.Sprintf("  %s %.1f/%.1f best %.3f med %.3f", v.label, best[i][0], best[i][1], best[i][1]/best[0][1], ratios[i][len(ratios[i])/2])
			}
			fmt.Println(line)
		}
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("load average: %s", la)
	}
}
