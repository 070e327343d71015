//go:build linux

package sandbox

import (
	"syscall"

	"github.com/tetratelabs/wazero/experimental"
)

// mmapAllocator backs linear memories with an address range reserved up
// to the memory's maximum and made accessible as the guest grows it. A
// grow then copies nothing and allocates nothing on the Go heap: with
// wazero's default allocator, growing a memory page by page to the 256 MiB
// cap reallocated and copied the slice each time, and peaked at about
// 1 GB of host memory.
var mmapAllocator experimental.MemoryAllocator = experimental.MemoryAllocatorFunc(func(_, max uint64) experimental.LinearMemory {
	if max == 0 || max > 1<<32 {
		return &sliceMemory{max: max}
	}
	b, err := syscall.Mmap(-1, 0, int(max), syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		return &sliceMemory{max: max}
	}
	return &mmapMemory{buf: b}
})

// sliceMemory is a linear memory on the Go heap, for a memory of no pages
// or when the kernel refuses the reservation.
type sliceMemory struct {
	buf []byte
	max uint64
}

func (m *sliceMemory) Reallocate(size uint64) []byte {
	if size > m.max {
		return nil
	}
	if size > uint64(cap(m.buf)) {
		b := make([]byte, size)
		copy(b, m.buf)
		m.buf = b
	}
	m.buf = m.buf[:size]
	return m.buf
}

func (m *sliceMemory) Free() { m.buf = nil }

// mmapMemory is one reserved linear memory; [0, committed) is accessible.
type mmapMemory struct {
	buf       []byte
	committed uint64
}

// Reallocate makes [0, size) accessible and returns it; nil when size is
// past the reservation or the kernel refuses.
func (m *mmapMemory) Reallocate(size uint64) []byte {
	if size > uint64(len(m.buf)) {
		return nil
	}
	if size > m.committed {
		// committed is a multiple of the 64 KiB Wasm page, so page-aligned.
		if err := syscall.Mprotect(m.buf[m.committed:size], syscall.PROT_READ|syscall.PROT_WRITE); err != nil {
			return nil
		}
		m.committed = size
	}
	return m.buf[:size:size]
}

// Free unmaps the memory.
func (m *mmapMemory) Free() {
	if m.buf != nil {
		_ = syscall.Munmap(m.buf)
		m.buf = nil
	}
}
