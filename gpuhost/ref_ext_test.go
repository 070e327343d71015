package gpuhost_test

import (
	"math/rand/v2"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/internal/testing/ref"
)

// This file holds the float64 reference ops the tests check gpuhost
// against, by op: the kernels that host's tests share live in
// internal/testing/ref, the others here. They are written from the op
// definitions in abi/op.go and call nothing in gpuhost.

// testDevice is a device under test with a name for t.Run.
type testDevice struct {
	name string
	dev  gpuhost.Device
}

// buildDevices are the devices that only some builds have; their test
// files add them (-tags openblas, cuda).
var buildDevices []testDevice

// devices returns every device the tables run on: the CPU serial and with
// more goroutines than this machine may have cores, the CPU on every GEMM
// path this machine runs (the portable one included) with even small
// products split, and buildDevices.
func devices() []testDevice {
	ds := []testDevice{
		{name: "cpu-1", dev: gpuhost.NewCPU(1)},
		{name: "cpu-3", dev: gpuhost.NewCPU(3)},
	}
	for _, p := range gpuhost.GEMMPaths() {
		ds = append(ds, testDevice{name: "cpu-" + p + "-split", dev: gpuhost.NewCPUOnPath(3, p)})
	}
	return append(ds, buildDevices...)
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// refMatMul is op(A)·op(B) for 2-D A and B of shapes as and bs.
func refMatMul(a []float64, as []int, b []float64, bs []int, ta, tb bool) []float64 {
	m, k := as[0], as[1]
	if ta {
		m, k = k, m
	}
	n := bs[1]
	if tb {
		n = bs[0]
	}
	return ref.MatMul(ta, tb, m, n, k, a, b)
}

// refOp runs op on float64 args with the given shapes and attrs.
func refOp(t *testing.T, op abi.Op, args [][]float64, shapes [][]int, attrs []float64) []float64 {
	t.Helper()
	attr := func(i int, def float64) float64 {
		if i < len(attrs) {
			return attrs[i]
		}
		return def
	}
	switch op {
	case abi.OpMatMul:
		return refMatMul(args[0], shapes[0], args[1], shapes[1], attr(0, 0) == 1, attr(1, 0) == 1)
	case abi.OpLinear:
		var b []float64
		if len(args) == 3 {
			b = args[2]
		}
		return ref.Linear(args[0], args[1], b, shapes[1][1], shapes[1][0])
	case abi.OpAdd:
		return ref.Add(args[0], args[1])
	case abi.OpGeluTanh:
		return ref.GeluTanh(args[0])
	case abi.OpLayerNorm:
		return ref.LayerNorm(args[0], args[1], args[2], attr(0, 1e-5))
	}
	if y, ok := refOpExt(op, args, shapes, attrs); ok {
		return y
	}
	t.Fatalf("no reference for op %s", op)
	return nil
}

// finiteDiff returns the central-difference gradient of f with respect to
// every element of every input. It perturbs a copy of the inputs.
func finiteDiff(in [][]float64, f func([][]float64) float64) [][]float64 {
	const h = 1e-6
	x := make([][]float64, len(in))
	for i := range in {
		x[i] = append([]float64(nil), in[i]...)
	}
	g := make([][]float64, len(in))
	for i := range x {
		g[i] = make([]float64, len(x[i]))
		for j := range x[i] {
			v := x[i][j]
			x[i][j] = v + h
			fp := f(x)
			x[i][j] = v - h
			fm := f(x)
			x[i][j] = v
			g[i][j] = (fp - fm) / (2 * h)
		}
	}
	return g
}

// finiteDiffSome is finiteDiff for the inputs marked in perturb; the
// others get zero gradients.
func finiteDiffSome(in [][]float64, perturb []bool, f func([][]float64) float64) [][]float64 {
	fixed := make([][]float64, len(in))
	g := make([][]float64, len(in))
	var free [][]float64
	var at []int
	for i, v := range in {
		if perturb[i] {
			free, at = append(free, v), append(at, i)
		} else {
			fixed[i] = v
			g[i] = make([]float64, len(v))
		}
	}
	fg := finiteDiff(free, func(x [][]float64) float64 {
		all := append([][]float64(nil), fixed...)
		for k, i := range at {
			all[i] = x[k]
		}
		return f(all)
	})
	for k, i := range at {
		g[i] = fg[k]
	}
	return g
}

// randVals returns n uniform values in [lo, hi), never exactly zero.
func randVals(rng *rand.Rand, n int, lo, hi float64) []float64 {
	v := make([]float64, n)
	for i := range v {
		for v[i] == 0 {
			v[i] = float64(float32(lo + (hi-lo)*rng.Float64()))
		}
	}
	return v
}

func to32(v []float64) []float32 {
	f := make([]float32, len(v))
	for i, e := range v {
		f[i] = float32(e)
	}
	return f
}

// mustTensor uploads float64 values (already float32-exact) to dev.
func mustTensor(t *testing.T, dev gpuhost.Device, shape []int, v []float64) *gpuhost.Tensor {
	t.Helper()
	x, err := dev.FromFloat32(shape, to32(v))
	if err != nil {
		t.Fatalf("FromFloat32(%v): %v", shape, err)
	}
	return x
}

func mustFloats(t *testing.T, dev gpuhost.Device, x *gpuhost.Tensor) []float32 {
	t.Helper()
	f, err := dev.Float32s(x)
	if err != nil {
		t.Fatalf("Float32s: %v", err)
	}
	return f
}
