package gpuhost

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/moehost/moehost/gpuhost/internal/cpu"
)

// TestResidualAddKernels checks addRepeat, the residual add, at every
// width this CPU runs: dst = src + small repeated, exactly (a float32
// add is the same in every lane), on repeat lengths with and without runs
// of 16, a run of 8 after them and tails, in place and across the thread
// split.
func TestResidualAddKernels(t *testing.T) {
	t.Parallel()
	ran := map[cpu.Path]bool{}
	for _, p := range rowWidths() {
		for _, ns := range []int{1, 7, 8, 9, 16, 24, 31, 40, 47, 1000} {
			// 2·grainCheap elements split across the two threads.
			for _, reps := range []int{1, 3, 2 * grainCheap / ns} {
				for _, inPlace := range []bool{false, true} {
					t.Run(fmt.Sprintf("%v/ns=%d/reps=%d/inplace=%t", p, ns, reps, inPlace), func(t *testing.T) {
						d := widthDevice(2, p)
						rng := rand.New(rand.NewPCG(uint64(ns), uint64(reps)))
						xs, ss := make([]float32, ns*reps), make([]float32, ns)
						for i := range xs {
							xs[i] = float32(rng.Float64()*2 - 1)
						}
						for i := range ss {
							ss[i] = float32(rng.Float64()*2 - 1)
						}
						x, _ := d.FromFloat32([]int{reps, ns}, xs)
						s, _ := d.FromFloat32([]int{ns}, ss)
						y := x
						if !inPlace {
							y, _ = d.Zeros(x.dt, x.shape)
						}
						if err := d.addRepeat(y, x, s); err != nil {
							t.Fatal(err)
						}
						for i, v := range y.f32() {
							if want := xs[i] + ss[i%ns]; v != want {
								t.Fatalf("y[%d] = %g, want %g", i, v, want)
							}
						}
						ran[p] = true
					})
				}
			}
		}
	}
	requireWidthRan(t, ran)
}
