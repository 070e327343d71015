package gpuhost

import (
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost/internal/cpu"
	"github.com/moehost/moehost/internal/lefloat"
)

// cpuDevice is the pure-Go device, on the kernels of internal/cpu. Its
// only shared state is the GEMM's pool of packing buffers, so it is safe
// for concurrent use.
type cpuDevice struct {
	threads int
	// mm is the GEMM: its threads, the size per extra goroutine (tests
	// lower it to exercise the split paths on small matrices), and
	// OpenBLAS's sgemm for NewOpenBLAS.
	mm *cpu.GEMM
	// path is the GEMM kernel (tests set each one), and picks the
	// elementwise kernels of the same width (cpu.Path.Asm,
	// cpu.Path.Wide); read it with kpath.
	path cpu.Path
	// pathOf, when set, gives the path instead (NewCPU's, once): the
	// AVX-512 kernel's check then runs beside the server's start, and
	// only the device's first kernel waits for it.
	pathOf func() cpu.Path
	mem    memory // live-byte accounting and released float32 storage
}

// NewCPU returns the pure-Go CPU device. Kernels split large work across up
// to threads goroutines; threads <= 0 means runtime.GOMAXPROCS(0).
// Options: [WithCeiling], [WithGEMMPath], [WithLogger].
func NewCPU(threads int, opts ...DeviceOption) Device {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	cfg := newDeviceConfig(opts)
	d := cpuOnPath(threads, cpu.PathGo)
	log := cfg.log()
	d.pathOf = sync.OnceValue(func() cpu.Path {
		p, err := cpu.Named(cfg.gemm)
		if err != nil {
			log.Warn("gpuhost: CPU device: GEMM path", "err", err, "using", p.String())
		}
		return p
	})
	// The check of the best path (cpu.Named's) takes 10–20 ms of
	// first-touch faults on a VM, while the server compiles its modules
	// and reads its checkpoints: it runs meanwhile, on another core.
	go d.pathOf()
	d.mem.ceiling = cfg.ceiling
	d.mem.onIdle = cfg.onIdle
	return d
}

// kpath returns the device's GEMM path.
func (d *cpuDevice) kpath() cpu.Path {
	if d.pathOf != nil {
		return d.pathOf()
	}
	return d.path
}

// cpuOnPath returns a bare device of threads goroutines on path p.
func cpuOnPath(threads int, p cpu.Path) *cpuDevice {
	return &cpuDevice{threads: threads, mm: &cpu.GEMM{Threads: threads}, path: p}
}

// Name returns "cpu", or "cpu-openblas" for [NewOpenBLAS]'s device.
func (d *cpuDevice) Name() string {
	if d.mm.Sgemm != nil {
		return "cpu-openblas"
	}
	return "cpu"
}

// allocDirty returns a tensor whose float32 storage may hold a released
// tensor's values, for callers that overwrite all of it.
func (d *cpuDevice) allocDirty(dt abi.DType, shape []int) (*Tensor, error) {
	return d.allocate(dt, shape, false, true)
}

// allocate returns a tensor, with float32 storage from the pool when it
// has a buffer of the size class, cleared if zero is set. The storage is
// charged against the ceiling first, so a refusal (ErrOutOfMemory)
// allocates nothing.
func (d *cpuDevice) allocate(dt abi.DType, shape []int, zero, fit bool) (*Tensor, error) {
	n, err := checkShape(dt, shape)
	if err != nil {
		return nil, err
	}
	t := &Tensor{dt: dt, shape: append([]int{}, shape...), n: n, dev: d}
	if dt == abi.DTypeFloat32 {
		b, err := d.mem.getFloats(n, fit)
		if err != nil {
			return nil, err
		}
		if zero {
			clear(b)
		}
		t.mem, t.charged = b, 4*int64(cap(b))
	} else {
		t.charged = int64(n * dt.Size())
		if err := d.mem.chargeOther(t.charged); err != nil {
			return nil, err
		}
		t.mem = make([]byte, t.charged)
	}
	// A tensor nobody releases still stops counting once it is collected.
	t.cleanup = runtime.AddCleanup(t, d.mem.collected, t.charged)
	return t, nil
}

// Zeros returns a zero-filled tensor.
func (d *cpuDevice) Zeros(dt abi.DType, shape []int) (*Tensor, error) {
	// Zeros makes long-lived tensors such as optimizer state: storage of
	// exactly its size class (see memory.getFloats).
	t, err := d.allocate(dt, shape, true, false)
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
		lefloat.Get(f, data)
	} else {
		copy(t.mem.([]byte), data)
	}
	return t, nil
}

// FromFunc returns a float32 tensor of shape whose elements fill writes;
// fill must write every element, as the storage it gets may hold old
// values. On the CPU fill writes straight into the tensor, which saves
// a parameter's initial values a copy (a sixth of startup's CPU); other
// devices get a host slice that is then copied in.
func FromFunc(d Device, shape []int, fill func([]float32)) (*Tensor, error) {
	if c, ok := d.(*cpuDevice); ok {
		t, err := c.allocDirty(abi.DTypeFloat32, shape)
		if err != nil {
			return nil, fmt.Errorf("cpu: from func: %w", err)
		}
		fill(t.f32())
		return t, nil
	}
	n, err := checkShape(abi.DTypeFloat32, shape)
	if err != nil {
		return nil, fmt.Errorf("%s: from func: %w", d.Name(), err)
	}
	vals := make([]float32, n)
	fill(vals)
	return d.FromFloat32(shape, vals)
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
		lefloat.Put(dst, f)
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
		if t.mem == nil {
			continue // released before
		}
		t.cleanup.Stop()
		if f := t.f32(); f != nil {
			d.mem.putFloats(f)
		} else {
			d.mem.unchargeOther(t.charged)
		}
		t.mem = nil
	}
}

// Reserve implements Device.Reserve.
func (d *cpuDevice) Reserve(n int64) error {
	if n < 0 {
		return fmt.Errorf("%w: cpu: reserve: %d bytes", ErrArgument, n)
	}
	if err := d.mem.chargeOther(n); err != nil {
		return fmt.Errorf("cpu: reserve: %w", err)
	}
	return nil
}

// Admit implements Device.Admit.
func (d *cpuDevice) Admit(n int64) error { return d.mem.admit(n, "cpu") }

// Unreserve implements Device.Unreserve.
func (d *cpuDevice) Unreserve(n int64) {
	if n > 0 {
		d.mem.unchargeOther(n)
	}
}

// MemStats implements Device.MemStats.
func (d *cpuDevice) MemStats() MemStats { return d.mem.stats() }

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
