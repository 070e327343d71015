//go:build cudaemu

package cuda

/*
#cgo CXXFLAGS: -std=c++17 -O2 -fno-strict-aliasing
#cgo LDFLAGS: -lstdc++ -lm
#include <stdlib.h>
#include <string.h>
#include "emu_api.h"

static void moe_emu_copy_in(uintptr_t dst, const void *src, int64_t n) { memcpy((void *)dst, src, n); }
static void moe_emu_copy_out(void *dst, uintptr_t src, int64_t n) { memcpy(dst, (const void *)src, n); }
*/
import "C"

import (
	"embed"
	"fmt"
	"strings"
	"sync"
	"unsafe"
)

//go:generate go run ./internal/emugen

// kernelSources are the .cu files that emu_launch.cpp includes. Embedding
// them makes the go command rebuild this package when one changes (it
// does not follow #include into a subdirectory), and the tests check that
// every kernel they define is registered.
//
//go:embed kernels/*.cu kernels/*.cuh
var kernelSources embed.FS

// Context is one emulated device: its memory is C heap memory, and it
// runs one call at a time, in order, as one CUDA stream does.
type Context struct {
	ordinal int
	limit   int64

	mu     sync.Mutex
	used   int64
	allocs map[Ptr]int64
	closed bool
}

// deviceCount returns the number of emulated devices: cfg.EmuDevices, or 1.
func deviceCount(cfg Config) int {
	if cfg.EmuDevices > 0 {
		return cfg.EmuDevices
	}
	return 1
}

// Open returns a context on emulated device ordinal, with cfg.EmuMem
// bytes of memory.
func Open(ordinal int, cfg Config) (*Context, error) {
	n := deviceCount(cfg)
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda emulator: no device %d (%d present)", ordinal, n)
	}
	limit := int64(DefaultEmuMem)
	if cfg.EmuMem > 0 {
		limit = cfg.EmuMem
	}
	return &Context{ordinal: ordinal, limit: limit, allocs: map[Ptr]int64{}}, nil
}

// Name names the device.
func (c *Context) Name() string { return fmt.Sprintf("CUDA emulator %d on the CPU", c.ordinal) }

// MemInfo returns the emulated memory's free and total bytes.
func (c *Context) MemInfo() (free, total int64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.limit - c.used, c.limit, nil
}

// Alloc returns bytes of device memory, aligned to 256 as cuMemAlloc's
// are, or ErrOutOfMemory past the emulated total.
func (c *Context) Alloc(bytes int64) (Ptr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("cuda emulator: alloc of %d bytes", bytes)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.open(); err != nil {
		return 0, err
	}
	if c.used+bytes > c.limit {
		return 0, fmt.Errorf("%w: %d bytes asked, %d of %d free", ErrOutOfMemory, bytes, c.limit-c.used, c.limit)
	}
	p := Ptr(C.moe_emu_alloc(C.int64_t(bytes)))
	if p == 0 {
		return 0, fmt.Errorf("%w: the host has no %d bytes", ErrOutOfMemory, bytes)
	}
	c.used += bytes
	c.allocs[p] = bytes
	return p, nil
}

// Free frees memory that Alloc returned.
func (c *Context) Free(p Ptr) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.allocs[p]
	if !ok {
		return fmt.Errorf("cuda emulator: free of %#x, which Alloc did not return", uintptr(p))
	}
	delete(c.allocs, p)
	c.used -= n
	C.moe_emu_free(C.uintptr_t(p))
	return nil
}

// within checks that [p, p+n) lies in one allocation, so that a device
// bug shows as an error here instead of corrupting the heap. Call with
// c.mu held.
func (c *Context) within(what string, p Ptr, n int64) error {
	if n < 0 {
		return fmt.Errorf("cuda emulator: %s of %d bytes", what, n)
	}
	if base, size, ok := c.allocation(p); ok && int64(p-base)+n <= size {
		return nil
	}
	return fmt.Errorf("cuda emulator: %s of %d bytes at %#x is outside every allocation", what, n, uintptr(p))
}

// allocation returns the allocation that holds address p. Call with c.mu
// held.
func (c *Context) allocation(p Ptr) (base Ptr, size int64, ok bool) {
	if size, ok := c.allocs[p]; ok {
		return p, size, true
	}
	for base, size := range c.allocs {
		if p >= base && p < base+Ptr(size) {
			return base, size, true
		}
	}
	return 0, 0, false
}

func (c *Context) open() error {
	if c.closed {
		return fmt.Errorf("cuda emulator: device %d is closed", c.ordinal)
	}
	return nil
}

// CopyIn copies bytes from host memory to dst.
func (c *Context) CopyIn(dst Ptr, src unsafe.Pointer, bytes int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.within("copy in", dst, bytes); err != nil {
		return err
	}
	C.moe_emu_copy_in(C.uintptr_t(dst), src, C.int64_t(bytes))
	return nil
}

// CopyOut copies bytes from src to host memory.
func (c *Context) CopyOut(dst unsafe.Pointer, src Ptr, bytes int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.within("copy out", src, bytes); err != nil {
		return err
	}
	C.moe_emu_copy_out(dst, C.uintptr_t(src), C.int64_t(bytes))
	return nil
}

// CopyDevice copies bytes between device buffers.
func (c *Context) CopyDevice(dst, src Ptr, bytes int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.within("copy to", dst, bytes); err != nil {
		return err
	}
	if err := c.within("copy from", src, bytes); err != nil {
		return err
	}
	C.moe_emu_copy(C.uintptr_t(dst), C.uintptr_t(src), C.int64_t(bytes))
	return nil
}

// Memset32 sets n 32-bit words at dst to v.
func (c *Context) Memset32(dst Ptr, v uint32, n int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.within("memset", dst, 4*n); err != nil {
		return err
	}
	C.moe_emu_memset32(C.uintptr_t(dst), C.uint32_t(v), C.int64_t(n))
	return nil
}

// Launch runs kernel on the CPU; see the driver interface.
func (c *Context) Launch(kernel string, grid, block Dim3, sharedBytes uint32, args ...any) error {
	if decl, ok := ptxKernels[kernel]; ok {
		if err := checkParams(kernel, decl, args); err != nil {
			return err
		}
	}
	slots, sig, err := kernelArgs(kernel, args)
	if err != nil {
		return err
	}
	// One C block: len(args) pointers, then the values they point at.
	mem := C.calloc(C.size_t(max(1, 2*len(args))), 8)
	defer C.free(mem)
	ptrs := unsafe.Slice((*unsafe.Pointer)(mem), 2*len(args))
	vals := unsafe.Slice((*uint64)(mem), 2*len(args))[len(args):]
	for i := range slots {
		vals[i] = slots[i]
		ptrs[i] = unsafe.Pointer(&vals[i])
	}
	cname := C.CString(kernel)
	defer C.free(unsafe.Pointer(cname))
	csig := C.CString(string(sig))
	defer C.free(unsafe.Pointer(csig))
	var errBuf [256]C.char
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.open(); err != nil {
		return err
	}
	// A pointer argument must point into memory that Alloc returned and
	// Free did not take back (0 is a null pointer, which kernels test).
	for i, a := range args {
		if p, ok := a.(Ptr); ok && p != 0 {
			if _, _, ok := c.allocation(p); !ok {
				return fmt.Errorf("cuda emulator: kernel %s: argument %d (%#x) points outside every allocation", kernel, i, uintptr(p))
			}
		}
	}
	if C.moe_emu_launch(cname, C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z), C.uint(block.X), C.uint(block.Y), C.uint(block.Z),
		C.uint(sharedBytes), csig, (*unsafe.Pointer)(mem), &errBuf[0], C.int(len(errBuf))) != 0 {
		return fmt.Errorf("cuda emulator: launch: %s", C.GoString(&errBuf[0]))
	}
	for i, a := range args {
		if p, ok := a.(Ptr); ok && p != 0 {
			base, size, _ := c.allocation(p)
			if C.moe_emu_guard_ok(C.uintptr_t(base), C.int64_t(size)) == 0 {
				return fmt.Errorf("cuda emulator: kernel %s wrote past the end of argument %d's allocation (%d bytes at %#x)", kernel, i, size, uintptr(base))
			}
		}
	}
	return nil
}

// Sgemm computes a row-major GEMM with float accumulation.
func (c *Context) Sgemm(ta, tb bool, m, n, k int, alpha float32, a Ptr, lda int, b Ptr, ldb int, beta float32, cc Ptr, ldc int) error {
	return c.SgemmStridedBatched(ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, cc, ldc, 0, 1)
}

// SgemmStridedBatched computes batch row-major GEMMs.
func (c *Context) SgemmStridedBatched(ta, tb bool, m, n, k int, alpha float32, a Ptr, lda int, strideA int64, b Ptr, ldb int, strideB int64, beta float32, cc Ptr, ldc int, strideC int64, batch int) error {
	if m < 0 || n < 0 || k < 0 || batch < 0 {
		return fmt.Errorf("cuda emulator: sgemm of %d×%d×%d, batch %d", m, n, k, batch)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.open(); err != nil {
		return err
	}
	C.moe_emu_sgemm(cbool(ta), cbool(tb), C.int(m), C.int(n), C.int(k), C.float(alpha),
		C.uintptr_t(a), C.int(lda), C.int64_t(strideA), C.uintptr_t(b), C.int(ldb), C.int64_t(strideB),
		C.float(beta), C.uintptr_t(cc), C.int(ldc), C.int64_t(strideC), C.int(batch))
	return nil
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// Sync waits for queued work: the emulator has none.
func (c *Context) Sync() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open()
}

// Close frees every allocation and ends the context.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range c.allocs {
		C.moe_emu_free(C.uintptr_t(p))
	}
	c.allocs, c.used, c.closed = map[Ptr]int64{}, 0, true
	return nil
}

// emuKernels returns the names of the kernels the emulator has.
func emuKernels() []string {
	n := C.moe_emu_kernels(nil, 0)
	buf := (*C.char)(C.malloc(C.size_t(n)))
	defer C.free(unsafe.Pointer(buf))
	C.moe_emu_kernels(buf, n)
	return strings.Fields(C.GoString(buf))
}

var _ driver = (*Context)(nil)
