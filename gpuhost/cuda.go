//go:build cuda || cudaemu

package gpuhost

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"
	"unsafe"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost/internal/cuda"
)

// cudaDevice is the CUDA device: tensors live in device memory, from a
// caching allocator by size class, and kernels are launched by name on the
// context's one stream, so they run in the order they are issued. Its
// kernels are in cuda_kernels.go and cuda_ops.go, and kernels/*.cu.
type cudaDevice struct {
	ordinal int
	ctx     *cuda.Context
	// mem does the accounting: the ceiling, live and peak bytes, hits,
	// misses and refusals. Its float32 pool stays empty: the device's
	// pool is free, of device buffers.
	mem memory

	// Guarded by mem.mu.
	free      map[int64][]devPooled // by class size in bytes; oldest first
	seq       uint64
	poolBytes int64
	timer     *time.Timer
}

// cudaBuf is a CUDA tensor's storage (Tensor.mem): device memory of a
// size class. Views of a tensor (reshape's backward) share one cudaBuf,
// and the collector frees it once none of them is reachable.
type cudaBuf struct {
	ptr   cuda.Ptr
	bytes int64 // the size class allocated, as charged
	// released is set by the first Release of any tensor on it, so that
	// releasing a view and its tensor hands the memory back once.
	released bool
	cleanup  runtime.Cleanup
}

// devPooled is a released buffer and when it came back.
type devPooled struct {
	ptr cuda.Ptr
	seq uint64
}

// NewCUDA returns the CUDA device on GPU ordinal. Under the build tag
// cudaemu it opens the CPU emulator instead (for tests on machines
// without a GPU). Options: [WithCeiling] bounds the device's live tensor
// bytes as the CPU's, and the GPU's own memory bounds them too: an
// allocation the GPU refuses returns [ErrOutOfMemory] as well;
// [WithCUBLAS] says where cuBLAS is, and [WithEmulatedGPUs] sizes the
// emulator. The CPU's options do not apply.
func NewCUDA(ordinal int, opts ...DeviceOption) (Device, error) {
	cfg := newDeviceConfig(opts)
	ctx, err := cuda.Open(ordinal, cuda.Config{Cublas: cfg.cublas, EmuDevices: cfg.emuDevices, EmuMem: cfg.emuMem})
	if err != nil {
		return nil, fmt.Errorf("cuda:%d: %w", ordinal, err)
	}
	d := &cudaDevice{ordinal: ordinal, ctx: ctx}
	d.mem.ceiling = cfg.ceiling
	return d, nil
}

// Close frees the pooled memory and closes the device's context: the
// host calls it at shutdown. Tensors still alive keep their memory until
// the process ends (the GPU's primary context outlives its Contexts;
// see cuda.holdPrimary); the emulator frees it at once. The device must
// not be used after.
func (d *cudaDevice) Close() error {
	m := &d.mem
	m.mu.Lock()
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	d.evict(-1)
	m.mu.Unlock()
	if err := d.ctx.Close(); err != nil {
		return fmt.Errorf("%s: closing: %w", d.Name(), err)
	}
	return nil
}

// Name returns "cuda:N".
func (d *cudaDevice) Name() string { return fmt.Sprintf("cuda:%d", d.ordinal) }

// classBytes returns the allocation for a tensor of n bytes: the float
// size class of its 4-byte words, as the CPU's pool rounds.
func classBytes(n int64) int64 {
	return 4 * int64(sizeClass(int((n+3)/4)))
}

// getBuf returns device memory of at least n bytes, charged as live, or
// ErrOutOfMemory before allocating anything when the ceiling refuses, or
// after the GPU refused even with the pool emptied. fit takes a pooled
// buffer of up to twice the class, as memory.getFloats does.
func (d *cudaDevice) getBuf(n int64, fit bool) (*cudaBuf, error) {
	c := classBytes(n)
	most := c
	if fit {
		most = 2 * c
	}
	m := &d.mem
	m.mu.Lock()
	for k := c; k <= most && len(d.free) > 0; k = classBytes(k + 1) {
		l := d.free[k]
		if len(l) == 0 {
			continue
		}
		if err := m.charge(k); err != nil {
			m.mu.Unlock()
			return nil, err
		}
		p := l[len(l)-1].ptr
		if len(l) == 1 {
			delete(d.free, k)
		} else {
			d.free[k] = l[:len(l)-1]
		}
		d.poolBytes -= k
		m.hits++
		m.granted += k
		m.requested += n
		m.mu.Unlock()
		return d.newBuf(p, k), nil
	}
	peak := m.peak
	if err := m.charge(c); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	m.misses++
	m.granted += c
	m.requested += n
	// live + pool stays under the recent high-water mark.
	d.evict(m.bound())
	m.mu.Unlock()
	p, err := d.ctx.Alloc(c)
	if errors.Is(err, cuda.ErrOutOfMemory) {
		// The pool's buffers are the GPU's memory too: give them all
		// back and try once more.
		m.mu.Lock()
		d.evict(m.live)
		m.mu.Unlock()
		p, err = d.ctx.Alloc(c)
	}
	if err != nil {
		m.mu.Lock()
		m.uncharge(c)
		// Memory the GPU refused was never live: it must not raise the
		// mark that bounds the pool.
		m.peak = max(peak, m.live)
		m.misses--
		m.granted -= c
		m.requested -= n
		if errors.Is(err, cuda.ErrOutOfMemory) {
			m.refused++
			m.mu.Unlock()
			return nil, fmt.Errorf("%w: the GPU has no %d bytes: %v", ErrOutOfMemory, c, err)
		}
		m.mu.Unlock()
		return nil, err
	}
	return d.newBuf(p, c), nil
}

// newBuf wraps device memory in a cudaBuf that the collector frees if no
// tensor on it is released.
func (d *cudaDevice) newBuf(p cuda.Ptr, bytes int64) *cudaBuf {
	b := &cudaBuf{ptr: p, bytes: bytes}
	b.cleanup = runtime.AddCleanup(b, d.collectedBuf, bufMem{ptr: p, bytes: bytes})
	return b
}

// bufMem is a cudaBuf's memory, for its cleanup (which must not hold the
// cudaBuf).
type bufMem struct {
	ptr   cuda.Ptr
	bytes int64
}

// collectedBuf is the cleanup of storage that the collector took without
// a Release: the memory goes back to the GPU.
func (d *cudaDevice) collectedBuf(m bufMem) {
	d.mem.unchargeOther(m.bytes)
	_ = d.ctx.Free(m.ptr)
}

// putBuf takes back released storage and keeps it for reuse unless that
// would pass the pool's bound, as memory.putFloats does.
func (d *cudaDevice) putBuf(b *cudaBuf) {
	b.cleanup.Stop()
	b.released = true
	m := &d.mem
	m.mu.Lock()
	defer m.mu.Unlock()
	m.uncharge(b.bytes)
	if d.evict(m.bound() - b.bytes); m.live+d.poolBytes+b.bytes > m.bound() {
		_ = d.ctx.Free(b.ptr)
		m.dropped += b.bytes
		return
	}
	if d.free == nil {
		d.free = map[int64][]devPooled{}
	}
	d.seq++
	d.free[b.bytes] = append(d.free[b.bytes], devPooled{ptr: b.ptr, seq: d.seq})
	d.poolBytes += b.bytes
	d.armTrim()
}

// evict frees the oldest pooled buffers until live + pool <= limit, or
// the pool is empty. Call with mem.mu held.
func (d *cudaDevice) evict(limit int64) {
	for d.poolBytes > 0 && d.mem.live+d.poolBytes > limit {
		oldest, at := int64(-1), uint64(0)
		for c, l := range d.free {
			if len(l) > 0 && (oldest < 0 || l[0].seq < at) {
				oldest, at = c, l[0].seq
			}
		}
		l := d.free[oldest]
		_ = d.ctx.Free(l[0].ptr)
		d.poolBytes -= oldest
		d.mem.dropped += oldest
		if len(l) == 1 {
			delete(d.free, oldest)
		} else {
			d.free[oldest] = l[1:]
		}
	}
}

// armTrim starts the decay timer unless it runs. Call with mem.mu held.
func (d *cudaDevice) armTrim() {
	if d.timer != nil {
		return
	}
	dec := d.mem.decay
	if dec <= 0 {
		dec = PoolDecay
	}
	d.timer = time.AfterFunc(dec, d.trim)
}

// trim ends a decay period as memory.trim does, freeing device memory.
func (d *cudaDevice) trim() {
	m := &d.mem
	m.mu.Lock()
	defer m.mu.Unlock()
	d.timer = nil
	m.prevPeak, m.peak = m.peak, m.live
	d.evict(m.bound())
	if d.poolBytes > 0 {
		d.armTrim()
	}
}

// allocate returns a tensor on device memory charged against the
// ceiling first, zero-filled if zero is set.
func (d *cudaDevice) allocate(dt abi.DType, shape []int, zero, fit bool) (*Tensor, error) {
	n, err := checkShape(dt, shape)
	if err != nil {
		return nil, err
	}
	bytes := int64(n * dt.Size())
	b, err := d.getBuf(bytes, fit)
	if err != nil {
		return nil, err
	}
	if zero {
		if err := d.ctx.Memset32(b.ptr, 0, (bytes+3)/4); err != nil {
			d.putBuf(b)
			return nil, err
		}
	}
	return &Tensor{dt: dt, shape: append([]int{}, shape...), n: n, dev: d, mem: b, charged: b.bytes}, nil
}

// allocDirty returns a scratch tensor whose storage may hold a released
// tensor's values, charged against the ceiling; callers overwrite all of
// it and Release it after use.
func (d *cudaDevice) allocDirty(dt abi.DType, shape []int) (*Tensor, error) {
	return d.allocate(dt, shape, false, true)
}

// buf returns t's storage.
func (t *Tensor) buf() *cudaBuf {
	b, _ := t.mem.(*cudaBuf)
	return b
}

// dptr returns the device address of t's storage, of any dtype.
func (t *Tensor) dptr() cuda.Ptr { return t.buf().ptr }

// cudaBlock is the threads of a block in launch1D, and the most in
// launchRowsOf.
const cudaBlock = 256

// cudaMaxGrid bounds launch1D's grid: the kernels stride over the rest,
// and a few thousand blocks fill any GPU.
const cudaMaxGrid = 4096

// launch1D launches kernel over n elements with a grid-stride loop: 256
// threads a block and enough blocks to cover n, up to cudaMaxGrid. args
// are the kernel's arguments (n among them, as the kernel takes it).
func (d *cudaDevice) launch1D(kernel string, n int, args ...any) error {
	if n <= 0 {
		return nil
	}
	g := min((n+cudaBlock-1)/cudaBlock, cudaMaxGrid)
	return d.launch(kernel, cuda.Dim3{X: uint32(g), Y: 1, Z: 1}, cuda.Dim3{X: cudaBlock, Y: 1, Z: 1}, args...)
}

// launch runs one kernel on the device's stream.
func (d *cudaDevice) launch(kernel string, grid, block cuda.Dim3, args ...any) error {
	if err := d.ctx.Launch(kernel, grid, block, 0, args...); err != nil {
		return fmt.Errorf("cuda:%d: %s: %w", d.ordinal, kernel, err)
	}
	return nil
}

// Zeros returns a zero-filled tensor of exactly its size class (it makes
// long-lived tensors such as optimizer state).
func (d *cudaDevice) Zeros(dt abi.DType, shape []int) (*Tensor, error) {
	t, err := d.allocate(dt, shape, true, false)
	if err != nil {
		return nil, fmt.Errorf("%s: zeros: %w", d.Name(), err)
	}
	return t, nil
}

// FromBytes returns a tensor holding a copy of data, which the device
// copies in as it is: the device is little-endian like the ABI.
func (d *cudaDevice) FromBytes(dt abi.DType, shape []int, data []byte) (*Tensor, error) {
	n, err := checkShape(dt, shape)
	if err != nil {
		return nil, fmt.Errorf("%s: from bytes: %w", d.Name(), err)
	}
	if len(data) != n*dt.Size() {
		return nil, fmt.Errorf("%w: %s: from bytes: %d bytes for %s%v, want %d", ErrShape, d.Name(), len(data), dt, shape, n*dt.Size())
	}
	t, err := d.allocDirty(dt, shape)
	if err != nil {
		return nil, fmt.Errorf("%s: from bytes: %w", d.Name(), err)
	}
	if err := d.ctx.CopyIn(t.dptr(), unsafe.Pointer(&data[0]), int64(len(data))); err != nil {
		d.Release(t)
		return nil, fmt.Errorf("%s: from bytes: %w", d.Name(), err)
	}
	return t, nil
}

// ReadBytes copies t into dst as little-endian bytes.
func (d *cudaDevice) ReadBytes(t *Tensor, dst []byte) error {
	if err := d.own(t, "read bytes"); err != nil {
		return err
	}
	if len(dst) != t.ByteSize() {
		return fmt.Errorf("%w: %s: read bytes: %d bytes for %s, want %d", ErrShape, d.Name(), len(dst), t.desc(), t.ByteSize())
	}
	if err := d.ctx.CopyOut(unsafe.Pointer(&dst[0]), t.dptr(), int64(len(dst))); err != nil {
		return fmt.Errorf("%s: read bytes: %w", d.Name(), err)
	}
	return nil
}

// FromFloat32 returns a float32 tensor with a copy of data.
func (d *cudaDevice) FromFloat32(shape []int, data []float32) (*Tensor, error) {
	n, err := checkShape(abi.DTypeFloat32, shape)
	if err != nil {
		return nil, fmt.Errorf("%s: from float32: %w", d.Name(), err)
	}
	if len(data) != n {
		return nil, fmt.Errorf("%w: %s: from float32: %d values for float32%v", ErrShape, d.Name(), len(data), shape)
	}
	t, err := d.allocDirty(abi.DTypeFloat32, shape)
	if err != nil {
		return nil, fmt.Errorf("%s: from float32: %w", d.Name(), err)
	}
	if err := d.ctx.CopyIn(t.dptr(), unsafe.Pointer(&data[0]), int64(4*n)); err != nil {
		d.Release(t)
		return nil, fmt.Errorf("%s: from float32: %w", d.Name(), err)
	}
	return t, nil
}

// Float32s returns a copy of a float32 tensor's elements.
func (d *cudaDevice) Float32s(t *Tensor) ([]float32, error) {
	if err := d.own(t, "float32s"); err != nil {
		return nil, err
	}
	if t.dt != abi.DTypeFloat32 {
		return nil, fmt.Errorf("%w: %s: float32s: %s is not float32", ErrArgument, d.Name(), t.desc())
	}
	out := make([]float32, t.n)
	if err := d.ctx.CopyOut(unsafe.Pointer(&out[0]), t.dptr(), int64(4*t.n)); err != nil {
		return nil, fmt.Errorf("%s: float32s: %w", d.Name(), err)
	}
	return out, nil
}

// Concat joins tensors along dim 0 with device copies.
func (d *cudaDevice) Concat(ts []*Tensor) (*Tensor, error) {
	if len(ts) == 0 {
		return nil, fmt.Errorf("%w: %s: concat: no tensors", ErrArgument, d.Name())
	}
	rows := 0
	for i, t := range ts {
		if err := d.own(t, "concat"); err != nil {
			return nil, err
		}
		if len(t.shape) == 0 {
			return nil, fmt.Errorf("%w: %s: concat: tensor %d is a scalar", ErrShape, d.Name(), i)
		}
		if t.dt != ts[0].dt {
			return nil, fmt.Errorf("%w: %s: concat: tensor %d is %s, tensor 0 is %s", ErrArgument, d.Name(), i, t.desc(), ts[0].desc())
		}
		if !slices.Equal(t.shape[1:], ts[0].shape[1:]) {
			return nil, fmt.Errorf("%w: %s: concat: tensor %d is %s, tensor 0 is %s", ErrShape, d.Name(), i, t.desc(), ts[0].desc())
		}
		rows += t.shape[0]
	}
	out, err := d.allocDirty(ts[0].dt, append([]int{rows}, ts[0].shape[1:]...))
	if err != nil {
		return nil, fmt.Errorf("%s: concat: %w", d.Name(), err)
	}
	var off int64
	for _, t := range ts {
		n := int64(t.ByteSize())
		if err := d.ctx.CopyDevice(out.dptr()+cuda.Ptr(off), t.dptr(), n); err != nil {
			d.Release(out)
			return nil, fmt.Errorf("%s: concat: %w", d.Name(), err)
		}
		off += n
	}
	return out, nil
}

// Split cuts t along dim 0 into pieces of the given row counts with
// device copies.
func (d *cudaDevice) Split(t *Tensor, rows []int) ([]*Tensor, error) {
	if err := d.own(t, "split"); err != nil {
		return nil, err
	}
	if len(t.shape) == 0 {
		return nil, fmt.Errorf("%w: %s: split: %s is a scalar", ErrShape, d.Name(), t.desc())
	}
	sum := 0
	for _, r := range rows {
		if r <= 0 {
			return nil, fmt.Errorf("%w: %s: split: row count %d is not positive", ErrArgument, d.Name(), r)
		}
		sum += r
		if sum > t.shape[0] {
			break
		}
	}
	if sum != t.shape[0] {
		return nil, fmt.Errorf("%w: %s: split: rows %v do not add up to %s's first dim", ErrShape, d.Name(), rows, t.desc())
	}
	rowBytes := int64(t.ByteSize() / t.shape[0])
	out := make([]*Tensor, 0, len(rows))
	var off int64
	for _, r := range rows {
		p, err := d.allocDirty(t.dt, append([]int{r}, t.shape[1:]...))
		if err == nil {
			err = d.ctx.CopyDevice(p.dptr(), t.dptr()+cuda.Ptr(off), int64(r)*rowBytes)
			if err != nil {
				d.Release(p)
			}
		}
		if err != nil {
			d.Release(out...)
			return nil, fmt.Errorf("%s: split: %w", d.Name(), err)
		}
		off += int64(r) * rowBytes
		out = append(out, p)
	}
	return out, nil
}

// Release implements Device.Release.
func (d *cudaDevice) Release(ts ...*Tensor) {
	for _, t := range ts {
		if t == nil || t.pinned || t.dev != Device(d) {
			continue
		}
		b := t.buf()
		t.mem = nil
		if b == nil || b.released {
			continue // released before, maybe through a view
		}
		d.putBuf(b)
	}
}

// Reserve implements Device.Reserve.
func (d *cudaDevice) Reserve(n int64) error {
	if n < 0 {
		return fmt.Errorf("%w: %s: reserve: %d bytes", ErrArgument, d.Name(), n)
	}
	if err := d.mem.chargeOther(n); err != nil {
		return fmt.Errorf("%s: reserve: %w", d.Name(), err)
	}
	return nil
}

// Unreserve implements Device.Unreserve.
func (d *cudaDevice) Unreserve(n int64) {
	if n > 0 {
		d.mem.unchargeOther(n)
	}
}

// Admit implements Device.Admit.
func (d *cudaDevice) Admit(n int64) error { return d.mem.admit(n, d.Name()) }

// MemStats implements Device.MemStats; PoolBytes is the device memory
// that the caching allocator holds.
func (d *cudaDevice) MemStats() MemStats {
	s := d.mem.stats()
	d.mem.mu.Lock()
	s.PoolBytes = d.poolBytes
	d.mem.mu.Unlock()
	return s
}

// own checks that t is a live tensor of this device.
func (d *cudaDevice) own(t *Tensor, what string) error {
	if t == nil {
		return fmt.Errorf("%w: %s: %s: nil tensor", ErrArgument, d.Name(), what)
	}
	if t.dev != Device(d) {
		return fmt.Errorf("%w: %s: %s: tensor is on another device", ErrArgument, d.Name(), what)
	}
	if b := t.buf(); b == nil || b.released {
		return fmt.Errorf("%w: %s: %s: tensor was released", ErrArgument, d.Name(), what)
	}
	return nil
}

var _ Device = (*cudaDevice)(nil)
