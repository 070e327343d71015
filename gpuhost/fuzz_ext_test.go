package gpuhost_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// fuzzAttrs are attr values that hit edges: flags, axes, sizes, the
// non-integral, the non-finite and the huge.
var fuzzAttrs = []float64{
	0, 1, 2, 3, 4, -1, -2, -3, -100, 0.5, -0.5, 1e-6, 1.5,
	math.NaN(), math.Inf(1), math.Inf(-1), 1e300, -1e300, 1 << 53, 1 << 62, -(1 << 63), math.MaxInt32 + 1, 5e-324,
}

// randomTensor returns a small tensor of a random dtype and shape, or one
// that is broken (nil, zero value, another device's).
func randomTensor(rng *rand.Rand, dev, other gpuhost.Device) *gpuhost.Tensor {
	switch rng.IntN(40) {
	case 0:
		return nil
	case 1:
		return &gpuhost.Tensor{}
	case 2:
		dev = other
	}
	dts := []abi.DType{abi.DTypeFloat32, abi.DTypeFloat32, abi.DTypeFloat32, abi.DTypeInt32, abi.DTypeInt64, abi.DTypeBool, abi.DTypeFloat16}
	dt := dts[rng.IntN(len(dts))]
	shape := make([]int, rng.IntN(5))
	for i := range shape {
		shape[i] = 1 + rng.IntN(4)
	}
	n := numel(shape)
	b := make([]byte, n*dt.Size())
	for i := range n {
		switch dt {
		case abi.DTypeFloat32:
			v := float32(rng.NormFloat64())
			switch rng.IntN(30) {
			case 0:
				v = float32(math.NaN())
			case 1:
				v = float32(math.Inf(1))
			case 2:
				v = 0
			case 3:
				v = 3e38
			}
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		case abi.DTypeInt32:
			binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(rng.IntN(12)-3)))
		case abi.DTypeInt64:
			v := int64(rng.IntN(12) - 3)
			if rng.IntN(20) == 0 {
				v = math.MinInt64
			}
			binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
		case abi.DTypeBool:
			b[i] = byte(rng.IntN(2))
		default:
			b[2*i] = byte(rng.IntN(256))
		}
	}
	x, err := dev.FromBytes(dt, shape, b)
	if err != nil {
		panic(fmt.Sprintf("test setup: FromBytes(%s, %v): %v", dt, shape, err))
	}
	return x
}

// nearCase returns, half of the time, the args and attrs of a gradient
// case of op with one thing changed: a dim, an attr, or the values (ids out
// of range, NaNs); nil otherwise.
func nearCase(rng *rand.Rand, dev gpuhost.Device, op abi.Op) ([]*gpuhost.Tensor, []float64) {
	var cases []opCase
	for _, c := range gradCases {
		if c.op == op {
			cases = append(cases, c)
		}
	}
	if len(cases) == 0 || rng.IntN(2) == 0 {
		return nil, nil
	}
	c := cases[rng.IntN(len(cases))]
	shapes := make([][]int, len(c.shapes))
	for i, s := range c.shapes {
		shapes[i] = append([]int{}, s...)
	}
	attrs := append([]float64{}, c.attrs...)
	switch rng.IntN(4) {
	case 0:
		if s := shapes[rng.IntN(len(shapes))]; len(s) > 0 {
			s[rng.IntN(len(s))] += 1 - 2*rng.IntN(2)
		}
	case 1:
		if len(attrs) > 0 {
			attrs[rng.IntN(len(attrs))] = fuzzAttrs[rng.IntN(len(fuzzAttrs))]
		}
	case 2:
		attrs = append(attrs, fuzzAttrs[rng.IntN(len(fuzzAttrs))])
	}
	args := make([]*gpuhost.Tensor, len(shapes))
	for i, s := range shapes {
		kind := kFloat
		if i < len(c.kinds) {
			kind = c.kinds[i]
		}
		dt := abi.DTypeFloat32
		switch kind {
		case kIDs32, kWide32:
			dt = abi.DTypeInt32
		case kIDs64, kTarget, kWide64:
			dt = abi.DTypeInt64
		case kPadMask:
			dt = abi.DTypeBool
		}
		n := 1
		for _, d := range s {
			n *= max(d, 0)
		}
		b := make([]byte, n*dt.Size())
		for j := range n {
			switch dt {
			case abi.DTypeFloat32:
				v := float32(rng.NormFloat64())
				if rng.IntN(50) == 0 {
					v = float32(math.NaN())
				}
				binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(v))
			case abi.DTypeInt32:
				binary.LittleEndian.PutUint32(b[4*j:], uint32(int32(rng.IntN(c.ids+2)-1)))
			case abi.DTypeInt64:
				binary.LittleEndian.PutUint64(b[8*j:], uint64(int64(rng.IntN(c.ids+2)-1)))
			case abi.DTypeBool:
				b[j] = byte(rng.IntN(2))
			}
		}
		x, err := dev.FromBytes(dt, s, b)
		if err != nil {
			return nil, nil // a dim went to zero
		}
		args[i] = x
	}
	return args, attrs
}

// fuzzOne makes one random call of op (or of a random code) and checks
// that Apply, ApplyMulti and a backward through the result return, with a
// sentinel error when they fail.
func fuzzOne(t *testing.T, rng *rand.Rand, dev, other gpuhost.Device, op abi.Op) {
	t.Helper()
	args, attrs := nearCase(rng, dev, op)
	if args == nil {
		args = make([]*gpuhost.Tensor, rng.IntN(6))
		for i := range args {
			args[i] = randomTensor(rng, dev, other)
		}
		attrs = make([]float64, rng.IntN(7))
		for i := range attrs {
			attrs[i] = fuzzAttrs[rng.IntN(len(fuzzAttrs))]
		}
	}
	desc := func() string {
		s := fmt.Sprintf("%s(", op)
		for _, a := range args {
			if a == nil {
				s += "nil "
			} else {
				s += fmt.Sprintf("%s%v ", a.DType(), a.Shape())
			}
		}
		return s + fmt.Sprintf("attrs %v)", attrs)
	}
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("%s panicked: %v", desc(), p)
		}
	}()
	checkErr := func(what string, err error) {
		if err != nil && !errors.Is(err, gpuhost.ErrShape) && !errors.Is(err, gpuhost.ErrArgument) && !errors.Is(err, gpuhost.ErrUnknownOp) {
			t.Errorf("%s: %s: error %v wraps no sentinel", desc(), what, err)
		}
	}
	_, err := gpuhost.Apply(dev, nil, op, args, attrs)
	checkErr("Apply", err)
	tape := gpuhost.NewTape()
	outs, err := gpuhost.ApplyMulti(dev, tape, op, args, attrs)
	checkErr("ApplyMulti", err)
	if err != nil {
		return
	}
	gouts := make([]*gpuhost.Tensor, len(outs))
	for i, o := range outs {
		g := make([]float32, o.Len())
		for j := range g {
			g[j] = float32(rng.NormFloat64())
		}
		if gouts[i], err = dev.FromFloat32(o.Shape(), g); err != nil {
			t.Fatal(err)
		}
	}
	var wrt []*gpuhost.Tensor
	for _, a := range args {
		if a.DType() == abi.DTypeFloat32 {
			wrt = append(wrt, a)
		}
	}
	_, err = tape.Backward(dev, outs, gouts, wrt)
	checkErr("Backward", err)
}

// TestApplyNoPanic calls every op, and codes that are no op, with random
// arg counts, dtypes and shapes and edge-case attrs.
func TestApplyNoPanic(t *testing.T) {
	t.Parallel()
	dev, other := gpuhost.NewCPU(2), gpuhost.NewCPU(1)
	ops := append(abi.Ops(), 0, -1, 37, 1<<30)
	for _, op := range ops {
		t.Run(op.String(), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(op), 3))
			for range 400 {
				fuzzOne(t, rng, dev, other, op)
			}
		})
	}
}

// FuzzApply drives random op calls from the fuzzer's seed.
func FuzzApply(f *testing.F) {
	for i := range uint64(8) {
		f.Add(i, uint8(i*5))
	}
	dev, other := gpuhost.NewCPU(2), gpuhost.NewCPU(1)
	ops := abi.Ops()
	f.Fuzz(func(t *testing.T, seed uint64, code uint8) {
		rng := rand.New(rand.NewPCG(seed, uint64(code)))
		op := abi.Op(code)
		if int(code) < 2*len(ops) {
			op = ops[int(code)%len(ops)]
		}
		for range 20 {
			fuzzOne(t, rng, dev, other, op)
		}
	})
}
