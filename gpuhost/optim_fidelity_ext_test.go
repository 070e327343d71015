package gpuhost_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moehost/moehost/gpuhost"
)

// refOptim is torch's SGD, Adam and AdamW, clip_grad_norm_ and
// transformers' linear schedule, in float64.
type refOptim struct {
	cfg   gpuhost.OptimizerConfig // with defaults
	steps int64
	m, v  [][]float64
}

// lr is get_linear_schedule_with_warmup's lr_lambda times the base rate,
// written out again rather than calling LRAt.
func (r *refOptim) lr() float64 {
	c, s := r.cfg, float64(r.steps)
	if c.Scheduler != gpuhost.ScheduleLinear {
		return c.LR
	}
	w, n := float64(c.NumWarmupSteps), float64(c.NumTrainingSteps)
	if s < w {
		return c.LR * s / math.Max(1, w)
	}
	return c.LR * math.Max(0, (n-s)/math.Max(1, n-w))
}

func (r *refOptim) step(p, g [][]float64) {
	c := r.cfg
	if r.m == nil {
		for _, x := range p {
			r.m = append(r.m, make([]float64, len(x)))
			r.v = append(r.v, make([]float64, len(x)))
		}
	}
	lr := r.lr()
	r.steps++
	scale := 1.0
	if c.ClipGradNorm > 0 {
		var sq float64
		for _, gi := range g {
			for _, x := range gi {
				sq += x * x
			}
		}
		scale = math.Min(1, c.ClipGradNorm/(math.Sqrt(sq)+1e-6))
	}
	bc1 := 1 - math.Pow(c.Beta1, float64(r.steps))
	bc2 := 1 - math.Pow(c.Beta2, float64(r.steps))
	for i := range p {
		for j := range p[i] {
			gr := g[i][j] * scale
			switch c.Name {
			case gpuhost.AlgorithmSGD:
				gr += c.WeightDecay * p[i][j]
				if c.Momentum > 0 {
					r.m[i][j] = c.Momentum*r.m[i][j] + gr
					gr = r.m[i][j]
				}
				p[i][j] -= lr * gr
			case gpuhost.AlgorithmAdam, gpuhost.AlgorithmAdamW:
				if c.Name == gpuhost.AlgorithmAdamW {
					p[i][j] *= 1 - lr*c.WeightDecay
				} else {
					gr += c.WeightDecay * p[i][j]
				}
				r.m[i][j] = c.Beta1*r.m[i][j] + (1-c.Beta1)*gr
				r.v[i][j] = c.Beta2*r.v[i][j] + (1-c.Beta2)*gr*gr
				den := math.Sqrt(r.v[i][j])/math.Sqrt(bc2) + c.Eps
				p[i][j] -= lr / bc1 * r.m[i][j] / den
			}
		}
	}
}

// TestOptimizerFidelity runs each optimizer for 100 steps on random
// gradients beside the float64 reference, with parameters of order 1.
func TestOptimizerFidelity(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  gpuhost.OptimizerConfig
	}{
		{name: "adam", cfg: gpuhost.OptimizerConfig{Name: "adam", LR: 0.01}},
		{name: "adam-l2", cfg: gpuhost.OptimizerConfig{Name: "adam", LR: 0.01, WeightDecay: 0.1}},
		{name: "adamw", cfg: gpuhost.OptimizerConfig{Name: "adamw", LR: 0.01, WeightDecay: 0.1, Beta1: 0.8, Beta2: 0.99}},
		{name: "sgd", cfg: gpuhost.OptimizerConfig{Name: "sgd", LR: 0.01}},
		{name: "sgd-momentum", cfg: gpuhost.OptimizerConfig{Name: "sgd", LR: 0.01, Momentum: 0.9, WeightDecay: 0.01}},
		{name: "adam-clip", cfg: gpuhost.OptimizerConfig{Name: "adam", LR: 0.01, ClipGradNorm: 0.5}},
		{name: "sgd-clip", cfg: gpuhost.OptimizerConfig{Name: "sgd", LR: 0.05, Momentum: 0.5, ClipGradNorm: 0.5}},
		{name: "adamw-linear", cfg: gpuhost.OptimizerConfig{Name: "adamw", LR: 0.01, Scheduler: "linear", NumWarmupSteps: 10, NumTrainingSteps: 80}},
		{name: "sgd-linear", cfg: gpuhost.OptimizerConfig{Name: "sgd", LR: 0.01, Momentum: 0.9, Scheduler: "linear", NumWarmupSteps: 20, NumTrainingSteps: 120}},
	}
	for _, d := range devices() {
		for _, tt := range tests {
			t.Run(d.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewPCG(7, 7))
				shapes := [][]int{{4, 8}, {8}}
				ref := refOptim{cfg: tt.cfg.WithDefaults()}
				opt := gpuhost.NewOptimizer(tt.cfg)
				pv := make([][]float64, len(shapes))
				params := make([]*gpuhost.Tensor, len(shapes))
				for i, s := range shapes {
					pv[i] = randVals(rng, numel(s), -1, 1)
					params[i] = mustTensor(t, d.dev, s, pv[i])
				}
				var worst float64
				for step := range 100 {
					gv := make([][]float64, len(shapes))
					grads := make([]*gpuhost.Tensor, len(shapes))
					for i, s := range shapes {
						gv[i] = randVals(rng, numel(s), -1, 1)
						grads[i] = mustTensor(t, d.dev, s, gv[i])
					}
					if err := opt.Step(params, grads); err != nil {
						t.Fatal(err)
					}
					ref.step(pv, gv)
					for i, p := range params {
						for j, v := range mustFloats(t, d.dev, p) {
							diff := math.Abs(float64(v) - pv[i][j])
							worst = max(worst, diff)
							if diff > 1e-6 {
								t.Fatalf("step %d param %d[%d] = %v, want %v", step+1, i, j, v, pv[i][j])
							}
						}
					}
				}
				t.Logf("worst |diff| over 100 steps: %.2g", worst)
			})
		}
	}
}

// TestOptimizerStateRoundTrip stops after 40 steps, moves the state into
// a fresh optimizer and checks that 40 more steps land exactly where an
// uninterrupted run does, schedule position included.
func TestOptimizerStateRoundTrip(t *testing.T) {
	t.Parallel()
	cfgs := []gpuhost.OptimizerConfig{
		{Name: "adam", LR: 0.01, Scheduler: "linear", NumWarmupSteps: 30, NumTrainingSteps: 100},
		{Name: "adamw"},
		{Name: "sgd", Momentum: 0.9, Scheduler: "linear", NumWarmupSteps: 50, NumTrainingSteps: 100},
		{Name: "sgd"},
		{Name: "none"},
	}
	for _, d := range devices() {
		for _, cfg := range cfgs {
			t.Run(d.name+"/"+cfg.Name+"-"+cfg.Scheduler, func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewPCG(9, 9))
				shape := []int{3, 5}
				p0 := randVals(rng, 15, -1, 1)
				grads := make([]*gpuhost.Tensor, 80)
				for i := range grads {
					grads[i] = mustTensor(t, d.dev, shape, randVals(rng, 15, -1, 1))
				}
				a, b := mustTensor(t, d.dev, shape, p0), mustTensor(t, d.dev, shape, p0)
				whole := gpuhost.NewOptimizer(cfg)
				first := gpuhost.NewOptimizer(cfg)
				for i, g := range grads {
					if err := whole.Step([]*gpuhost.Tensor{a}, []*gpuhost.Tensor{g}); err != nil {
						t.Fatal(err)
					}
					if i < 40 {
						if err := first.Step([]*gpuhost.Tensor{b}, []*gpuhost.Tensor{g}); err != nil {
							t.Fatal(err)
						}
					}
				}
				st, err := first.State()
				if err != nil {
					t.Fatal(err)
				}
				if st.Steps != 40 {
					t.Fatalf("state has %d steps, want 40", st.Steps)
				}
				second := gpuhost.NewOptimizer(cfg)
				if err := second.SetState([]*gpuhost.Tensor{b}, st); err != nil {
					t.Fatal(err)
				}
				for _, g := range grads[40:] {
					if err := second.Step([]*gpuhost.Tensor{b}, []*gpuhost.Tensor{g}); err != nil {
						t.Fatal(err)
					}
				}
				ga, gb := mustFloats(t, d.dev, a), mustFloats(t, d.dev, b)
				for i := range ga {
					if ga[i] != gb[i] {
						t.Fatalf("resumed run: p[%d] = %v, uninterrupted %v", i, gb[i], ga[i])
					}
				}
				if cfg.Name != "none" && ga[0] == float32(p0[0]) {
					t.Fatal("the parameters did not move")
				}
			})
		}
	}
}

func TestOptimizerSetStateRefusals(t *testing.T) {
	t.Parallel()
	dev := gpuhost.NewCPU(1)
	p := mustTensor(t, dev, []int{2, 2}, []float64{1, 2, 3, 4})
	four := [][]float32{{0, 0, 0, 0}}
	tests := []struct {
		name string
		cfg  gpuhost.OptimizerConfig
		st   gpuhost.OptimizerState
		want error
	}{
		{name: "negative-steps", cfg: gpuhost.OptimizerConfig{}, st: gpuhost.OptimizerState{Steps: -1}, want: gpuhost.ErrArgument},
		{name: "missing-slot", cfg: gpuhost.OptimizerConfig{}, st: gpuhost.OptimizerState{Steps: 1, Slots: map[string][][]float32{"exp_avg": four}}, want: gpuhost.ErrArgument},
		{name: "foreign-slot", cfg: gpuhost.OptimizerConfig{Name: "sgd"}, st: gpuhost.OptimizerState{Steps: 1, Slots: map[string][][]float32{"exp_avg": four}}, want: gpuhost.ErrArgument},
		{name: "wrong-size", cfg: gpuhost.OptimizerConfig{Name: "sgd", Momentum: 0.9}, st: gpuhost.OptimizerState{Steps: 1, Slots: map[string][][]float32{"momentum_buffer": {{1, 2, 3}}}}, want: gpuhost.ErrShape},
		{name: "wrong-count", cfg: gpuhost.OptimizerConfig{Name: "sgd", Momentum: 0.9}, st: gpuhost.OptimizerState{Steps: 1, Slots: map[string][][]float32{"momentum_buffer": {four[0], four[0]}}}, want: gpuhost.ErrArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := gpuhost.NewOptimizer(tt.cfg).SetState([]*gpuhost.Tensor{p}, tt.st); !errors.Is(err, tt.want) {
				t.Errorf("SetState = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestOptimizerConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  gpuhost.OptimizerConfig
		ok   bool
	}{
		{name: "defaults", ok: true},
		{name: "adamw-linear", cfg: gpuhost.OptimizerConfig{Name: "AdamW", Scheduler: "linear", NumTrainingSteps: 10}, ok: true},
		{name: "unknown", cfg: gpuhost.OptimizerConfig{Name: "lamb"}},
		{name: "unknown-schedule", cfg: gpuhost.OptimizerConfig{Scheduler: "cosine"}},
		{name: "linear-without-steps", cfg: gpuhost.OptimizerConfig{Scheduler: "linear"}},
		{name: "momentum-one", cfg: gpuhost.OptimizerConfig{Name: "sgd", Momentum: 1}},
		{name: "negative-clip", cfg: gpuhost.OptimizerConfig{ClipGradNorm: -1}},
		{name: "nan-lr", cfg: gpuhost.OptimizerConfig{LR: math.NaN()}},
		{name: "negative-warmup", cfg: gpuhost.OptimizerConfig{NumWarmupSteps: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); (err == nil) != tt.ok {
				t.Errorf("Validate = %v, want ok %v", err, tt.ok)
			}
		})
	}
}
