//go:build cuda || cudaemu

// Package cuda is the driver layer under gpuhost's CUDA device: a context
// with one stream on one GPU, device memory, copies, kernel launches by
// name from the embedded PTX (kernels/moehost.ptx), and cuBLAS GEMMs.
//
// It has two backends with the same API. Build tag cuda (without cudaemu)
// is the real one: gorgonia.org/cu for the driver and cuBLAS loaded with
// dlopen at run time, so that a binary built against one CUDA release
// runs on a machine with another. Build tag cudaemu is an emulator: device
// memory is host memory and kernels/moehost.cu is compiled as C++ and run
// on the CPU, so that the CUDA device's Go code and its kernels are tested
// on machines without a GPU. The default build has neither and compiles
// nothing here: gorgonia.org/cu's init exits the process on a machine
// without a GPU.
//
// Every method of Context is safe for concurrent use. CUDA contexts are
// bound to OS threads, so the real backend locks the calling goroutine to
// its thread and makes the context current there for each call, one call
// at a time; callers never need to.
package cuda

import (
	"errors"
	"unsafe"
)

// Config is what Open takes from gpuhost's device options: this package
// reads no environment variable. Its zero value is the defaults.
type Config struct {
	// Cublas lists cuBLAS files, or directories that hold one of its
	// sonames, to try before the loader's own search (the real backend;
	// the first Open of a process loads the library for every later one).
	Cublas []string
	// EmuDevices is how many devices the emulator has (0: 1).
	EmuDevices int
	// EmuMem is each emulated device's memory in bytes (0: DefaultEmuMem).
	EmuMem int64
}

// DefaultEmuMem is the emulated device's memory without Config.EmuMem:
// 4 GiB.
const DefaultEmuMem = 4 << 30

// Ptr is a device address. 0 is no memory.
type Ptr uintptr

// Dim3 is a launch's grid or block size.
type Dim3 struct{ X, Y, Z uint32 }

// ErrOutOfMemory is returned (wrapped) when the device has no memory for
// an allocation. The device maps it to gpuhost.ErrOutOfMemory.
var ErrOutOfMemory = errors.New("cuda: out of device memory")

// driver is the API both backends implement; the assertion in each
// backend keeps them in step.
//
// Launch runs kernel (an extern "C" name in kernels/moehost.cu) with args
// passed by value in order; each arg is a Ptr, int32, int64, uint32,
// float32 or float64 and must match the kernel's parameter type exactly.
// Launches, copies in and memsets are queued on the context's one stream
// in order; errors of queued work may surface at the next CopyOut or
// Sync, which wait for the stream.
//
// Sgemm and SgemmStridedBatched take ROW-MAJOR operands, as gpuhost does:
// C (m×n, leading dim ldc) = alpha·op(A)·op(B) + beta·C, where A is m×k
// (k×m when ta) with leading dim lda, and B is k×n (n×k when tb) with
// leading dim ldb. Strides are in elements; a stride of 0 reuses one
// matrix for every batch. fp32 GEMMs never use TF32.
type driver interface {
	Name() string
	// MemInfo returns the device's free and total memory in bytes.
	MemInfo() (free, total int64, err error)
	Alloc(bytes int64) (Ptr, error)
	Free(p Ptr) error
	CopyIn(dst Ptr, src unsafe.Pointer, bytes int64) error
	CopyOut(dst unsafe.Pointer, src Ptr, bytes int64) error
	CopyDevice(dst, src Ptr, bytes int64) error
	Memset32(dst Ptr, v uint32, n int64) error
	Launch(kernel string, grid, block Dim3, sharedBytes uint32, args ...any) error
	Sgemm(ta, tb bool, m, n, k int, alpha float32, a Ptr, lda int, b Ptr, ldb int, beta float32, c Ptr, ldc int) error
	SgemmStridedBatched(ta, tb bool, m, n, k int, alpha float32, a Ptr, lda int, strideA int64, b Ptr, ldb int, strideB int64, beta float32, c Ptr, ldc int, strideC int64, batch int) error
	Sync() error
	Close() error
}
