package cpu

import (
	"cmp"
	"encoding/binary"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// cacheSizes are one core's data caches in bytes; l3 is the core's share
// of a shared L3.
type cacheSizes struct{ l1, l2, l3 int }

// fallbackCaches are used for levels the machine does not describe: small
// enough to be safe on any x86 core of the last ten years.
var fallbackCaches = cacheSizes{l1: 32 << 10, l2: 256 << 10, l3: 2 << 20}

// machineCaches reads this machine's caches once: from Linux's sysfs
// (cpu0's cache/index*: level, type, size, shared_cpu_list), which knows
// how many CPUs share each; where it is missing (the firecracker VMs we
// run on have no cache directory), from CPUID; and for any level neither
// describes, fallbackCaches's.
var machineCaches = sync.OnceValue(func() cacheSizes {
	return mergeCaches(readCaches("/sys/devices/system/cpu/cpu0/cache"),
		cpuidCaches(cpuidFunc, runtime.NumCPU()), fallbackCaches)
})

// mergeCaches takes each level from the first set that has it (non-zero).
func mergeCaches(sets ...cacheSizes) cacheSizes {
	var c cacheSizes
	for _, s := range sets {
		c.l1 = cmp.Or(c.l1, s.l1)
		c.l2 = cmp.Or(c.l2, s.l2)
		c.l3 = cmp.Or(c.l3, s.l3)
	}
	return c
}

// readCaches parses a sysfs cache directory; a level it does not find is
// 0. See machineCaches.
func readCaches(dir string) cacheSizes {
	var c cacheSizes
	for i := range 8 {
		idx := dir + "/index" + strconv.Itoa(i)
		level, ok1 := readInt(idx + "/level")
		size, ok2 := readSize(idx + "/size")
		typ, err := os.ReadFile(idx + "/type")
		if !ok1 || !ok2 || err != nil || size <= 0 {
			continue
		}
		if t := strings.TrimSpace(string(typ)); t != "Data" && t != "Unified" {
			continue
		}
		if shared := cpuCount(idx + "/shared_cpu_list"); shared > 1 {
			size /= shared
		}
		c.set(level, size)
	}
	return c
}

func (c *cacheSizes) set(level, size int) {
	switch level {
	case 1:
		c.l1 = size
	case 2:
		c.l2 = size
	case 3:
		c.l3 = size
	}
}

// cpuidCaches reads the data caches from CPUID (nil: none): the
// deterministic cache leaf, Intel's 4 or AMD's 0x8000001D, which gives
// each cache's geometry and how many logical CPUs share it; failing that,
// on AMD, the legacy leaves 0x80000005/6 for L1d and L2 (their L3 field
// is the whole package's, with no sharing count, so L3 is left out).
//
// A size is divided among the CPUs that share it, as sysfs's is; for L1
// and L2 at most ncpu of them, since a VM's vCPUs may be whole cores
// whose SMT siblings CPUID still counts. L3's count is not capped: the
// rest of the socket is other tenants'.
func cpuidCaches(cpuid func(leaf, sub uint32) (eax, ebx, ecx, edx uint32), ncpu int) cacheSizes {
	var c cacheSizes
	if cpuid == nil {
		return c
	}
	maxLeaf, b, cx, d := cpuid(0, 0)
	var vendor [12]byte
	binary.LittleEndian.PutUint32(vendor[0:], b)
	binary.LittleEndian.PutUint32(vendor[4:], d)
	binary.LittleEndian.PutUint32(vendor[8:], cx)
	amd := string(vendor[:]) == "AuthenticAMD" || string(vendor[:]) == "HygonGenuine"
	maxExt, _, _, _ := cpuid(0x80000000, 0)
	leaf, top := uint32(4), maxLeaf
	if amd {
		leaf, top = 0x8000001D, maxExt
	}
	if top >= leaf {
		for sub := range uint32(16) {
			a, b, cx, _ := cpuid(leaf, sub)
			typ := a & 31
			if typ == 0 {
				break
			}
			if typ != 1 && typ != 3 { // data, unified
				continue
			}
			level := int(a >> 5 & 7)
			size := int(b>>22+1) * int(b>>12&0x3ff+1) * int(b&0xfff+1) * int(cx+1)
			shared := int(a>>14&0xfff) + 1
			if level < 3 {
				shared = min(shared, max(ncpu, 1))
			}
			c.set(level, size/shared)
		}
	}
	if amd && c.l1 == 0 && c.l2 == 0 && maxExt >= 0x80000006 {
		_, _, l1, _ := cpuid(0x80000005, 0)
		_, _, l2, _ := cpuid(0x80000006, 0)
		c.l1 = int(l1>>24) << 10
		c.l2 = int(l2>>16) << 10
	}
	return c
}

func readInt(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return n, err == nil
}

// readSize reads a sysfs size; see parseSize.
func readSize(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	return parseSize(strings.TrimSpace(string(b)))
}

// parseSize parses sysfs's "32K", "1024K" or "32M" (bytes without a
// suffix).
func parseSize(s string) (int, bool) {
	mul := 1
	switch {
	case strings.HasSuffix(s, "K"):
		mul, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "M"):
		mul, s = 1<<20, s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	return n * mul, err == nil
}

// cpuCount counts the CPUs of a list such as "0-3,8-11"; 0 if unreadable.
func cpuCount(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, found := strings.Cut(r, "-")
		a, err1 := strconv.Atoi(lo)
		if !found {
			if err1 == nil {
				n++
			}
			continue
		}
		z, err2 := strconv.Atoi(hi)
		if err1 == nil && err2 == nil && z >= a {
			n += z - a + 1
		}
	}
	return n
}

// gemmBlocking sizes a micro-kernel's blocks from the caches: a KC×NR
// panel of B fills half of L1, an MC×KC block of A a third of L2 (it
// shares L2 with the B panels being packed, a quarter, and the C tiles),
// and a KC×NC block of B half of the core's L3 share (BLIS's analytical
// model, Low et al. 2016, with round fractions rather than per-CPU
// constants). On a Zen 3 core (32 KiB L1d, 512 KiB L2) that is KC 256,
// MC 168; BLIS's own choices are 144 there and 168 for Haswell's 256 KiB.
//
// oneMC is the largest m run as one A block (half of L2), for which
// packed B never leaves L2 (asmKernel.serial): at m = 256, k = 1024,
// n = 4096 that was 5–15% faster than two blocks of 132 rows.
//
// pfL2 is the floats of L2 (three quarters) that the A block and two
// chunks of B may fill for the next chunk to be prefetched while this one
// is multiplied (asmKernel.serial): more, and the prefetch evicts A.
type gemmBlocking struct{ kc, mc, nc, fuseNC, oneMC, pfL2 int }

func blockingFor(c cacheSizes, mr, nr int) gemmBlocking {
	roundDown := func(v, q, lo, hi int) int { return max(lo, min(hi, v/q*q)) }
	kc := roundDown(c.l1/2/(4*nr), 16, 64, 512)
	fuseNC := roundDown(c.l2/4/(4*kc), nr, nr, 1024)
	return gemmBlocking{
		kc: kc,
		mc: roundDown(c.l2/3/(4*kc), mr, mr, 64*mr),
		nc: roundDown(c.l3/2/(4*kc), nr, 16*nr, 8192),
		// The first A block packs B this many columns at a time, a
		// quarter of L2, so that they are still there when used.
		fuseNC: fuseNC,
		oneMC:  c.l2 / 2 / (4 * kc),
		pfL2:   c.l2 * 3 / 4 / 4,
	}
}
