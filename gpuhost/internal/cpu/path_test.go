package cpu

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/moehost/moehost/internal/testing/ref"
)

func TestParsePath(t *testing.T) {
	best := Paths()[0]
	for _, tc := range []struct {
		v       string
		want    Path
		wantErr bool
	}{
		{v: "", want: best},
		{v: "go", want: PathGo},
		{v: "GO", want: PathGo},
		{v: "sse9", want: best, wantErr: true},
	} {
		got, err := parsePath(tc.v)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("parsePath(%q) = %v, %v; want %v, error %t", tc.v, got, err, tc.want, tc.wantErr)
		}
	}
	for _, p := range []Path{PathAVX2, PathAVX512} {
		supported := false
		for _, q := range Paths() {
			supported = supported || q == p
		}
		got, err := parsePath(p.String())
		if supported != (err == nil && got == p) {
			t.Errorf("parsePath(%q) = %v, %v; the CPU supports it: %t", p, got, err, supported)
		}
	}
}

// TestCheckGemm checks the first-use check that guards the AVX-512
// kernel: every path this CPU runs passes it, and a GEMM that is wrong in
// one element of one case fails it.
func TestCheckGemm(t *testing.T) {
	for _, p := range Paths() {
		if err := checkGemm(&GEMM{Threads: 1}, p); err != nil {
			t.Errorf("%v: %v", p, err)
		}
	}
	good := &GEMM{Threads: 1}
	bad := &GEMM{Threads: 1}
	bad.Sgemm = func(threads int, ta, tb bool, m, n, k int, a, b, c []float32, acc bool) {
		good.F32(PathGo, ta, tb, m, n, k, a, b, c, acc)
		if ta && tb && acc {
			c[m*n-1] += 0.01
		}
	}
	if err := checkGemm(bad, PathGo); err == nil {
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
			y := make([]float32, s.m*s.n)
			v.device().Run(v.path, nil, false, true, s.m, s.n, s.k, a, b, y, false, Epilogue{Bias: bias})
			if e := ref.RelErr(y, want); e > 1e-5 {
				t.Errorf("%s: m=%d n=%d k=%d: relative error %.3g", v.name, s.m, s.n, s.k, e)
			}
		}
	}
}

// pathKernel is p's assembly kernel; nil for the Go path.
func pathKernel(p Path) *asmKernel {
	switch p {
	case PathAVX2:
		return avx2Kernel()
	case PathAVX512:
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
// with its gelu kernels of the same width: y = gelu_tanh(x·Wᵀ + b), on
// shapes with edge tiles,
// several k blocks, both thread splits and the small-m dot path, and rows
// (tile widths 24, 31, 40 and 47) that leave runs of 8 and tails after
// the 16-lane runs.
func TestGemmGeluEpilogue(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	ran := map[Path]bool{}
	for _, s := range []struct{ m, n, k int }{{1, 1, 1}, {5, 17, 3}, {30, 70, 40}, {61, 47, 300}, {15, 200, 600}, {130, 70, 64}, {300, 40, 40}, {50, 24, 30}, {60, 31, 20}, {9, 47, 40}} {
		a, b, bias := randSlice(rng, s.m*s.k), randSlice(rng, s.k*s.n), randSlice(rng, s.n)
		z := ref.MatMul(false, true, s.m, s.n, s.k, a, b)
		want := make([]float64, len(z))
		for i := range z {
			z[i] += float64(bias[i%s.n])
			th := math.Tanh(GeluC * (z[i] + GeluA*z[i]*z[i]*z[i]))
			want[i] = 0.5 * z[i] * (1 + th)
		}
		for _, v := range gemmVariants(t) {
			ran[v.path] = true
			y := make([]float32, s.m*s.n)
			v.device().Run(v.path, nil, false, true, s.m, s.n, s.k, a, b, y, false, Epilogue{Bias: bias, Gelu: true})
			if e := ref.RelErr(y, want); e > 1e-5 {
				t.Errorf("%s: m=%d n=%d k=%d: y relative error %.3g", v.name, s.m, s.n, s.k, e)
			}
		}
	}
	requirePathRan(t, ran)
}
