package cpu

import "github.com/moehost/moehost/internal/pages"

// hugePageBytes is the size of a transparent huge page on amd64 and arm64
// with 4 KiB base pages.
const hugePageBytes = 2 << 20

// hugeRange returns the offsets [lo, hi) of the whole huge pages inside n
// bytes at address p, or lo == hi when the buffer is under 4 MiB (too
// small to be worth a system call) or holds no whole huge page.
func hugeRange(p uintptr, n int) (lo, hi int) {
	return pages.Whole(p, n, hugePageBytes, 2*hugePageBytes)
}
