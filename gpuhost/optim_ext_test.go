package gpuhost_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

func TestSGD(t *testing.T) {
	t.Parallel()
	for _, d := range devices() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(3, 3))
			const lr = 0.1
			p0 := to32(randVals(rng, 6, -1, 1))
			g0 := to32(randVals(rng, 6, -1, 1))
			q0 := to32(randVals(rng, 2, -1, 1))
			h0 := to32(randVals(rng, 2, -1, 1))
			p, _ := d.dev.FromFloat32([]int{2, 3}, p0)
			g, _ := d.dev.FromFloat32([]int{2, 3}, g0)
			q, _ := d.dev.FromFloat32([]int{2}, q0)
			h, _ := d.dev.FromFloat32([]int{2}, h0)
			if err := gpuhost.NewSGD(lr).Step([]*gpuhost.Tensor{p, q}, []*gpuhost.Tensor{g, h}); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				x     *gpuhost.Tensor
				p0, g []float32
			}{{p, p0, g0}, {q, q0, h0}} {
				want := make([]float32, len(c.p0))
				for i := range want {
					want[i] = c.p0[i] - float32(float32(lr)*c.g[i])
				}
				if got := mustFloats(t, d.dev, c.x); !slices.Equal(got, want) {
					t.Errorf("after SGD: %v, want %v", got, want)
				}
			}
		})
	}
}

// refAdam is torch.optim.Adam's update in float64.
type refAdam struct {
	lr, b1, b2, eps, wd float64
	m, v                [][]float64
	step                int
}

func (a *refAdam) step1(p, g [][]float64) {
	if a.m == nil {
		for _, x := range p {
			a.m = append(a.m, make([]float64, len(x)))
			a.v = append(a.v, make([]float64, len(x)))
		}
	}
	a.step++
	bc1 := 1 - math.Pow(a.b1, float64(a.step))
	bc2 := 1 - math.Pow(a.b2, float64(a.step))
	for i := range p {
		for j := range p[i] {
			gr := g[i][j] + a.wd*p[i][j]
			a.m[i][j] = a.b1*a.m[i][j] + (1-a.b1)*gr
			a.v[i][j] = a.b2*a.v[i][j] + (1-a.b2)*gr*gr
			den := math.Sqrt(a.v[i][j])/math.Sqrt(bc2) + a.eps
			p[i][j] -= a.lr / bc1 * a.m[i][j] / den
		}
	}
}

func TestAdam(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  gpuhost.AdamConfig
		ref  refAdam
	}{
		{name: "defaults", cfg: gpuhost.AdamConfig{}, ref: refAdam{lr: 1e-3, b1: 0.9, b2: 0.999, eps: 1e-8}},
		{name: "custom", cfg: gpuhost.AdamConfig{LR: 0.05, Beta1: 0.8, Beta2: 0.99, Eps: 1e-6}, ref: refAdam{lr: 0.05, b1: 0.8, b2: 0.99, eps: 1e-6}},
		{name: "weight-decay", cfg: gpuhost.AdamConfig{LR: 0.01, WeightDecay: 0.1}, ref: refAdam{lr: 0.01, b1: 0.9, b2: 0.999, eps: 1e-8, wd: 0.1}},
	}
	for _, d := range devices() {
		for _, tt := range tests {
			t.Run(d.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewPCG(5, 5))
				shapes := [][]int{{3, 4}, {4}}
				ref := tt.ref
				opt := gpuhost.NewAdam(tt.cfg)
				pv := make([][]float64, len(shapes))
				params := make([]*gpuhost.Tensor, len(shapes))
				for i, s := range shapes {
					pv[i] = randVals(rng, numel(s), -1, 1)
					params[i] = mustTensor(t, d.dev, s, pv[i])
				}
				for step := range 6 {
					gv := make([][]float64, len(shapes))
					grads := make([]*gpuhost.Tensor, len(shapes))
					for i, s := range shapes {
						gv[i] = randVals(rng, numel(s), -1, 1)
						grads[i] = mustTensor(t, d.dev, s, gv[i])
					}
					if err := opt.Step(params, grads); err != nil {
						t.Fatal(err)
					}
					ref.step1(pv, gv)
					for i, p := range params {
						got := mustFloats(t, d.dev, p)
						for j, v := range got {
							if math.Abs(float64(v)-pv[i][j]) > 1e-6 {
								t.Fatalf("step %d param %d[%d] = %v, want %v", step+1, i, j, v, pv[i][j])
							}
						}
					}
				}
			})
		}
	}
}

func TestOptimizerErrors(t *testing.T) {
	t.Parallel()
	dev := gpuhost.NewCPU(1)
	f := func(shape ...int) *gpuhost.Tensor { return mustZeros(t, dev, abi.DTypeFloat32, shape...) }
	ids, _ := dev.Zeros(abi.DTypeInt32, []int{2})
	tests := []struct {
		name    string
		opt     gpuhost.Optimizer
		params  []*gpuhost.Tensor
		grads   []*gpuhost.Tensor
		wantErr error
	}{
		{name: "sgd-count", opt: gpuhost.NewSGD(0.1), params: []*gpuhost.Tensor{f(2)}, wantErr: gpuhost.ErrArgument},
		{name: "sgd-shape", opt: gpuhost.NewSGD(0.1), params: []*gpuhost.Tensor{f(2)}, grads: []*gpuhost.Tensor{f(3)}, wantErr: gpuhost.ErrShape},
		{name: "sgd-nil-param", opt: gpuhost.NewSGD(0.1), params: []*gpuhost.Tensor{nil}, grads: []*gpuhost.Tensor{f(2)}, wantErr: gpuhost.ErrArgument},
		{name: "sgd-nil-grad", opt: gpuhost.NewSGD(0.1), params: []*gpuhost.Tensor{f(2)}, grads: []*gpuhost.Tensor{nil}, wantErr: gpuhost.ErrArgument},
		{name: "sgd-int32", opt: gpuhost.NewSGD(0.1), params: []*gpuhost.Tensor{ids}, grads: []*gpuhost.Tensor{ids}, wantErr: gpuhost.ErrArgument},
		{name: "adam-shape", opt: gpuhost.NewAdam(gpuhost.AdamConfig{}), params: []*gpuhost.Tensor{f(2, 2)}, grads: []*gpuhost.Tensor{f(4)}, wantErr: gpuhost.ErrShape},
		{name: "adam-bad-beta", opt: gpuhost.NewAdam(gpuhost.AdamConfig{Beta1: 1}), params: []*gpuhost.Tensor{f(2)}, grads: []*gpuhost.Tensor{f(2)}, wantErr: gpuhost.ErrArgument},
		{name: "adam-negative-lr", opt: gpuhost.NewAdam(gpuhost.AdamConfig{LR: -1}), params: []*gpuhost.Tensor{f(2)}, grads: []*gpuhost.Tensor{f(2)}, wantErr: gpuhost.ErrArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.opt.Step(tt.params, tt.grads); !errors.Is(err, tt.wantErr) {
				t.Errorf("Step error = %v, want %v", err, tt.wantErr)
			}
		})
	}

	t.Run("adam-state-changes", func(t *testing.T) {
		opt := gpuhost.NewAdam(gpuhost.AdamConfig{})
		if err := opt.Step([]*gpuhost.Tensor{f(2)}, []*gpuhost.Tensor{f(2)}); err != nil {
			t.Fatal(err)
		}
		if err := opt.Step([]*gpuhost.Tensor{f(2), f(2)}, []*gpuhost.Tensor{f(2), f(2)}); !errors.Is(err, gpuhost.ErrArgument) {
			t.Errorf("more params: %v, want ErrArgument", err)
		}
		if err := opt.Step([]*gpuhost.Tensor{f(3)}, []*gpuhost.Tensor{f(3)}); !errors.Is(err, gpuhost.ErrShape) {
			t.Errorf("other shape: %v, want ErrShape", err)
		}
	})
}
