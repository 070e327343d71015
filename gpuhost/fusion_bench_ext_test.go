package gpuhost_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// pairBench times a and b alternately in one loop (their order flips
// every iteration, so that neither always finds the other's data in
// cache) and reports each one's µs per op and b's time over a's: a ratio
// measured side by side, under the same load.
func pairBench(b *testing.B, aName, bName string, a, bf func() error) {
	var ta, tb time.Duration
	i := 0
	for b.Loop() {
		fs := [2]func() error{a, bf}
		ts := [2]*time.Duration{&ta, &tb}
		for k := range 2 {
			j := (k + i) % 2
			t0 := time.Now()
			if err := fs[j](); err != nil {
				b.Fatal(err)
			}
			*ts[j] += time.Since(t0)
		}
		i++
	}
	n := float64(b.N)
	b.ReportMetric(float64(ta.Microseconds())/n, aName+"-µs/op")
	b.ReportMetric(float64(tb.Microseconds())/n, bName+"-µs/op")
	b.ReportMetric(float64(tb)/float64(ta), bName+"/"+aName)
}

// benchTensors makes random tensors of the given shapes on dev.
func benchTensors(b *testing.B, dev gpuhost.Device, shapes ...[]int) []*gpuhost.Tensor {
	b.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	ts := make([]*gpuhost.Tensor, len(shapes))
	for i, s := range shapes {
		var err error
		if ts[i], err = dev.FromFloat32(s, to32(randVals(rng, numel(s), -0.05, 0.05))); err != nil {
			b.Fatal(err)
		}
	}
	return ts
}

// run applies a chain of ops on dev, each taking the previous result as
// its arg at index at (-1: none), recording on a fresh tape when taped,
// and releases everything.
type step struct {
	op    abi.Op
	args  []*gpuhost.Tensor
	attrs []float64
	at    int
}

func runChain(dev gpuhost.Device, taped bool, steps ...step) error {
	var tape *gpuhost.Tape
	if taped {
		tape = gpuhost.NewTape()
		defer tape.Release(dev)
	}
	var prev *gpuhost.Tensor
	var made []*gpuhost.Tensor
	for _, s := range steps {
		args := append([]*gpuhost.Tensor(nil), s.args...)
		if s.at >= 0 {
			args[s.at] = prev
		}
		y, err := gpuhost.Apply(dev, tape, s.op, args, s.attrs)
		if err != nil {
			return err
		}
		prev = y
		made = append(made, y)
	}
	if !taped {
		dev.Release(made...)
	}
	return nil
}

// benchThreads is the devices' thread count: GOMAXPROCS.
var benchThreads = 0

// BenchmarkFusion measures the fused ops against their parts at the ffn
// expert's shapes (h=1024, 4h=4096, batch 256 and 64), without a tape (a
// forward request) and with one (a backward request's forward, which
// keeps the intermediate), and the AVX2 row kernels against the Go loops.
// Every ratio comes from one interleaved loop; see pairBench.
func BenchmarkFusion(b *testing.B) {
	dev := gpuhost.NewCPU(benchThreads)
	goDev := gpuhost.NewCPUOnPath(runtime.GOMAXPROCS(0), "go")
	const h = 1024
	for _, batch := range []int{256, 64} {
		for _, taped := range []bool{false, true} {
			b.Run(fmt.Sprintf("linear+gelu/batch=%d/taped=%t", batch, taped), func(b *testing.B) {
				p := benchTensors(b, dev, []int{batch, h}, []int{4 * h, h}, []int{4 * h})
				pairBench(b, "fused", "unfused",
					func() error { return runChain(dev, taped, step{op: abi.OpLinearGeluTanh, args: p, at: -1}) },
					func() error {
						return runChain(dev, taped, step{op: abi.OpLinear, args: p, at: -1}, step{op: abi.OpGeluTanh, args: p[:1], at: 0})
					})
			})
			b.Run(fmt.Sprintf("add+layer_norm/batch=%d/taped=%t", batch, taped), func(b *testing.B) {
				p := benchTensors(b, dev, []int{batch, h}, []int{batch, h}, []int{h}, []int{h})
				eps := []float64{1e-12}
				pairBench(b, "fused", "unfused",
					func() error { return runChain(dev, taped, step{op: abi.OpAddLayerNorm, args: p, attrs: eps, at: -1}) },
					func() error {
						return runChain(dev, taped, step{op: abi.OpAdd, args: p[:2], at: -1}, step{op: abi.OpLayerNorm, args: p[1:], attrs: eps, at: 0})
					})
			})
		}
	}
	// The row kernels, AVX2 (the default device here) against Go.
	for _, rows := range []int{256, 4096} {
		b.Run(fmt.Sprintf("layer_norm/%dx%d", rows, h), func(b *testing.B) {
			pa := benchTensors(b, dev, []int{rows, h}, []int{h}, []int{h})
			pg := benchTensors(b, goDev, []int{rows, h}, []int{h}, []int{h})
			pairBench(b, "avx2", "go",
				func() error { return runChain(dev, false, step{op: abi.OpLayerNorm, args: pa, at: -1}) },
				func() error { return runChain(goDev, false, step{op: abi.OpLayerNorm, args: pg, at: -1}) })
		})
		b.Run(fmt.Sprintf("layer_norm-backward/%dx%d", rows, h), func(b *testing.B) {
			back := func(dev gpuhost.Device) func() error {
				p := benchTensors(b, dev, []int{rows, h}, []int{h}, []int{h}, []int{rows, h})
				return func() error {
					tape := gpuhost.NewTape()
					defer tape.Release(dev)
					y, err := gpuhost.Apply(dev, tape, abi.OpLayerNorm, p[:3], nil)
					if err != nil {
						return err
					}
					g, err := tape.Backward(dev, []*gpuhost.Tensor{y}, []*gpuhost.Tensor{p[3]}, p[:3])
					dev.Release(g...)
					return err
				}
			}
			pairBench(b, "avx2", "go", back(dev), back(goDev))
		})
		b.Run(fmt.Sprintf("add/%dx%d", rows, h), func(b *testing.B) {
			pa := benchTensors(b, dev, []int{rows, h}, []int{rows, h})
			pg := benchTensors(b, goDev, []int{rows, h}, []int{rows, h})
			pairBench(b, "avx2", "go",
				func() error { return runChain(dev, false, step{op: abi.OpAdd, args: pa, at: -1}) },
				func() error { return runChain(goDev, false, step{op: abi.OpAdd, args: pg, at: -1}) })
		})
		b.Run(fmt.Sprintf("softmax-forward+backward/%dx%d", rows, h), func(b *testing.B) {
			back := func(dev gpuhost.Device) func() error {
				p := benchTensors(b, dev, []int{rows, h}, []int{rows, h})
				return func() error {
					tape := gpuhost.NewTape()
					defer tape.Release(dev)
					y, err := gpuhost.Apply(dev, tape, abi.OpSoftmax, p[:1], nil)
					if err != nil {
						return err
					}
					g, err := tape.Backward(dev, []*gpuhost.Tensor{y}, []*gpuhost.Tensor{p[1]}, p[:1])
					dev.Release(g...)
					return err
				}
			}
			pairBench(b, "avx2", "go", back(dev), back(goDev))
		})
		b.Run(fmt.Sprintf("softmax/%dx%d", rows, h), func(b *testing.B) {
			pa := benchTensors(b, dev, []int{rows, h})
			pg := benchTensors(b, goDev, []int{rows, h})
			pairBench(b, "avx2", "go",
				func() error { return runChain(dev, false, step{op: abi.OpSoftmax, args: pa, at: -1}) },
				func() error { return runChain(goDev, false, step{op: abi.OpSoftmax, args: pg, at: -1}) })
		})
	}
	// The whole ffn block, fused as the example runs it, and as before.
	for _, batch := range []int{256, 64} {
		p := benchTensors(b, dev, ffnShapes(batch, h)...)
		gy := benchTensors(b, dev, []int{batch, h})[0]
		ffn := func(apply func(gpuhost.Device, *gpuhost.Tape, []*gpuhost.Tensor, float64) (*gpuhost.Tensor, error), backward bool) func() error {
			return func() error {
				var tape *gpuhost.Tape
				if backward {
					tape = gpuhost.NewTape()
					defer tape.Release(dev)
				}
				out, err := apply(dev, tape, p, 1e-12)
				if err != nil {
					return err
				}
				if !backward {
					dev.Release(out)
					return nil
				}
				g, err := tape.Backward(dev, []*gpuhost.Tensor{out}, []*gpuhost.Tensor{gy}, p)
				dev.Release(g...)
				return err
			}
		}
		b.Run(fmt.Sprintf("ffn-forward/batch=%d", batch), func(b *testing.B) {
			pairBench(b, "fused", "unfused", ffn(applyFFNFused, false), ffn(applyFFN, false))
		})
		b.Run(fmt.Sprintf("ffn-forward+backward/batch=%d", batch), func(b *testing.B) {
			pairBench(b, "fused", "unfused", ffn(applyFFNFused, true), ffn(applyFFN, true))
		})
	}
}
