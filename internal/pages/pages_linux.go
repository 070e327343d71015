package pages

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

func discard[T float32 | byte](b []T) int64 {
	var zero T
	n := int(unsafe.Sizeof(zero)) * cap(b)
	raw := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b))), n)
	lo, hi := pageRange(uintptr(unsafe.Pointer(unsafe.SliceData(raw))), n)
	if lo >= hi || unix.Madvise(raw[lo:hi], unix.MADV_DONTNEED) != nil {
		return 0
	}
	return int64(hi - lo)
}

func residentPages[T float32 | byte](b []T) (resident, total int, err error) {
	var zero T
	n := int(unsafe.Sizeof(zero)) * cap(b)
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo, hi := (p+pageBytes-1)&^(pageBytes-1), (p+uintptr(n))&^(pageBytes-1)
	if hi <= lo {
		return 0, 0, nil
	}
	vec := make([]byte, (hi-lo)/pageBytes)
	// x/sys/unix has no Mincore on Linux.
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, lo, hi-lo, uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		return 0, 0, errno
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	runtime.KeepAlive(b)
	return resident, len(vec), nil
}
