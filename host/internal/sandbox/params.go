package sandbox

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"

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
type ParamStore struct {
	dev      gpuhost.Device
	seed     [32]byte
	maxBytes int64

	mu     sync.Mutex
	params []Param
	byName map[string]int
	bytes  int64
}

// NewParamStore makes an empty store whose initial values are drawn from
// seed, so that an expert made again from the same seed has the same
// parameters. maxBytes <= 0 means no limit.
func NewParamStore(dev gpuhost.Device, seed []byte, maxBytes int64) *ParamStore {
	return &ParamStore{dev: dev, seed: sha256.Sum256(seed), maxBytes: maxBytes, byName: map[string]int{}}
}

// Params returns the parameters in declaration order.
func (s *ParamStore) Params() []Param {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.params)
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
	vals, err := s.initValues(name, int(n), init, a, b)
	if err != nil {
		return nil, err
	}
	t, err := s.dev.FromFloat32(shape, vals)
	if err != nil {
		return nil, errf(abi.ErrInternal, "param %q: %v", name, err)
	}
	t.Pin() // a batch's Release must never free a parameter
	s.byName[name] = len(s.params)
	s.params = append(s.params, Param{Name: name, Tensor: t})
	s.bytes += cost
	return t, nil
}

// initValues draws a parameter's initial values from a stream seeded by the
// store's seed and the parameter's name, so that declaration order does
// not matter.
func (s *ParamStore) initValues(name string, n int, init abi.Init, a, b float64) ([]float32, error) {
	h := sha256.New()
	h.Write(s.seed[:])
	h.Write([]byte(name))
	sum := h.Sum(nil)
	rng := rand.New(rand.NewPCG(binary.LittleEndian.Uint64(sum[:8]), binary.LittleEndian.Uint64(sum[8:16])))
	vals := make([]float32, n)
	switch init {
	case abi.InitZeros:
	case abi.InitOnes:
		for i := range vals {
			vals[i] = 1
		}
	case abi.InitUniform:
		if !(a <= b) {
			return nil, errf(abi.ErrInvalidArgument, "param %q: uniform bounds [%g, %g) are not ordered", name, a, b)
		}
		for i := range vals {
			vals[i] = float32(a + (b-a)*rng.Float64())
		}
	case abi.InitNormal:
		if !(b >= 0) {
			return nil, errf(abi.ErrInvalidArgument, "param %q: normal std %g is negative", name, b)
		}
		for i := range vals {
			vals[i] = float32(a + b*rng.NormFloat64())
		}
	default:
		return nil, errf(abi.ErrInvalidArgument, "param %q: unknown init %d", name, init)
	}
	return vals, nil
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
