// Package gpuhost is moehost's compute room: tensors that live on a device,
// the kernels that run the ABI's ops (see [abi.Op]) forward and backward, an
// autograd [Tape], and the optimizers that update an expert's parameters.
//
// Guests never touch tensor memory; they hold handles, and the host calls
// [Apply] for each op a guest runs ([ApplyMulti] for an op with several
// results, such as split). A backward request reruns the guest's
// forward with a Tape, then calls [Tape.Backward] for the input and
// parameter gradients, and an [Optimizer] steps the parameters.
//
// This build has a pure-Go CPU device ([NewCPU]) that needs no cgo. Kernels
// sit behind an unexported interface so that a CUDA device (build tag cuda)
// can implement them next to it.
package gpuhost

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"slices"

	"github.com/moehost/moehost/abi"
)

// Sentinel errors. Callers map them to ABI error codes with errors.Is.
var (
	// ErrShape reports tensor shapes or sizes that do not fit an operation.
	ErrShape = errors.New("shape mismatch")
	// ErrArgument reports a value that is not allowed: a wrong number of
	// args or attrs, a bad attr, a bad dtype, a nil tensor or a tensor of
	// another device.
	ErrArgument = errors.New("invalid argument")
	// ErrUnknownOp reports an op code this package does not serve.
	ErrUnknownOp = errors.New("unknown op")
)

// Tensor is a dtype, a shape and storage on one device. Tensors are created
// by a [Device] or by [Apply]; only an [Optimizer] changes one in place.
type Tensor struct {
	dt    abi.DType
	shape []int
	n     int
	dev   Device
	// mem is the device's storage. The CPU device keeps []float32 for
	// float32 and little-endian []byte for the storage-only dtypes, so
	// that ids and masks survive untouched until ops use them; the CUDA
	// device keeps a pointer to its device buffer for every dtype.
	// Release sets it to nil.
	mem any
	// pinned tensors are long-lived (parameters): Release ignores them.
	pinned bool
	// charged is the storage's bytes as the device accounts them (the
	// size class for float32), and cleanup uncharges them if the
	// tensor is collected without a Release.
	charged int64
	cleanup runtime.Cleanup
	// stop, while an op's kernel writes this tensor, is the op's
	// cancellation (ApplyMultiContext): long kernels check it between
	// chunks and give up early.
	stop <-chan struct{}
}

// Pin marks t as long-lived, such as a parameter: [Device.Release] leaves
// a pinned tensor alone, so that a caller that releases every tensor of a
// batch cannot hand a parameter's storage to the next allocation.
func (t *Tensor) Pin() { t.pinned = true }

// DType returns the element type.
func (t *Tensor) DType() abi.DType { return t.dt }

// Shape returns the dims. Callers must not modify the slice.
func (t *Tensor) Shape() []int { return t.shape }

// Len returns the number of elements (1 for a scalar).
func (t *Tensor) Len() int { return t.n }

// ByteSize returns the size of the storage in bytes.
func (t *Tensor) ByteSize() int { return t.n * t.dt.Size() }

// Device returns the device that holds the storage.
func (t *Tensor) Device() Device { return t.dev }

// view returns t's storage under another shape of the same length, as
// the same tensor in all else: releasing the view releases the storage
// (and stops t's cleanup, on the CPU), so callers hand on one of the two
// to be released, as the tape's gradSet does. On the CUDA device the
// storage is a pointer to a buffer that carries its own cleanup and
// release mark, so it is freed once whichever way it goes.
func (t *Tensor) view(shape []int) *Tensor {
	v := *t
	v.shape = shape
	return &v
}

// desc describes the tensor for error messages, e.g. "float32[3 4]".
func (t *Tensor) desc() string {
	if t == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s%v", t.dt, t.shape)
}

// Device holds tensors and runs kernels on them. A Device is safe for
// concurrent use on distinct tensors.
type Device interface {
	// Name names the device ("cpu").
	Name() string
	// Zeros returns a zero-filled tensor. Every dim must be positive;
	// rank 0 is a scalar. The rank may not exceed abi.MaxRank.
	Zeros(dt abi.DType, shape []int) (*Tensor, error)
	// FromBytes returns a tensor holding data, which is little-endian and
	// row-major; len(data) must equal the tensor's byte size (ErrShape
	// otherwise).
	FromBytes(dt abi.DType, shape []int, data []byte) (*Tensor, error)
	// ReadBytes copies t into dst, which must be exactly t.ByteSize()
	// long.
	ReadBytes(t *Tensor, dst []byte) error
	// FromFloat32 returns a float32 tensor with a copy of data.
	FromFloat32(shape []int, data []float32) (*Tensor, error)
	// Float32s returns a copy of a float32 tensor's elements.
	Float32s(t *Tensor) ([]float32, error)
	// Concat joins tensors along dim 0; all must share the dtype and the
	// other dims.
	Concat(ts []*Tensor) (*Tensor, error)
	// Split cuts t along dim 0 into pieces of the given row counts, which
	// must add up to t's first dim. It is the inverse of Concat.
	Split(t *Tensor, rows []int) ([]*Tensor, error)
	// Release hands the storage of tensors that nobody uses any more back
	// to the device, which reuses it for later tensors of the same size
	// class, so that a steady stream of batches allocates nothing. A released
	// tensor must not be used again. Nil, pinned, already released and
	// other devices' tensors are skipped, so releasing everything a batch
	// touched is safe as long as nothing still reads it.
	Release(ts ...*Tensor)
	// Reserve charges n bytes against the device's ceiling on live
	// tensor bytes (see [WithCeiling]) for memory that the caller is
	// about to allocate itself because of tensors on this device (e.g.
	// per-tensor bookkeeping), or returns ErrOutOfMemory and charges
	// nothing. Every allocation the device makes checks the same ceiling
	// before touching memory; Reserve lets callers do so for theirs.
	// Give the bytes back with Unreserve.
	Reserve(n int64) error
	// Unreserve gives back n bytes that Reserve charged.
	Unreserve(n int64)
	// Admit is admission control for new work, such as a request's
	// tensors, before they are allocated: it returns ErrOutOfMemory if
	// n more bytes would take the live bytes past [AdmitFraction] of
	// the ceiling, so that the work already admitted keeps the rest for
	// its activations. It charges nothing.
	Admit(n int64) error
	// MemStats returns the device's live, peak and pooled tensor bytes
	// and its pool's hits and misses.
	MemStats() MemStats

	kernels
}

// checkShape validates a shape and returns its element count. The byte size
// of the element count must fit an int as well, so that callers can multiply
// by the element size without checking again.
func checkShape(dt abi.DType, shape []int) (int, error) {
	if !dt.Valid() {
		return 0, fmt.Errorf("%w: dtype %d", ErrArgument, int32(dt))
	}
	if len(shape) > abi.MaxRank {
		return 0, fmt.Errorf("%w: rank %d exceeds %d", ErrArgument, len(shape), abi.MaxRank)
	}
	n := 1
	for _, d := range shape {
		if d <= 0 {
			return 0, fmt.Errorf("%w: shape %v has a dim that is not positive", ErrArgument, shape)
		}
		hi, lo := bits.Mul64(uint64(n), uint64(d))
		if hi != 0 || lo > math.MaxInt/uint64(dt.Size()) {
			return 0, fmt.Errorf("%w: shape %v is too large", ErrArgument, shape)
		}
		n = int(lo)
	}
	return n, nil
}

// isSuffix reports whether small equals the trailing dims of big.
func isSuffix(small, big []int) bool {
	if len(small) > len(big) {
		return false
	}
	return slices.Equal(small, big[len(big)-len(small):])
}
