package sandbox

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// Param is a named trainable tensor of an expert.
type Param struct {
	Name   string
	Tensor *gpuhost.Tensor
}

// ParamStore holds the parameters of one expert. Every instance of the
// expert declares the same parameters in moe_init; the first declaration
// creates and initialises a parameter, later ones get the same tensor, so
// that all instances compute with one set of weights.
//
// A declaration allocates the tensor and charges it at once, but draws its
// initial values late: when Draw, Params or a call of an instance bound to
// the store first needs them, whichever comes first. Values written with
// Set before then replace the draw, so that a parameter that a checkpoint
// restores is never drawn (RATIONALE: "Why are initial parameters drawn
// late?"). Either way the values are those the seed gives.
type ParamStore struct {
	dev      gpuhost.Device
	seed     [32]byte
	maxBytes int64

	mu     sync.Mutex
	params []Param
	byName map[string]int
	bytes  int64
	// pending[i] draws param i's initial values; nil once it holds
	// values. undrawn counts the non-nil ones.
	pending []func([]float32)
	undrawn int
	// fills[i] draws param i's initial values, kept to draw them again
	// when a Set that replaced the draw fails.
	fills []func([]float32)
}

// NewParamStore makes an empty store whose initial values are drawn from
// seed, so that an expert made again from the same seed has the same
// parameters. maxBytes <= 0 means no limit.
func NewParamStore(dev gpuhost.Device, seed []byte, maxBytes int64) *ParamStore {
	return &ParamStore{dev: dev, seed: sha256.Sum256(seed), maxBytes: maxBytes, byName: map[string]int{}}
}

// Params returns the parameters in declaration order, drawing the
// initial values of those that have none yet. A draw that fails (on a
// device other than the CPU, for want of memory) leaves its parameter to
// the next Draw, which the instances' calls make and whose error they
// return.
func (s *ParamStore) Params() []Param {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.drawLocked()
	return slices.Clone(s.params)
}

// Declared returns the parameters in declaration order without drawing:
// the values of those that Set has not written yet are undefined until
// Draw. It is for reading names and shapes, and handing the tensors to
// what writes them or only needs their shapes.
func (s *ParamStore) Declared() []Param {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.params)
}

// Draw draws the initial values of the parameters that have none yet: it
// makes the store whole. It is cheap when there are none.
func (s *ParamStore) Draw() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drawLocked()
}

// Undrawn returns how many parameters still wait for their initial
// values.
func (s *ParamStore) Undrawn() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.undrawn
}

func (s *ParamStore) drawLocked() error {
	if s.undrawn == 0 {
		return nil
	}
	for i, fill := range s.pending {
		if fill == nil {
			continue
		}
		err := gpuhost.Fill(s.params[i].Tensor, func(v []float32) error { fill(v); return nil })
		if err != nil {
			return fmt.Errorf("drawing param %q: %w", s.params[i].Name, err)
		}
		s.pending[i] = nil
		s.undrawn--
	}
	return nil
}

// Set writes param i's values with write, which gets a slice of the
// parameter's length to fill whole (on the CPU, the tensor's own storage),
// instead of drawing them. When write fails the values may be half
// written, so the parameter gets its initial values again, drawn when
// next needed: Set is for a store that serves nothing yet (a restore at
// load); one that serves must have the values whole before it writes.
// Set must not run while a call uses the parameter.
func (s *ParamStore) Set(i int, write func([]float32) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i < 0 || i >= len(s.params) {
		return fmt.Errorf("%w: param %d of %d", ErrInvalidInput, i, len(s.params))
	}
	if err := gpuhost.Fill(s.params[i].Tensor, write); err != nil {
		if s.pending[i] == nil {
			s.pending[i], s.undrawn = s.fills[i], s.undrawn+1
		}
		return fmt.Errorf("param %q: %w", s.params[i].Name, err)
	}
	if s.pending[i] != nil {
		s.pending[i] = nil
		s.undrawn--
	}
	return nil
}

// Reinit gives every parameter its initial values again, drawn when next
// needed, as after its declaration: for a store that serves nothing yet
// and whose restore failed part way.
func (s *ParamStore) Reinit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	copy(s.pending, s.fills)
	s.undrawn = len(s.pending)
}

// Count returns the number of scalar parameters.
func (s *ParamStore) Count() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, p := range s.params {
		n += int64(p.Tensor.Len())
	}
	return n
}

// declare returns the parameter called name, creating it on first use.
func (s *ParamStore) declare(name string, dt abi.DType, shape []int, init abi.Init, a, b float64) (*gpuhost.Tensor, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.byName[name]; ok {
		t := s.params[i].Tensor
		if t.DType() != dt || !slices.Equal(t.Shape(), shape) {
			return nil, errf(abi.ErrShapeMismatch, "param %q is %v%v in another instance, not %v%v", name, t.DType(), t.Shape(), dt, shape)
		}
		return t, nil
	}
	if dt != abi.DTypeFloat32 {
		return nil, errf(abi.ErrInvalidArgument, "param %q: dtype %v; parameters are float32", name, dt)
	}
	n, err := numElements(shape)
	if err != nil {
		return nil, err
	}
	cost := 4*n + ParamOverhead
	if s.maxBytes > 0 && s.bytes+cost > s.maxBytes {
		return nil, errf(abi.ErrBudgetExceeded, "param %q: %d bytes (%d of data, %d of overhead) would bring the expert's parameters to %d bytes; the parameter budget is %d", name, cost, 4*n, ParamOverhead, s.bytes+cost, s.maxBytes)
	}
	fill, err := s.initFill(name, init, a, b)
	if err != nil {
		return nil, err
	}
	// The values are drawn late (see ParamStore); until then the
	// storage holds whatever it held.
	t, err := gpuhost.FromFunc(s.dev, shape, func([]float32) {})
	if err != nil {
		if errors.Is(err, gpuhost.ErrOutOfMemory) {
			return nil, errf(abi.ErrBudgetExceeded, "param %q: %v", name, err)
		}
		return nil, errf(abi.ErrInternal, "param %q: %v", name, err)
	}
	t.Pin() // a batch's Release must never free a parameter
	s.byName[name] = len(s.params)
	s.params = append(s.params, Param{Name: name, Tensor: t})
	s.pending = append(s.pending, fill)
	s.fills = append(s.fills, fill)
	s.undrawn++
	s.bytes += cost
	return t, nil
}

// initChunk is how many values one stream draws. Each chunk of a
// parameter has its own stream, seeded by the store's seed, the
// parameter's name and the chunk's index, so that chunks are drawn on
// every core and the values do not depend on how many there are.
const initChunk = 1 << 16

// initFill checks a parameter's init and returns the function that writes
// its initial values. The values depend only on the store's seed, the
// parameter's name and its index, not on declaration order or core count.
func (s *ParamStore) initFill(name string, init abi.Init, a, b float64) (func([]float32), error) {
	switch init {
	case abi.InitZeros:
		return func(v []float32) { clear(v) }, nil
	case abi.InitOnes:
		return func(v []float32) {
			for i := range v {
				v[i] = 1
			}
		}, nil
	case abi.InitUniform:
		if !(a <= b) {
			return nil, errf(abi.ErrInvalidArgument, "param %q: uniform bounds [%g, %g) are not ordered", name, a, b)
		}
	case abi.InitNormal:
		if !(b >= 0) {
			return nil, errf(abi.ErrInvalidArgument, "param %q: normal std %g is negative", name, b)
		}
	default:
		return nil, errf(abi.ErrInvalidArgument, "param %q: unknown init %d", name, init)
	}
	h := sha256.New()
	h.Write(s.seed[:])
	h.Write([]byte(name))
	sum := h.Sum(nil)
	key := [2]uint64{binary.LittleEndian.Uint64(sum[:8]), binary.LittleEndian.Uint64(sum[8:16])}
	return func(v []float32) { drawChunks(v, key, init, a, b) }, nil
}

// drawChunks fills v chunk by chunk, on up to GOMAXPROCS goroutines.
func drawChunks(v []float32, key [2]uint64, init abi.Init, a, b float64) {
	chunks := (len(v) + initChunk - 1) / initChunk
	draw := func(c int) {
		lo := c * initChunk
		drawChunk(v[lo:min(lo+initChunk, len(v))], chunkRand(key, c), init, a, b)
	}
	workers := min(runtime.GOMAXPROCS(0), chunks)
	if workers <= 1 {
		for c := range chunks {
			draw(c)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for c := int(next.Add(1) - 1); c < chunks; c = int(next.Add(1) - 1) {
				draw(c)
			}
		})
	}
	wg.Wait()
}

// drawChunk fills v from r: uniform values from 24-bit float32 uniforms,
// two per 64-bit draw; normal ones by math/rand's ziggurat.
func drawChunk(v []float32, r *initRand, init abi.Init, a, b float64) {
	switch init {
	case abi.InitUniform:
		// a + u·(b-a) for u = k/2²⁴, in float32 as the values are; the
		// min keeps a rounding up to b out of [a, b].
		lo, hi := float32(a), float32(b)
		scale := float32((b - a) / (1 << 24))
		s := r.s // in a register, not through r
		i := 0
		for ; i+1 < len(v); i += 2 {
			s += wyAdd
			hi64, lo64 := bits.Mul64(s, s^wyXor)
			x := hi64 ^ lo64
			v[i] = min(lo+float32(int32(x>>40))*scale, hi)
			v[i+1] = min(lo+float32(int32(x>>8&(1<<24-1)))*scale, hi)
		}
		r.s = s
		if i < len(v) {
			v[i] = min(lo+float32(int32(r.Uint64()>>40))*scale, hi)
		}
	case abi.InitNormal:
		rng := rand.New(r)
		for i := range v {
			v[i] = float32(a + b*rng.NormFloat64())
		}
	}
}

// initRand is wyrand: a Weyl sequence through a 64×64→128-bit multiply,
// about four times as fast as math/rand's PCG behind its interface, and
// good enough for initial weights (it passes BigCrush and PractRand).
type initRand struct{ s uint64 }

// wyrand's constants.
const (
	wyAdd = 0xa0761d6478bd642f
	wyXor = 0xe7037ed1a0b428db
)

// chunkRand returns chunk c's stream of the parameter whose key is key.
func chunkRand(key [2]uint64, c int) *initRand {
	return &initRand{s: splitmix(key[0] ^ splitmix(key[1]+uint64(c)))}
}

// Uint64 returns the next 64 random bits; it is also rand.Source's method.
func (r *initRand) Uint64() uint64 {
	r.s += wyAdd
	hi, lo := bits.Mul64(r.s, r.s^wyXor)
	return hi ^ lo
}

// splitmix is SplitMix64's finaliser, which spreads the chunk index over
// all bits of a stream's start.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// paramDecl is one param_new of moe_init, kept so that another expert can
// get the same parameters, drawn from its own seed (Instance.NewParamStore).
type paramDecl struct {
	name  string
	dt    abi.DType
	shape []int
	init  abi.Init
	a, b  float64
}

// ParamOverhead is the host memory one parameter costs beyond its data:
// its tensor, name, store entries and handle in each instance. It was
// measured at about 740 bytes and is rounded up, so that two million
// one-element parameters cost what they really cost.
const ParamOverhead = 1024

// Bytes returns the parameter bytes charged so far, overhead included.
func (s *ParamStore) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// numElements multiplies dims, refusing sizes that overflow.
func numElements(shape []int) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d <= 0 {
			return 0, errf(abi.ErrInvalidArgument, "dim %d in shape %v is not positive", d, shape)
		}
		if n > (1<<40)/int64(d) {
			return 0, errf(abi.ErrBudgetExceeded, "shape %v is too large", shape)
		}
		n *= int64(d)
	}
	return n, nil
}

// abiError is an error that the host function returns to the guest.
type abiError struct {
	code abi.Errno
	msg  string
}

func (e *abiError) Error() string { return e.msg }

// Is makes errors.Is(err, ErrBudget) true for a budget refusal.
func (e *abiError) Is(target error) bool {
	return target == ErrBudget && e.code == abi.ErrBudgetExceeded
}

func errf(code abi.Errno, format string, args ...any) error {
	return &abiError{code: code, msg: fmt.Sprintf(format, args...)}
}
