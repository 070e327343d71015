package gpuhost

import (
	"bytes"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moehost/moehost/internal/benchenv"
	"github.com/moehost/moehost/internal/testing/ref"
)

// testPath is the path new devices of this test binary run: the best
// one, or MOEHOST_GEMM's (export_test.go).
func testPath() gemmPath { return NewCPU(1).(*cpuDevice).kpath() }

func TestParsePath(t *testing.T) {
	best := gemmPaths()[0]
	for _, tc := range []struct {
		v       string
		want    gemmPath
		wantErr bool
	}{
		{v: "", want: best},
		{v: "go", want: pathGo},
		{v: "GO", want: pathGo},
		{v: "sse9", want: best, wantErr: true},
	} {
		got, err := parsePath(tc.v)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("parsePath(%q) = %v, %v; want %v, error %t", tc.v, got, err, tc.want, tc.wantErr)
		}
	}
	for _, p := range []gemmPath{pathAVX2, pathAVX512} {
		supported := false
		for _, q := range gemmPaths() {
			supported = supported || q == p
		}
		got, err := parsePath(p.String())
		if supported != (err == nil && got == p) {
			t.Errorf("parsePath(%q) = %v, %v; the CPU supports it: %t", p, got, err, supported)
		}
	}
}

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
	want, err := parsePath(v)
	if err != nil {
		t.Fatal(err)
	}
	if got := NewCPU(1, WithGEMMPath(v)).(*cpuDevice).kpath(); got != want {
		t.Fatalf("WithGEMMPath(%q): new devices run %v", v, got)
	}
	if got := testPath(); got != want {
		t.Fatalf("%s=%s: new devices run %v", benchenv.GEMM, v, got)
	}
	t.Logf("%s=%s: new devices run %v; this CPU and build run %v", benchenv.GEMM, v, want, gemmPaths())
}

// TestGEMMPathFallbackWarns checks that a path the CPU and build lack
// gives the best one, and a warning through the device's logger that
// names what was asked for; a path it has warns of nothing.
func TestGEMMPathFallbackWarns(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		want       gemmPath
		warn       bool
	}{
		{name: "unknown", path: "sse9", want: gemmPaths()[0], warn: true},
		{name: "go", path: "go", want: pathGo},
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

// TestCheckGemm checks the first-use check that guards the AVX-512
// kernel: every path this CPU runs passes it, and a GEMM that is wrong in
// one element of one case fails it.
func TestCheckGemm(t *testing.T) {
	for _, p := range gemmPaths() {
		if err := checkGemm(cpuOnPath(1, p)); err != nil {
			t.Errorf("%v: %v", p, err)
		}
	}
	good := &cpuDevice{threads: 1, minWork: gemmMinWork, path: pathGo}
	bad := &cpuDevice{threads: 1, minWork: gemmMinWork, path: pathGo}
	bad.sgemm = func(threads int, ta, tb bool, m, n, k int, a, b, c []float32, acc bool) {
		good.gemmF32(ta, tb, m, n, k, a, b, c, acc)
		if ta && tb && acc {
			c[m*n-1] += 0.01
		}
	}
	if err := checkGemm(bad); err == nil {
		t.Error("a GEMM off by 0.01 in one element passed the check")
	}
}

// TestGemmBias checks the bias epilogue (linear's x·Wᵀ + b) on every path,
// on shapes with edge tiles, several k blocks and both thread splits.
func TestGemmBias(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	for _, s := range []struct{ m, n, k int }{{1, 1, 1}, {5, 17, 3}, {6, 16, 40}, {29, 47, 300}, {9, 29, 31}, {15, 200, 600}, {130, 70, 64}, {300, 40, 40}} {
		a, b, bias := randSlice(rng, s.m*s.k), randSlice(rng, s.k*s.n), randSlice(rng, s.n)
		want := ref.MatMul(false, true, s.m, s.n, s.k, a, b)
		for i := range want {
			want[i] += float64(bias[i%s.n])
		}
		for _, v := range gemmVariants(t) {
			d := v.device()
			x, _ := d.FromFloat32([]int{s.m, s.k}, a)
			w, _ := d.FromFloat32([]int{s.n, s.k}, b)
			bt, _ := d.FromFloat32([]int{s.n}, bias)
			y, _ := d.Zeros(x.dt, []int{s.m, s.n})
			if err := d.linear(s.m, s.n, s.k, x, w, bt, y); err != nil {
				t.Fatal(err)
			}
			if e := ref.RelErr(y.f32(), want); e > 1e-5 {
				t.Errorf("%s: m=%d n=%d k=%d: relative error %.3g", v.name, s.m, s.n, s.k, e)
			}
		}
	}
}

// pathKernel is p's assembly kernel; nil for the Go path.
func pathKernel(p gemmPath) *asmKernel {
	switch p {
	case pathAVX2:
		return avx2Kernel()
	case pathAVX512:
		return avx512Kernel()
	}
	return nil
}

func TestReadCaches(t *testing.T) {
	dir := t.TempDir()
	write := func(idx, name, v string) {
		p := filepath.Join(dir, idx)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range [][4]string{
		{"index0", "1", "Data", "48K"},
		{"index1", "1", "Instruction", "32K"},
		{"index2", "2", "Unified", "2048K"},
		{"index3", "3", "Unified", "64M"},
	} {
		write(c[0], "level", c[1])
		write(c[0], "type", c[2])
		write(c[0], "size", c[3])
		write(c[0], "shared_cpu_list", "0")
	}
	write("index3", "shared_cpu_list", "0-7,16-23")
	got := readCaches(dir)
	want := cacheSizes{l1: 48 << 10, l2: 2 << 20, l3: 64 << 20 / 16}
	if got != want {
		t.Errorf("readCaches = %+v, want %+v", got, want)
	}
	if got := readCaches(filepath.Join(dir, "missing")); got != (cacheSizes{}) {
		t.Errorf("readCaches of nothing = %+v, want none", got)
	}
	if got := mergeCaches(cacheSizes{l2: 1 << 20}, cacheSizes{l1: 48 << 10, l2: 2 << 20}, fallbackCaches); got != (cacheSizes{l1: 48 << 10, l2: 1 << 20, l3: fallbackCaches.l3}) {
		t.Errorf("mergeCaches = %+v: want each level from the first set that has it", got)
	}
	b := blockingFor(cacheSizes{l1: 32 << 10, l2: 512 << 10, l3: 16 << 20}, asmMR, asmNR)
	if b.kc != 256 || b.mc%asmMR != 0 || b.nc%asmNR != 0 || b.fuseNC%asmNR != 0 {
		t.Errorf("blocking for a Zen 3 core = %+v: want KC 256 and whole tiles", b)
	}
}

// fakeCPUID answers CPUID from a table of (leaf, sub) → registers; a leaf
// it lacks reads as zeros, as a reserved one does.
type fakeCPUID map[[2]uint32][4]uint32

func (f fakeCPUID) cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32) {
	r := f[[2]uint32{leaf, sub}]
	return r[0], r[1], r[2], r[3]
}

// vendorRegs is leaf 0: the highest leaf and the vendor string in EBX,
// EDX, ECX.
func vendorRegs(maxLeaf uint32, vendor string) [4]uint32 {
	le := func(s string) uint32 { return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24 }
	return [4]uint32{maxLeaf, le(vendor[0:4]), le(vendor[8:12]), le(vendor[4:8])}
}

// detCache encodes one cache of the deterministic leaf (Intel's 4, AMD's
// 0x8000001D) as the SDM lays it out.
func detCache(typ, level, shared, ways, parts, line, sets uint32) [4]uint32 {
	return [4]uint32{typ | level<<5 | (shared-1)<<14, (ways-1)<<22 | (parts-1)<<12 | (line - 1), sets - 1, 0}
}

func TestCPUIDCaches(t *testing.T) {
	intel := fakeCPUID{
		{0, 0}: vendorRegs(0x1f, "GenuineIntel"),
		// A Sapphire Rapids core: 48 KiB L1d, 32 KiB L1i, 2 MiB L2 (SMT
		// pairs), 105 MiB L3 shared by 128 IDs.
		{4, 0}: detCache(1, 1, 2, 12, 1, 64, 64),
		{4, 1}: detCache(2, 1, 2, 8, 1, 64, 64),
		{4, 2}: detCache(3, 2, 2, 16, 1, 64, 2048),
		{4, 3}: detCache(3, 3, 128, 15, 1, 64, 114688),
	}
	amdDet := fakeCPUID{
		{0, 0}:          vendorRegs(0x10, "AuthenticAMD"),
		{0x80000000, 0}: {0x80000021},
		{0x8000001D, 0}: detCache(1, 1, 1, 12, 1, 64, 64),
		{0x8000001D, 1}: detCache(3, 2, 1, 16, 1, 64, 1024),
		{0x8000001D, 2}: detCache(3, 3, 16, 16, 1, 64, 32768),
	}
	// A firecracker VM on Zen 5 (these are its registers): no
	// deterministic leaf, and 0x80000006's L3 is the package's 508 MiB.
	amdLegacy := fakeCPUID{
		{0, 0}:          vendorRegs(0xd, "AuthenticAMD"),
		{0x80000000, 0}: {0x80000021},
		{0x80000005, 0}: {0xff60ff40, 0xff60ff40, 0x300c0140, 0x20080140},
		{0x80000006, 0}: {0x40802040, 0x60804040, 0x04006140, 0x0fe09140},
	}
	for _, c := range []struct {
		name string
		f    func(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
		ncpu int
		want cacheSizes
	}{
		{"intel 2 vCPUs", intel.cpuid, 2, cacheSizes{l1: 24 << 10, l2: 1 << 20, l3: 105 << 20 / 128}},
		{"intel 1 vCPU", intel.cpuid, 1, cacheSizes{l1: 48 << 10, l2: 2 << 20, l3: 105 << 20 / 128}},
		{"amd 0x8000001D", amdDet.cpuid, 2, cacheSizes{l1: 48 << 10, l2: 1 << 20, l3: 2 << 20}},
		{"amd legacy", amdLegacy.cpuid, 2, cacheSizes{l1: 48 << 10, l2: 1 << 20}},
		{"intel, no leaf 4", fakeCPUID{{0, 0}: vendorRegs(2, "GenuineIntel")}.cpuid, 2, cacheSizes{}},
		{"no cpuid", nil, 2, cacheSizes{}},
	} {
		if got := cpuidCaches(c.f, c.ncpu); got != c.want {
			t.Errorf("%s: cpuidCaches = %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestGemmGeluEpilogue checks linear_gelu_tanh's epilogue on every path,
// with its gelu kernels of the same width: y = gelu_tanh(x·Wᵀ + b), with
// the pre-activation kept when asked for, on shapes with edge tiles,
// several k blocks, both thread splits and the small-m dot path, and rows
// (tile widths 24, 31, 40 and 47) that leave runs of 8 and tails after
// the 16-lane runs.
func TestGemmGeluEpilogue(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	ran := map[gemmPath]bool{}
	for _, s := range []struct{ m, n, k int }{{1, 1, 1}, {5, 17, 3}, {30, 70, 40}, {61, 47, 300}, {15, 200, 600}, {130, 70, 64}, {300, 40, 40}, {50, 24, 30}, {60, 31, 20}, {9, 47, 40}} {
		a, b, bias := randSlice(rng, s.m*s.k), randSlice(rng, s.k*s.n), randSlice(rng, s.n)
		z := ref.MatMul(false, true, s.m, s.n, s.k, a, b)
		want := make([]float64, len(z))
		for i := range z {
			z[i] += float64(bias[i%s.n])
			th := math.Tanh(geluC * (z[i] + geluA*z[i]*z[i]*z[i]))
			want[i] = 0.5 * z[i] * (1 + th)
		}
		for _, v := range gemmVariants(t) {
			ran[v.path] = true
			for _, keep := range []bool{false, true} {
				d := v.device()
				x, _ := d.FromFloat32([]int{s.m, s.k}, a)
				w, _ := d.FromFloat32([]int{s.n, s.k}, b)
				bt, _ := d.FromFloat32([]int{s.n}, bias)
				y, _ := d.Zeros(x.dt, []int{s.m, s.n})
				var pre *Tensor
				if keep {
					pre, _ = d.Zeros(x.dt, []int{s.m, s.n})
				}
				if err := d.linearGelu(s.m, s.n, s.k, x, w, bt, y, pre); err != nil {
					t.Fatal(err)
				}
				if e := ref.RelErr(y.f32(), want); e > 1e-5 {
					t.Errorf("%s: m=%d n=%d k=%d keep=%t: y relative error %.3g", v.name, s.m, s.n, s.k, keep, e)
				}
				if keep {
					if e := ref.RelErr(pre.f32(), z); e > 1e-5 {
						t.Errorf("%s: m=%d n=%d k=%d: pre-activation relative error %.3g", v.name, s.m, s.n, s.k, e)
					}
				}
			}
		}
	}
	requireWidthRan(t, ran)
}
