//go:build cudaemu

package cuda

import (
	"errors"
	"io/fs"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

func openEmu(t *testing.T, cfg Config) *Context {
	t.Helper()
	c, err := Open(0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func upload(t *testing.T, c *Context, v []float32) Ptr {
	t.Helper()
	p, err := c.Alloc(int64(4 * len(v)))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CopyIn(p, unsafe.Pointer(&v[0]), int64(4*len(v))); err != nil {
		t.Fatal(err)
	}
	return p
}

func download(t *testing.T, c *Context, p Ptr, n int) []float32 {
	t.Helper()
	v := make([]float32, n)
	if err := c.CopyOut(unsafe.Pointer(&v[0]), p, int64(4*n)); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestEmuFill(t *testing.T) {
	c := openEmu(t, Config{})
	const n = 10000
	p := upload(t, c, make([]float32, n+1))
	// A grid smaller than n: the grid-stride loop must cover the rest,
	// and element n must stay untouched.
	if err := c.Launch("moe_fill_f32", Dim3{7, 1, 1}, Dim3{128, 1, 1}, 0, p, float32(2.5), int64(n)); err != nil {
		t.Fatal(err)
	}
	got := download(t, c, p, n+1)
	for i, v := range got {
		want := float32(2.5)
		if i == n {
			want = 0
		}
		if v != want {
			t.Fatalf("element %d = %v, want %v", i, v, want)
		}
	}
}

// blockSums returns the sums of in's runs of block elements.
func blockSums(in []float32, block int) []float32 {
	var out []float32
	for b := 0; b < len(in); b += block {
		var s float32
		for _, v := range in[b : b+block] {
			s += v
		}
		out = append(out, s)
	}
	return out
}

func TestEmuBarriers(t *testing.T) {
	c := openEmu(t, Config{})
	for _, block := range []int{32, 256, 1024} {
		const blocks = 5
		in := make([]float32, blocks*block)
		for i := range in {
			in[i] = float32(i%17) - 3 // small integers: every sum is exact
		}
		pin := upload(t, c, in)
		pout := upload(t, c, make([]float32, blocks))
		want := blockSums(in, block)
		if err := c.Launch("moe_emutest_blocksum", Dim3{blocks, 1, 1}, Dim3{uint32(block), 1, 1}, 0, pout, pin); err != nil {
			t.Fatal(err)
		}
		if got := download(t, c, pout, blocks); !slices.Equal(got, want) {
			t.Errorf("block %d: sums %v, want %v", block, got, want)
		}
		// Without the barriers the sums must come out wrong: the
		// emulator interleaves threads at barriers only, and not in
		// thread order.
		if err := c.Launch("moe_emutest_racy", Dim3{blocks, 1, 1}, Dim3{uint32(block), 1, 1}, 0, pout, pin); err != nil {
			t.Fatal(err)
		}
		if got := download(t, c, pout, blocks); slices.Equal(got, want) {
			t.Errorf("block %d: the kernel without barriers got the right sums %v", block, got)
		}
	}
}

// TestEmuBlockOrder checks that blocks do not run in index order, so that
// a kernel that needs block 0 to run first fails here as it may on a GPU.
func TestEmuBlockOrder(t *testing.T) {
	c := openEmu(t, Config{})
	p, err := c.Alloc(4)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Launch("moe_emutest_lastblock", Dim3{5, 3, 1}, Dim3{32, 1, 1}, 0, p); err != nil {
		t.Fatal(err)
	}
	var last int32
	if err := c.CopyOut(unsafe.Pointer(&last), p, 4); err != nil {
		t.Fatal(err)
	}
	if last == 14 {
		t.Fatalf("block %d ran last: blocks run in index order", last)
	}
}

func TestEmuIndicesAndArgs(t *testing.T) {
	c := openEmu(t, Config{})
	grid, block := Dim3{3, 2, 2}, Dim3{4, 3, 2}
	n := 3 * 2 * 2 * 4 * 3 * 2
	p, err := c.Alloc(int64(4 * n))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Launch("moe_emutest_ids", grid, block, 0, p, int64(1), uint32(2), float64(3)); err != nil {
		t.Fatal(err)
	}
	got := make([]int32, n)
	if err := c.CopyOut(unsafe.Pointer(&got[0]), p, int64(4*n)); err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != int32(i+6) {
			t.Fatalf("thread %d wrote %d, want %d", i, v, i+6)
		}
	}
	// Wrong argument types, an unknown kernel and launches past CUDA's
	// limits are refused before anything runs.
	for _, tc := range []struct {
		name, kernel string
		grid, block  Dim3
		args         []any
		want         string
	}{
		{"type", "moe_emutest_ids", grid, block, []any{p, int32(1), uint32(2), float64(3)}, `takes arguments "plud", got "piud"`},
		{"count", "moe_emutest_ids", grid, block, []any{p}, `got "p"`},
		{"unknown", "moe_nope", grid, block, nil, "no kernel named moe_nope"},
		{"block", "moe_fill_f32", Dim3{1, 1, 1}, Dim3{1025, 1, 1}, []any{p, float32(0), int64(0)}, "outside CUDA's limits"},
		{"grid", "moe_fill_f32", Dim3{1, 65536, 1}, Dim3{1, 1, 1}, []any{p, float32(0), int64(0)}, "outside CUDA's limits"},
		{"go type", "moe_fill_f32", grid, block, []any{p, float32(0.5), 7}, "argument 2 is a int"},
		{"ptx type", "moe_fill_f32", grid, block, []any{p, 0.5, int64(7)}, "argument 1 is a float64, but the parameter is .f32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Launch(tc.kernel, tc.grid, tc.block, 0, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to say %q", err, tc.want)
			}
		})
	}
}

// TestEmuBounds checks the emulator's checks on kernel arguments: a
// pointer outside every allocation is refused before the launch, and a
// kernel that writes past the end of a buffer fails the launch.
func TestEmuBounds(t *testing.T) {
	c := openEmu(t, Config{})
	p, err := c.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Launch("moe_fill_f32", Dim3{1, 1, 1}, Dim3{16, 1, 1}, 0, p, float32(1), int64(16)); err != nil {
		t.Fatalf("a fill within the buffer: %v", err)
	}
	err = c.Launch("moe_fill_f32", Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, p, float32(1), int64(17))
	if err == nil || !strings.Contains(err.Error(), "wrote past the end of argument 0's allocation") {
		t.Fatalf("a fill one float past the end: err = %v", err)
	}
	if err := c.Free(p); err != nil {
		t.Fatal(err)
	}
	err = c.Launch("moe_fill_f32", Dim3{1, 1, 1}, Dim3{16, 1, 1}, 0, p, float32(1), int64(16))
	if err == nil || !strings.Contains(err.Error(), "points outside every allocation") {
		t.Fatalf("a fill of freed memory: err = %v", err)
	}
}

func TestEmuDynamicShared(t *testing.T) {
	c := openEmu(t, Config{})
	const blocks, block = 3, 64
	in := make([]float32, blocks*block)
	for i := range in {
		in[i] = float32(i)
	}
	pin := upload(t, c, in)
	pout := upload(t, c, make([]float32, len(in)))
	if err := c.Launch("moe_emutest_dynshared", Dim3{blocks, 1, 1}, Dim3{block, 1, 1}, 4*block, pout, pin); err != nil {
		t.Fatal(err)
	}
	got := download(t, c, pout, len(in))
	for b := range blocks {
		for i := range block {
			if want := in[b*block+block-1-i]; got[b*block+i] != want {
				t.Fatalf("out[%d] = %v, want %v", b*block+i, got[b*block+i], want)
			}
		}
	}
}

func TestEmuSgemm(t *testing.T) {
	c := openEmu(t, Config{})
	const m, n, k, batch = 3, 4, 5, 2
	a := make([]float32, batch*m*k)
	b := make([]float32, k*n)
	for i := range a {
		a[i] = float32(i%7) - 2
	}
	for i := range b {
		b[i] = float32(i%5) - 1
	}
	for _, tc := range []struct {
		name   string
		ta, tb bool
	}{{"nn", false, false}, {"tn", true, false}, {"nt", false, true}, {"tt", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			cinit := make([]float32, batch*m*n)
			for i := range cinit {
				cinit[i] = float32(i)
			}
			pa, pb, pc := upload(t, c, a), upload(t, c, b), upload(t, c, cinit)
			lda, ldb := k, n
			if tc.ta {
				lda = m
			}
			if tc.tb {
				ldb = k
			}
			// b is shared by both batches (stride 0); beta 1 adds to c.
			if err := c.SgemmStridedBatched(tc.ta, tc.tb, m, n, k, 2, pa, lda, m*k, pb, ldb, 0, 1, pc, n, m*n, batch); err != nil {
				t.Fatal(err)
			}
			got := download(t, c, pc, batch*m*n)
			for q := range batch {
				for i := range m {
					for j := range n {
						var s float64
						for p := range k {
							av := a[q*m*k+i*k+p]
							if tc.ta {
								av = a[q*m*k+p*m+i]
							}
							bv := b[p*n+j]
							if tc.tb {
								bv = b[j*k+p]
							}
							s += float64(av) * float64(bv)
						}
						idx := q*m*n + i*n + j
						if want := 2*s + float64(cinit[idx]); math.Abs(float64(got[idx])-want) > 1e-4 {
							t.Fatalf("c[%d][%d][%d] = %v, want %v", q, i, j, got[idx], want)
						}
					}
				}
			}
		})
	}
}

func TestEmuMemory(t *testing.T) {
	c := openEmu(t, Config{EmuMem: 4096})
	p, err := c.Alloc(3000)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Alloc(2000); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("alloc past the emulated total: err = %v, want ErrOutOfMemory", err)
	}
	if free, total, _ := c.MemInfo(); free != 1096 || total != 4096 {
		t.Fatalf("MemInfo = %d, %d; want 1096, 4096", free, total)
	}
	if uintptr(p)%256 != 0 {
		t.Fatalf("allocation %#x is not aligned to 256", uintptr(p))
	}
	// Copies and memsets past an allocation's end are refused.
	if err := c.Memset32(p+2000, 0, 251); err == nil {
		t.Fatal("memset past the end of an allocation succeeded")
	}
	if err := c.CopyDevice(p, p+1000, 2001); err == nil {
		t.Fatal("copy past the end of an allocation succeeded")
	}
	if err := c.Memset32(p+1000, 0x3f800000, 500); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(p); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(p); err == nil {
		t.Fatal("a second free succeeded")
	}
	if _, err := c.Alloc(4000); err != nil {
		t.Fatalf("alloc after free: %v", err)
	}
}

// TestEmuRegistersEveryKernel checks that emu_kernels.h registers each
// kernel of the kernel files: a kernel without a line would fail only
// when the device first launches it.
func TestEmuRegistersEveryKernel(t *testing.T) {
	re := regexp.MustCompile(`extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(`)
	have := emuKernels()
	files, err := fs.Glob(kernelSources, "kernels/*.cu*")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, f := range files {
		src, err := fs.ReadFile(kernelSources, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			found++
			if !slices.Contains(have, m[1]) {
				t.Errorf("%s: kernel %s is not in emu_kernels.h: run go generate -tags cudaemu ./gpuhost/internal/cuda/", f, m[1])
			}
		}
	}
	if found == 0 {
		t.Fatal("found no kernels in the sources")
	}
}

// TestEmuDevices checks Config.EmuDevices: ordinals below it open, and
// one past it, or any past the default of one device, is refused.
func TestEmuDevices(t *testing.T) {
	for _, tc := range []struct {
		name    string
		devices int
		ordinal int
		ok      bool
	}{
		{name: "default", ordinal: 0, ok: true},
		{name: "default, second", ordinal: 1},
		{name: "two, second", devices: 2, ordinal: 1, ok: true},
		{name: "two, third", devices: 2, ordinal: 2},
		{name: "negative", devices: 2, ordinal: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Open(tc.ordinal, Config{EmuDevices: tc.devices})
			if (err == nil) != tc.ok {
				t.Fatalf("Open(%d) of %d devices: err = %v, want success %t", tc.ordinal, tc.devices, err, tc.ok)
			}
			if c != nil {
				c.Close()
			}
		})
	}
}
