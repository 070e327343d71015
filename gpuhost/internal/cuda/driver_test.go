//go:build cuda || cudaemu

package cuda

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/moehost/moehost/internal/benchenv"
)

// These tests hold either backend to the driver's contract: on the
// emulator under -tags cudaemu, on a GPU under -tags cuda (the device
// check, scripts/device-check.sh).

func openT(t testing.TB) *Context {
	t.Helper()
	// The device check points the binary to cuBLAS through the
	// environment; this package reads none.
	c, err := Open(0, Config{Cublas: benchenv.CUBLASPaths()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// devUpload copies v into fresh device memory.
func devUpload(t testing.TB, c *Context, v []float32) Ptr {
	t.Helper()
	p, err := c.Alloc(int64(4 * len(v)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Free(p) })
	if err := c.CopyIn(p, unsafe.Pointer(&v[0]), int64(4*len(v))); err != nil {
		t.Fatal(err)
	}
	return p
}

func devDownload(t testing.TB, c *Context, p Ptr, n int) []float32 {
	t.Helper()
	v := make([]float32, n)
	if err := c.CopyOut(unsafe.Pointer(&v[0]), p, int64(4*n)); err != nil {
		t.Fatal(err)
	}
	return v
}

func randFloats(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// TestDriverCopiesAndLaunch moves data in, across and out, sets words,
// and launches moe_fill_f32 (a Ptr, a float32 and an int64 argument) over
// part of a buffer: every element is where the contract puts it.
func TestDriverCopiesAndLaunch(t *testing.T) {
	c := openT(t)
	if c.Name() == "" {
		t.Error("the device has no name")
	}
	free, total, err := c.MemInfo()
	if err != nil || total <= 0 || free < 0 || free > total {
		t.Fatalf("MemInfo = %d free of %d, %v", free, total, err)
	}
	const n = 3000 // past one block of 256 and a few grid strides
	src := randFloats(rand.New(rand.NewPCG(1, 1)), n)
	a := devUpload(t, c, src)
	b, err := c.Alloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Free(b)
	if err := c.CopyDevice(b, a, 4*n); err != nil {
		t.Fatal(err)
	}
	got := devDownload(t, c, b, n)
	for i := range src {
		if got[i] != src[i] {
			t.Fatalf("after CopyIn and CopyDevice, element %d is %g, want %g", i, got[i], src[i])
		}
	}
	if err := c.Memset32(b, math.Float32bits(-2.5), n); err != nil {
		t.Fatal(err)
	}
	// Fill the first m elements with 7 by a kernel; the rest keep -2.5.
	const m = 2049
	if err := c.Launch("moe_fill_f32", Dim3{4, 1, 1}, Dim3{256, 1, 1}, 0, b, float32(7), int64(m)); err != nil {
		t.Fatal(err)
	}
	got = devDownload(t, c, b, n)
	for i, v := range got {
		want := float32(-2.5)
		if i < m {
			want = 7
		}
		if v != want {
			t.Fatalf("element %d is %g, want %g", i, v, want)
		}
	}
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestDriverSgemm checks Sgemm and SgemmStridedBatched on row-major
// operands against a float64 reference, with every transpose, leading
// dimensions past the minimum, and alpha and beta both in play.
func TestDriverSgemm(t *testing.T) {
	c := openT(t)
	rng := rand.New(rand.NewPCG(2, 3))
	const m, n, k, pad = 37, 29, 45, 3
	for _, ta := range []bool{false, true} {
		for _, tb := range []bool{false, true} {
			for _, batch := range []int{0, 3} { // 0: plain Sgemm
				name := fmt.Sprintf("ta=%v/tb=%v/batch=%d", ta, tb, batch)
				t.Run(name, func(t *testing.T) {
					ar, ac := m, k
					if ta {
						ar, ac = k, m
					}
					br, bc := k, n
					if tb {
						br, bc = n, k
					}
					lda, ldb, ldc := ac+pad, bc+pad, n+pad
					nb := max(batch, 1)
					// B is shared by every batch (stride 0) to check
					// the broadcast; A and C have their own.
					strideA, strideC := int64(ar*lda), int64(m*ldc)
					av := randFloats(rng, nb*ar*lda)
					bv := randFloats(rng, br*ldb)
					cv := randFloats(rng, nb*m*ldc)
					const alpha, beta = 1.5, -0.75
					want := make([]float64, len(cv))
					for q := range nb {
						for i := range m {
							for j := range ldc {
								idx := q*int(strideC) + i*ldc + j
								if j >= n {
									want[idx] = float64(cv[idx]) // padding untouched
									continue
								}
								var s float64
								for l := range k {
									var x, y float32
									if ta {
										x = av[q*int(strideA)+l*lda+i]
									} else {
										x = av[q*int(strideA)+i*lda+l]
									}
									if tb {
										y = bv[j*ldb+l]
									} else {
										y = bv[l*ldb+j]
									}
									s += float64(x) * float64(y)
								}
								want[idx] = alpha*s + beta*float64(cv[idx])
							}
						}
					}
					ap, bp, cp := devUpload(t, c, av), devUpload(t, c, bv), devUpload(t, c, cv)
					var err error
					if batch == 0 {
						err = c.Sgemm(ta, tb, m, n, k, alpha, ap, lda, bp, ldb, beta, cp, ldc)
					} else {
						err = c.SgemmStridedBatched(ta, tb, m, n, k, alpha, ap, lda, strideA, bp, ldb, 0, beta, cp, ldc, strideC, batch)
					}
					if err != nil {
						t.Fatal(err)
					}
					got := devDownload(t, c, cp, len(cv))
					for i := range want {
						if d := math.Abs(float64(got[i]) - want[i]); d > 1e-4*math.Max(1, math.Abs(want[i])) {
							t.Fatalf("element %d (row %d col %d) is %g, want %g", i, (i%int(strideC))/ldc, i%ldc, got[i], want[i])
						}
					}
				})
			}
		}
	}
}

// TestDriverErrors checks the errors callers branch on or read.
func TestDriverErrors(t *testing.T) {
	c := openT(t)
	if _, err := c.Alloc(1 << 50); !errors.Is(err, ErrOutOfMemory) {
		t.Errorf("Alloc of 1 PiB: %v, want ErrOutOfMemory", err)
	}
	p, err := c.Alloc(1024)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Free(p)
	if err := c.Launch("moe_no_such_kernel", Dim3{1, 1, 1}, Dim3{1, 1, 1}, 0, p); err == nil || !strings.Contains(err.Error(), "moe_no_such_kernel") {
		t.Errorf("launching an unknown kernel: %v, want an error naming it", err)
	}
	// A Go int is not a kernel argument type: its size is ambiguous.
	if err := c.Launch("moe_fill_f32", Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, p, float32(1), 256); err == nil || !strings.Contains(err.Error(), "argument 2") {
		t.Errorf("launching with an int argument: %v, want an error naming argument 2", err)
	}
	// The device still works after the refusals.
	if err := c.Launch("moe_fill_f32", Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, p, float32(1), int64(256)); err != nil {
		t.Errorf("a good launch after the errors: %v", err)
	}
	if err := c.Sync(); err != nil {
		t.Errorf("Sync after the errors: %v", err)
	}
}

// gemmShapes are BenchmarkSgemm's shapes: MxNxK:AB, A and B each N or T
// (transposed). The defaults are the GEMMs of hivemind's ffn at hidden
// 1024 and batch 4096: x·W1ᵀ, h·W2ᵀ, and a weight gradient gyᵀ·h.
var gemmShapes = flag.String("gemm.shapes", "4096x4096x1024:NT,4096x1024x4096:NT,4096x1024x4096:TN", "BenchmarkSgemm's shapes, MxNxK:AB with A, B in {N,T}, comma-separated")

type gemmShape struct {
	m, n, k int
	ta, tb  bool
}

func (s gemmShape) String() string {
	op := func(t bool) string {
		if t {
			return "T"
		}
		return "N"
	}
	return fmt.Sprintf("%dx%dx%d_%s%s", s.m, s.n, s.k, op(s.ta), op(s.tb))
}

func parseGemmShapes(s string) ([]gemmShape, error) {
	var out []gemmShape
	for _, f := range strings.Split(s, ",") {
		dims, ops, ok := strings.Cut(strings.TrimSpace(f), ":")
		parts := strings.Split(dims, "x")
		if !ok || len(parts) != 3 || len(ops) != 2 || strings.Trim(ops, "NT") != "" {
			return nil, fmt.Errorf("gemm shape %q: want MxNxK:AB", f)
		}
		var d [3]int
		for i, p := range parts {
			v, err := strconv.Atoi(p)
			if err != nil || v <= 0 {
				return nil, fmt.Errorf("gemm shape %q: bad dimension %q", f, p)
			}
			d[i] = v
		}
		out = append(out, gemmShape{m: d[0], n: d[1], k: d[2], ta: ops[0] == 'T', tb: ops[1] == 'T'})
	}
	return out, nil
}

// BenchmarkSgemm times Sgemm through the driver on random operands and
// reports TFLOP/s (2·M·N·K a call); the clock stops after a Sync. The
// device check compares it with torch.matmul at the same shapes
// (scripts/torch_cuda_peer.py).
func BenchmarkSgemm(b *testing.B) {
	shapes, err := parseGemmShapes(*gemmShapes)
	if err != nil {
		b.Fatal(err)
	}
	c := openT(b)
	rng := rand.New(rand.NewPCG(4, 5))
	for _, s := range shapes {
		b.Run(s.String(), func(b *testing.B) {
			ap := devUpload(b, c, randFloats(rng, s.m*s.k))
			bp := devUpload(b, c, randFloats(rng, s.k*s.n))
			cp, err := c.Alloc(int64(4 * s.m * s.n))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Free(cp)
			lda, ldb := s.k, s.n
			if s.ta {
				lda = s.m
			}
			if s.tb {
				ldb = s.k
			}
			gemm := func() {
				if err := c.Sgemm(s.ta, s.tb, s.m, s.n, s.k, 1, ap, lda, bp, ldb, 0, cp, s.n); err != nil {
					b.Fatal(err)
				}
			}
			gemm() // warm-up: cuBLAS picks and loads its kernel
			if err := c.Sync(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				gemm()
			}
			if err := c.Sync(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(2*float64(s.m)*float64(s.n)*float64(s.k)*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
		})
	}
}
