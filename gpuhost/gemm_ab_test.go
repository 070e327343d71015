package gpuhost

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

var abRounds = flag.Int("abrounds", 40, "rounds")

var abShape = flag.String("abshape", "", "m,k,n,tb: one shape")

var gemmABFlag = flag.String("gemmab", "", "A/B variants of the AVX2 GEMM: comma-separated values of gemmAB")

func TestGemmAB(t *testing.T) {
	if *gemmABFlag == "" || !gemmHaveAsm {
		t.Skip("run with -gemmab")
	}
	var modes []int
	for _, f := range strings.Split(*gemmABFlag, ",") {
		var v int
		fmt.Sscan(f, &v)
		modes = append(modes, v)
	}
	shapes := []struct {
		tb      bool
		m, k, n int
	}{{false, 64, 1024, 4096}, {false, 256, 1024, 4096}, {false, 256, 4096, 1024}, {false, 1024, 1024, 1024}}
	if *abShape != "" {
		shapes = shapes[:1]
		fmt.Sscanf(*abShape, "%d,%d,%d,%t", &shapes[0].m, &shapes[0].k, &shapes[0].n, &shapes[0].tb)
	}
	for _, s := range shapes {
		rng := rand.New(rand.NewPCG(1, 2))
		a, b, c := randSlice(rng, s.m*s.k), randSlice(rng, s.k*s.n), make([]float32, s.m*s.n)
		for _, th := range []int{1, 2} {
			d := NewCPU(th).(*cpuDevice)
			flop := 2 * float64(s.m) * float64(s.n) * float64(s.k)
			best := make([][2]float64, len(modes))
			ratios := make([][]float64, len(modes))
			for range *abRounds {
				var first float64
				for i, md := range modes {
					gemmAB = md
					w, c := abRate(func() { d.gemmF32(false, s.tb, s.m, s.n, s.k, a, b, c, false) }, flop)
					best[i][0] = max(best[i][0], w)
					best[i][1] = max(best[i][1], c*float64(th))
					if i == 0 {
						first = c
					}
					ratios[i] = append(ratios[i], c/first)
				}
			}
			line := fmt.Sprintf("%dx%dx%d tb=%t %dT:", s.m, s.k, s.n, s.tb, th)
			for i, md := range modes {
				slices.Sort(ratios[i])
				line += fmt.Sprintf("  m%d %.1f/%.1f best %.3f med %.3f", md, best[i][0], best[i][1], best[i][1]/best[0][1], ratios[i][len(ratios[i])/2])
			}
			fmt.Println(line)
		}
	}
	la, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("load %s", la)
	gemmAB = 0
}

func abRate(fn func(), flop float64) (wall, cpu float64) {
	fn()
	var r0, r1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	start, n := time.Now(), 0
	for n == 0 || time.Since(start) < 20*time.Millisecond {
		fn()
		n++
	}
	el := time.Since(start).Seconds()
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	used := float64(r1.Utime.Nano()+r1.Stime.Nano()-r0.Utime.Nano()-r0.Stime.Nano()) / 1e9
	return flop * float64(n) / el / 1e9, flop * float64(n) / max(used, 1e-9) / 1e9
}
