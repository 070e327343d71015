package gpuhost

import (
	"os"
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

// machineCaches reads this machine's caches once, from Linux's sysfs
// (cpu0's cache/index*: level, type, size, shared_cpu_list); elsewhere, or
// where a level is missing, it keeps fallbackCaches's.
var machineCaches = sync.OnceValue(func() cacheSizes {
	return readCaches("/sys/devices/system/cpu/cpu0/cache")
})

// readCaches parses a sysfs cache directory; see machineCaches.
func readCaches(dir string) cacheSizes {
	c := fallbackCaches
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
		switch level {
		case 1:
			c.l1 = size
		case 2:
			c.l2 = size
		case 3:
			c.l3 = size
		}
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

// readSize parses sysfs's "32K", "1024K" or "32M".
func readSize(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
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
