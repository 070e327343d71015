//go:build cuda && !cudaemu

package cuda

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"gorgonia.org/cu"
)

// errClosed is returned by every method after Close.
var errClosed = errors.New("cuda: context closed")

// Context is one GPU: a retained primary context, one non-blocking
// stream, the loaded kernels and a cuBLAS handle bound to that stream.
//
// CUDA binds a context to the OS thread that made it current, and Go
// moves goroutines between threads. So every call locks its goroutine to
// its thread, makes the context current there, and runs the driver calls
// under the context's mutex, which also keeps one call at a time on the
// stream and the cuBLAS handle. Handing each call to one goroutine locked
// to its own thread was the other way; the hand-off to a locked thread
// wakes it through the OS, tens of microseconds a call against tens of
// nanoseconds for the lock (RATIONALE.md).
type Context struct {
	ordinal int
	name    string

	mu      sync.Mutex
	closed  bool
	dev     cu.Device
	ctx     cu.CUContext
	stream  cu.Stream
	module  cu.Module
	kernels map[string]cu.Function
	blas    *cublasHandle
}

// DeviceCount returns the number of CUDA devices the driver sees.
func DeviceCount() (int, error) {
	n, err := cu.NumDevices()
	if err != nil {
		return 0, fmt.Errorf("cuda: count devices: %w", err)
	}
	return n, nil
}

// Open retains GPU ordinal's primary context (the one cuBLAS and other
// runtime-API users share), makes a stream, loads the embedded PTX and
// creates a cuBLAS handle on the stream with fp32 math that never uses
// TF32. cuBLAS is loaded from cfg.Cublas, or found by the loader.
func Open(ordinal int, cfg Config) (*Context, error) {
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: no device %d (the driver sees %d)", ordinal, n)
	}
	lib, err := loadCublas(cfg.Cublas)
	if err != nil {
		return nil, err
	}
	c := &Context{ordinal: ordinal, kernels: make(map[string]cu.Function)}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.setUp(lib); err != nil {
		c.tearDown()
		return nil, fmt.Errorf("cuda: open device %d: %w", ordinal, err)
	}
	return c, nil
}

// setUp makes what a Context holds. Call with the goroutine locked to
// its thread.
func (c *Context) setUp(lib *cublasLib) error {
	dev, err := cu.GetDevice(c.ordinal)
	if err != nil {
		return fmt.Errorf("get device: %w", err)
	}
	c.dev = dev
	name, err := dev.Name()
	if err != nil {
		return fmt.Errorf("device name: %w", err)
	}
	c.name = fmt.Sprintf("cuda:%d (%s)", c.ordinal, name)
	if err := holdPrimary(dev, c.ordinal); err != nil {
		return err
	}
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		return fmt.Errorf("retain primary context: %w", err)
	}
	c.ctx = ctx
	if err := cu.SetCurrentContext(ctx); err != nil {
		return fmt.Errorf("make context current: %w", err)
	}
	if c.stream, err = cu.MakeStream(cu.NonBlocking); err != nil {
		return fmt.Errorf("make stream: %w", err)
	}
	// The JIT's own log says which line of the PTX it refused; the
	// driver's error code alone does not.
	jitLog := make([]byte, 16<<10)
	if c.module, err = cu.LoadDataEx(ptx, &cu.JITErrorLogBuffer{Buffer: jitLog}); err != nil {
		return fmt.Errorf("load kernels (PTX JIT): %w: %s", err, strings.TrimRight(string(jitLog), "\x00"))
	}
	if c.blas, err = lib.newHandle(unsafe.Pointer(c.stream.C())); err != nil {
		return err
	}
	return nil
}

// held records the GPUs whose primary context this process keeps
// retained once more than its Contexts do, so that closing the last
// Context never destroys it: cuBLAS's own runtime keeps state tied to
// the primary context, and a context destroyed and made again under it
// is known to crash it. The driver frees it when the process exits.
var (
	heldMu sync.Mutex
	held   = map[int]bool{}
)

func holdPrimary(dev cu.Device, ordinal int) error {
	heldMu.Lock()
	defer heldMu.Unlock()
	if held[ordinal] {
		return nil
	}
	if _, err := dev.RetainPrimaryCtx(); err != nil {
		return fmt.Errorf("retain primary context: %w", err)
	}
	held[ordinal] = true
	return nil
}

// tearDown releases what setUp made, in reverse, ignoring errors: a
// context that faulted fails every call, and there is nothing left to
// do. Call with the goroutine locked to its thread and the context
// current.
func (c *Context) tearDown() {
	if c.blas != nil {
		c.blas.destroy()
		c.blas = nil
	}
	var zeroMod cu.Module
	if c.module != zeroMod {
		_ = c.module.Unload()
	}
	var zeroStream cu.Stream
	if c.stream != zeroStream {
		_ = c.stream.Destroy()
	}
	var zeroCtx cu.CUContext
	if c.ctx != zeroCtx {
		_ = c.dev.ReleasePrimaryCtx()
	}
}

// do runs f with the context current on the calling goroutine's thread,
// one call at a time.
func (c *Context) do(f func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.SetCurrentContext(c.ctx); err != nil {
		return check(err, "make context current")
	}
	return f()
}

// check wraps a driver error with what was being done, mapping CUDA's
// out-of-memory to ErrOutOfMemory.
func check(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	what := fmt.Sprintf(format, args...)
	if errors.Is(err, cu.OutOfMemory) {
		return fmt.Errorf("%w: %s: %v", ErrOutOfMemory, what, err)
	}
	return fmt.Errorf("cuda: %s: %w", what, err)
}

// Name reports the ordinal and the GPU's name, e.g. "cuda:0 (NVIDIA H200)".
func (c *Context) Name() string { return c.name }

// MemInfo returns the device's free and total memory in bytes.
func (c *Context) MemInfo() (free, total int64, err error) {
	err = c.do(func() error {
		var e error
		free, total, e = cu.MemInfo()
		return check(e, "memory info")
	})
	return free, total, err
}

// Alloc returns bytes of device memory. Zero bytes is Ptr 0.
func (c *Context) Alloc(bytes int64) (Ptr, error) {
	if bytes < 0 {
		return 0, fmt.Errorf("cuda: alloc %d bytes", bytes)
	}
	if bytes == 0 {
		return 0, nil
	}
	var p Ptr
	err := c.do(func() error {
		d, e := cu.MemAlloc(bytes)
		p = Ptr(d)
		return check(e, "alloc %d bytes", bytes)
	})
	return p, err
}

// Free returns memory from Alloc. Free(0) does nothing. It waits for the
// stream first: kernels queued before it may still use the memory, and
// the driver documents only that cuMemFree "may" wait for them.
func (c *Context) Free(p Ptr) error {
	if p == 0 {
		return nil
	}
	return c.do(func() error {
		if err := c.stream.Synchronize(); err != nil {
			return check(err, "synchronize before freeing %#x", uintptr(p))
		}
		return check(cu.MemFree(cu.DevicePtr(p)), "free %#x", uintptr(p))
	})
}

// CopyIn queues a copy of bytes from host memory to dst. Pageable host
// memory is staged before the call returns, so src may be reused then.
func (c *Context) CopyIn(dst Ptr, src unsafe.Pointer, bytes int64) error {
	if bytes == 0 {
		return nil
	}
	return c.do(func() error {
		return check(cu.MemcpyHtoDAsync(cu.DevicePtr(dst), src, bytes, c.stream), "copy %d bytes in", bytes)
	})
}

// CopyOut copies bytes from src to host memory, after all queued work.
func (c *Context) CopyOut(dst unsafe.Pointer, src Ptr, bytes int64) error {
	if bytes == 0 {
		return c.Sync()
	}
	return c.do(func() error {
		if err := cu.MemcpyDtoHAsync(dst, cu.DevicePtr(src), bytes, c.stream); err != nil {
			return check(err, "copy %d bytes out", bytes)
		}
		return check(c.stream.Synchronize(), "copy %d bytes out", bytes)
	})
}

// CopyDevice queues a device-to-device copy.
func (c *Context) CopyDevice(dst, src Ptr, bytes int64) error {
	if bytes == 0 {
		return nil
	}
	return c.do(func() error {
		return check(cu.MemcpyDtoDAsync(cu.DevicePtr(dst), cu.DevicePtr(src), bytes, c.stream), "copy %d bytes on device", bytes)
	})
}

// Memset32 queues setting n 32-bit words at dst to v.
func (c *Context) Memset32(dst Ptr, v uint32, n int64) error {
	if n == 0 {
		return nil
	}
	return c.do(func() error {
		return check(cu.MemsetD32Async(cu.DevicePtr(dst), uint(v), n, c.stream), "memset %d words", n)
	})
}

// Launch queues kernel on the stream.
func (c *Context) Launch(kernel string, grid, block Dim3, sharedBytes uint32, args ...any) error {
	if grid.X == 0 || grid.Y == 0 || grid.Z == 0 || block.X == 0 || block.Y == 0 || block.Z == 0 {
		return fmt.Errorf("cuda: launch %s: empty grid %v or block %v", kernel, grid, block)
	}
	decl, ok := ptxKernels[kernel]
	if !ok {
		return fmt.Errorf("cuda: launch %s: no such kernel in moehost.ptx", kernel)
	}
	if err := checkParams(kernel, decl, args); err != nil {
		return err
	}
	slots, _, err := kernelArgs(kernel, args)
	if err != nil {
		return err
	}
	params := make([]unsafe.Pointer, len(slots))
	for i := range slots {
		params[i] = unsafe.Pointer(&slots[i])
	}
	return c.do(func() error {
		fn, ok := c.kernels[kernel]
		if !ok {
			f, err := c.module.Function(kernel)
			if err != nil {
				return fmt.Errorf("cuda: kernel %s not in moehost.ptx: %w", kernel, err)
			}
			c.kernels[kernel] = f
			fn = f
		}
		err := fn.Launch(int(grid.X), int(grid.Y), int(grid.Z), int(block.X), int(block.Y), int(block.Z),
			int(sharedBytes), c.stream, params)
		return check(err, "launch %s grid %v block %v", kernel, grid, block)
	})
}

// Sgemm is C = alpha·op(A)·op(B) + beta·C on row-major operands,
// through cuBLAS's column-major sgemm (toColMajor).
func (c *Context) Sgemm(ta, tb bool, m, n, k int, alpha float32, a Ptr, lda int, b Ptr, ldb int, beta float32, cp Ptr, ldc int) error {
	if err := gemmDims(m, n, k, lda, ldb, ldc, 1); err != nil {
		return err
	}
	g := toColMajor(ta, tb, m, n, k, a, lda, 0, b, ldb, 0)
	return c.do(func() error {
		return c.blas.sgemm(g.ta, g.tb, g.m, g.n, g.k, alpha, g.a, g.lda, g.b, g.ldb, beta, cp, ldc)
	})
}

// SgemmStridedBatched is Sgemm over batch matrices, each stride elements
// after the last (0 reuses one matrix).
func (c *Context) SgemmStridedBatched(ta, tb bool, m, n, k int, alpha float32, a Ptr, lda int, strideA int64, b Ptr, ldb int, strideB int64, beta float32, cp Ptr, ldc int, strideC int64, batch int) error {
	if err := gemmDims(m, n, k, lda, ldb, ldc, batch); err != nil {
		return err
	}
	g := toColMajor(ta, tb, m, n, k, a, lda, strideA, b, ldb, strideB)
	return c.do(func() error {
		return c.blas.sgemmStridedBatched(g.ta, g.tb, g.m, g.n, g.k, alpha, g.a, g.lda, g.strideA, g.b, g.ldb, g.strideB, beta, cp, ldc, strideC, batch)
	})
}

// gemmDims rejects sizes that cuBLAS's 32-bit int parameters cannot hold.
func gemmDims(vals ...int) error {
	for _, v := range vals {
		if v < 0 || v > math.MaxInt32 {
			return fmt.Errorf("cuda: gemm size %d out of range", v)
		}
	}
	return nil
}

// Sync waits for all queued work and returns its first error.
func (c *Context) Sync() error {
	return c.do(func() error {
		return check(c.stream.Synchronize(), "synchronize")
	})
}

// Close waits for queued work, frees the stream, module and cuBLAS
// handle, and releases the primary context. Memory still allocated goes
// with the context only when its last user releases it; the device frees
// its memory first. Later calls return an error.
func (c *Context) Close() error {
	var err error
	done := c.do(func() error {
		err = check(c.stream.Synchronize(), "synchronize")
		c.tearDown()
		c.closed = true
		return nil
	})
	if errors.Is(done, errClosed) {
		return nil
	}
	return errors.Join(err, done)
}

var _ driver = (*Context)(nil)
