package gpuhost

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"

	"github.com/moehost/moehost/abi"
)

// cpuDevice is the pure-Go device. Its only shared state is a pool of GEMM
// packing buffers, so it is safe for concurrent use.
type cpuDevice struct {
	threads int
	// minWork is the GEMM size (m·n·k) per extra goroutine; tests lower
	// it to exercise the split paths on small matrices.
	minWork int
	// asm selects the AVX2/FMA GEMM kernel; it is gemmHaveAsm, and tests
	// clear it to cover the portable kernel.
	asm bool
	// sgemm, when set, replaces the GEMM kernels (NewOpenBLAS).
	sgemm  func(threads int, ta, tb bool, m, n, k int, a, b, c []float32, acc bool)
	packMu sync.Mutex
	packs  []*gemmBufs // idle GEMM packing buffers, kept across GCs
	free   bufPool     // released float32 storage
}

// poolMaxBytes caps the float32 storage a CPU device keeps for reuse:
// enough for the tensors of a few batches of a large expert.
const poolMaxBytes = 1 << 30

// bufPool keeps released float32 buffers by length, up to poolMaxBytes in
// all; past that, releases are left to the garbage collector.
type bufPool struct {
	mu    sync.Mutex
	free  map[int][][]float32
	bytes int
}

// get returns a released buffer of n floats, with stale contents, or nil.
func (p *bufPool) get(n int) []float32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.free[n]
	if len(l) == 0 {
		return nil
	}
	b := l[len(l)-1]
	l[len(l)-1] = nil
	p.free[n] = l[:len(l)-1]
	p.bytes -= 4 * n
	return b
}

// put keeps b for reuse unless the pool is full.
func (p *bufPool) put(b []float32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bytes+4*len(b) > poolMaxBytes {
		return
	}
	if p.free == nil {
		p.free = map[int][][]float32{}
	}
	p.free[len(b)] = append(p.free[len(b)], b)
	p.bytes += 4 * len(b)
}

// NewCPU returns the pure-Go CPU device. Kernels split large work across up
// to threads goroutines; threads <= 0 means runtime.GOMAXPROCS(0).
func NewCPU(threads int) Device {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	return &cpuDevice{threads: threads, minWork: gemmMinWork, asm: gemmHaveAsm}
}

// Name returns "cpu", or "cpu-openblas" for [NewOpenBLAS]'s device.
func (d *cpuDevice) Name() string {
	if d.sgemm != nil {
		return "cpu-openblas"
	}
	return "cpu"
}

// alloc returns a zero-filled tensor.
func (d *cpuDevice) alloc(dt abi.DType, shape []int) (*Tensor, error) {
	return d.allocate(dt, shape, true)
}

// allocDirty returns a tensor whose float32 storage may hold a released
// tensor's values, for callers that overwrite all of it.
func (d *cpuDevice) allocDirty(dt abi.DType, shape []int) (*Tensor, error) {
	return d.allocate(dt, shape, false)
}

// allocate returns a tensor, with float32 storage from the pool when it
// has a buffer of the size, cleared if zero is set.
func (d *cpuDevice) allocate(dt abi.DType, shape []int, zero bool) (*Tensor, error) {
	n, err := checkShape(dt, shape)
	if err != nil {
		return nil, err
	}
	t := &Tensor{dt: dt, shape: append([]int{}, shape...), n: n, dev: d}
	if dt == abi.DTypeFloat32 {
		if b := d.free.get(n); b != nil {
			if zero {
				clear(b)
			}
			t.mem = b
		} else {
			t.mem = make([]float32, n)
		}
	} else {
		t.mem = make([]byte, n*dt.Size())
	}
	return t, nil
}

// Zeros returns a zero-filled tensor.
func (d *cpuDevice) Zeros(dt abi.DType, shape []int) (*Tensor, error) {
	t, err := d.alloc(dt, shape)
	if err != nil {
		return nil, fmt.Errorf("cpu: zeros: %w", err)
	}
	return t, nil
}

// FromBytes returns a tensor holding a copy of data.
func (d *cpuDevice) FromBytes(dt abi.DType, shape []int, data []byte) (*Tensor, error) {
	t, err := d.allocDirty(dt, shape)
	if err != nil {
		return nil, fmt.Errorf("cpu: from bytes: %w", err)
	}
	if len(data) != t.ByteSize() {
		return nil, fmt.Errorf("%w: cpu: from bytes: %d bytes for %s, want %d", ErrShape, len(data), t.desc(), t.ByteSize())
	}
	if f := t.f32(); f != nil {
		for i := range f {
			f[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
	} else {
		copy(t.mem.([]byte), data)
	}
	return t, nil
}

// ReadBytes copies t into dst as little-endian bytes.
func (d *cpuDevice) ReadBytes(t *Tensor, dst []byte) error {
	if err := d.own(t, "read bytes"); err != nil {
		return err
	}
	if len(dst) != t.ByteSize() {
		return fmt.Errorf("%w: cpu: read bytes: %d bytes for %s, want %d", ErrShape, len(dst), t.desc(), t.ByteSize())
	}
	if f := t.f32(); f != nil {
		for i, v := range f {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	} else {
		copy(dst, t.mem.([]byte))
	}
	return nil
}

// FromFloat32 returns a float32 tensor with a copy of data.
func (d *cpuDevice) FromFloat32(shape []int, data []float32) (*Tensor, error) {
	t, err := d.allocDirty(abi.DTypeFloat32, shape)
	if err != nil {
		return nil, fmt.Errorf("cpu: from float32: %w", err)
	}
	if len(data) != t.n {
		return nil, fmt.Errorf("%w: cpu: from float32: %d values for %s", ErrShape, len(data), t.desc())
	}
	copy(t.f32(), data)
	return t, nil
}

// Float32s returns a copy of a float32 tensor's elements.
func (d *cpuDevice) Float32s(t *Tensor) ([]float32, error) {
	if err := d.own(t, "float32s"); err != nil {
		return nil, err
	}
	f := t.f32()
	if f == nil {
		return nil, fmt.Errorf("%w: cpu: float32s: %s is not float32", ErrArgument, t.desc())
	}
	return append([]float32(nil), f...), nil
}

// Concat joins tensors along dim 0.
func (d *cpuDevice) Concat(ts []*Tensor) (*Tensor, error) {
	if len(ts) == 0 {
		return nil, fmt.Errorf("%w: cpu: concat: no tensors", ErrArgument)
	}
	rows := 0
	for i, t := range ts {
		if err := d.own(t, "concat"); err != nil {
			return nil, err
		}
		if len(t.shape) == 0 {
			return nil, fmt.Errorf("%w: cpu: concat: tensor %d is a scalar", ErrShape, i)
		}
		if t.dt != ts[0].dt {
			return nil, fmt.Errorf("%w: cpu: concat: tensor %d is %s, tensor 0 is %s", ErrArgument, i, t.desc(), ts[0].desc())
		}
		if !slices.Equal(t.shape[1:], ts[0].shape[1:]) {
			return nil, fmt.Errorf("%w: cpu: concat: tensor %d is %s, tensor 0 is %s", ErrShape, i, t.desc(), ts[0].desc())
		}
		rows += t.shape[0]
	}
	shape := append([]int{rows}, ts[0].shape[1:]...)
	out, err := d.allocDirty(ts[0].dt, shape)
	if err != nil {
		return nil, fmt.Errorf("cpu: concat: %w", err)
	}
	off := 0
	for _, t := range ts {
		off += copyRaw(out, off, t, 0, t.n)
	}
	return out, nil
}

// Split cuts t along dim 0 into pieces of the given row counts.
func (d *cpuDevice) Split(t *Tensor, rows []int) ([]*Tensor, error) {
	if err := d.own(t, "split"); err != nil {
		return nil, err
	}
	if len(t.shape) == 0 {
		return nil, fmt.Errorf("%w: cpu: split: %s is a scalar", ErrShape, t.desc())
	}
	sum := 0
	for _, r := range rows {
		if r <= 0 {
			return nil, fmt.Errorf("%w: cpu: split: row count %d is not positive", ErrArgument, r)
		}
		sum += r
		if sum > t.shape[0] {
			break
		}
	}
	if sum != t.shape[0] {
		return nil, fmt.Errorf("%w: cpu: split: rows %v do not add up to %s's first dim", ErrShape, rows, t.desc())
	}
	per := t.n / t.shape[0]
	out := make([]*Tensor, len(rows))
	off := 0
	for i, r := range rows {
		shape := append([]int{r}, t.shape[1:]...)
		p, err := d.allocDirty(t.dt, shape)
		if err != nil {
			return nil, fmt.Errorf("cpu: split: %w", err)
		}
		off += copyRaw(p, 0, t, off, r*per)
		out[i] = p
	}
	return out, nil
}

// Release implements Device.Release for float32 storage; other dtypes
// are left to the garbage collector.
func (d *cpuDevice) Release(ts ...*Tensor) {
	for _, t := range ts {
		if t == nil || t.pinned || t.dev != Device(d) {
			continue
		}
		if f := t.f32(); f != nil {
			d.free.put(f)
		}
		if t.mem != nil {
			t.mem = nil
		}
	}
}

// own checks that t is a tensor of this device.
func (d *cpuDevice) own(t *Tensor, what string) error {
	if t == nil {
		return fmt.Errorf("%w: cpu: %s: nil tensor", ErrArgument, what)
	}
	if t.dev != Device(d) {
		return fmt.Errorf("%w: cpu: %s: tensor is on another device", ErrArgument, what)
	}
	return nil
}

// copyRaw copies n elements of src from element si into dst from element
// di, whatever the dtype, and returns n.
func copyRaw(dst *Tensor, di int, src *Tensor, si, n int) int {
	if f := dst.f32(); f != nil {
		copy(f[di:di+n], src.f32()[si:si+n])
		return n
	}
	sz := dst.dt.Size()
	copy(dst.mem.([]byte)[di*sz:(di+n)*sz], src.mem.([]byte)[si*sz:(si+n)*sz])
	return n
}

// f32 returns the float32 storage of a CPU tensor, or nil for other dtypes.
func (t *Tensor) f32() []float32 {
	f, _ := t.mem.([]float32)
	return f
}
