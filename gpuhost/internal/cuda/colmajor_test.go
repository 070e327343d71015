//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// colMajorGemm is a column-major BLAS's sgemm over one float64 memory,
// with pointers as offsets into it: C = alpha·op(A)·op(B) + beta·C.
func colMajorGemm(mem []float64, c blasCall, alpha, beta float64, cp Ptr, ldc int) {
	at := func(p Ptr, ld, i, j int) float64 { return mem[int(p)+j*ld+i] } // column-major (i, j)
	for j := range c.n {
		for i := range c.m {
			var s float64
			for l := range c.k {
				var x, y float64
				if c.ta {
					x = at(c.a, c.lda, l, i)
				} else {
					x = at(c.a, c.lda, i, l)
				}
				if c.tb {
					y = at(c.b, c.ldb, j, l)
				} else {
					y = at(c.b, c.ldb, l, j)
				}
				s += x * y
			}
			idx := int(cp) + j*ldc + i
			mem[idx] = alpha*s + beta*mem[idx]
		}
	}
}

// TestToColMajor checks the real backend's mapping of row-major GEMMs to
// cuBLAS's column-major ones (which only a GPU runs) against a
// column-major reference: every transpose, padded leading dimensions.
func TestToColMajor(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 7))
	const m, n, k, pad = 5, 7, 3, 2
	for _, ta := range []bool{false, true} {
		for _, tb := range []bool{false, true} {
			t.Run(fmt.Sprintf("ta=%v/tb=%v", ta, tb), func(t *testing.T) {
				ar, ac := m, k
				if ta {
					ar, ac = k, m
				}
				br, bc := k, n
				if tb {
					br, bc = n, k
				}
				lda, ldb, ldc := ac+pad, bc+pad, n+pad
				// One memory: A, then B, then C, each row-major.
				aOff, bOff, cOff := 0, ar*lda, ar*lda+br*ldb
				mem := make([]float64, cOff+m*ldc)
				for i := range mem {
					mem[i] = math.Round(rng.NormFloat64() * 8)
				}
				want := append([]float64(nil), mem...)
				for i := range m {
					for j := range n {
						var s float64
						for l := range k {
							x := mem[aOff+i*lda+l]
							if ta {
								x = mem[aOff+l*lda+i]
							}
							y := mem[bOff+l*ldb+j]
							if tb {
								y = mem[bOff+j*ldb+l]
							}
							s += x * y
						}
						want[cOff+i*ldc+j] = 2*s - mem[cOff+i*ldc+j]
					}
				}
				call := toColMajor(ta, tb, m, n, k, Ptr(aOff), lda, 0, Ptr(bOff), ldb, 0)
				colMajorGemm(mem, call, 2, -1, Ptr(cOff), ldc)
				for i := range want {
					if mem[i] != want[i] {
						t.Fatalf("element %d is %g, want %g", i, mem[i], want[i])
					}
				}
			})
		}
	}
	// Batched: each operand keeps its own stride through the swap.
	if g := toColMajor(false, false, 1, 1, 1, 100, 1, 11, 200, 1, 22); g.a != 200 || g.strideA != 22 || g.b != 100 || g.strideB != 11 {
		t.Errorf("strides after the swap: %+v; want B's (200, 22) first and A's (100, 11) second", g)
	}
}
