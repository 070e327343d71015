// Package pages hands the memory of a large buffer back to the operating
// system before the buffer is dropped, so that the process's RSS falls at
// once instead of when the garbage collector has freed the buffer and its
// scavenger has returned the pages (which, on an idle server, is never:
// with no allocation no collection runs).
package pages

// MinBytes is the smallest buffer Discard touches: 64 KiB, twice the
// largest of the Go allocator's small size classes, so that the buffer is
// a large object with pages of its own, which no other object shares.
const MinBytes = 64 << 10

// pageBytes is the base page size of the targets we run on (amd64,
// arm64 with 4 KiB pages); a larger page only makes Discard skip more of
// a buffer's edges.
const pageBytes = 4 << 10

// Discard gives the whole pages inside b (up to its capacity) back to the operating system
// (madvise MADV_DONTNEED on Linux; nothing elsewhere) and returns how
// many bytes that was. b must be storage that nothing else reads or
// writes, about to be dropped or reused: its contents read as zeros
// afterwards, and touching it faults fresh zeroed pages in. Buffers under
// MinBytes are left alone.
func Discard[T float32 | byte](b []T) int64 { return discard(b) }

// pageRange returns the offsets [lo, hi) of the whole pages inside n
// bytes at address p, or lo == hi when n is under MinBytes or holds no
// whole page.
func pageRange(p uintptr, n int) (lo, hi int) { return Whole(p, n, pageBytes, MinBytes) }

// Whole returns the offsets [lo, hi) of the whole pages of size (a power
// of two) inside n bytes at address p, or lo == hi when n is under min or
// holds no whole page: the part of a buffer that madvise may act on
// without touching its neighbours'.
func Whole(p uintptr, n int, size uintptr, min int) (lo, hi int) {
	if n < min {
		return 0, 0
	}
	l := (p+size-1)&^(size-1) - p
	h := (p+uintptr(n))&^(size-1) - p
	if h <= l {
		return 0, 0
	}
	return int(l), int(h)
}

// Resident returns how many of the whole pages inside b (up to its
// capacity) are in memory, and how many there are; an error where the
// system cannot tell (everywhere but Linux). For tests.
func Resident[T float32 | byte](b []T) (resident, total int, err error) { return residentPages(b) }
