package gpuhost

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/moehost/moehost/abi"
)

// Optimizer updates parameters from their gradients. Its state (moments,
// momentum buffers, the step count that positions the schedule) can be
// exported and imported, so that training resumes where a checkpoint left
// it.
type Optimizer interface {
	// Step updates params in place from grads, which come in the same
	// order and with the same shapes. State, such as Adam's moments, is
	// kept per position in params. Step never writes to grads.
	Step(params, grads []*Tensor) error
	// State returns a copy of the optimizer's state.
	State() (OptimizerState, error)
	// SetState replaces the state with st, checking it against params,
	// the tensors later Steps will update.
	SetState(params []*Tensor, st OptimizerState) error
}

// OptimizerState is an optimizer's state outside the parameters, in a
// device-independent form, for checkpoints.
type OptimizerState struct {
	// Steps counts the steps taken; it is the schedule's position.
	Steps int64
	// Slots holds per-parameter buffers under torch's names ("exp_avg",
	// "exp_avg_sq", "momentum_buffer"), each indexed like the params.
	// It is empty before the first step and for stateless optimizers.
	Slots map[string][][]float32
}

// Algorithms of [OptimizerConfig].
const (
	AlgorithmAdam  = "adam"
	AlgorithmAdamW = "adamw"
	AlgorithmSGD   = "sgd"
	AlgorithmNone  = "none"
)

// Schedules of [OptimizerConfig].
const (
	ScheduleNone   = "none"
	ScheduleLinear = "linear"
)

// OptimizerConfig configures [NewOptimizer] with the options of hivemind's
// run_server, under their names there and on the wire (moehost.v1's
// OptimizerConfig). It is the one optimizer config: host.OptimizerConfig
// and rpc.OptimizerConfig are aliases of it. A zero field takes torch's
// default for the algorithm.
type OptimizerConfig struct {
	// Name is the algorithm: "adam" (default), "adamw", "sgd" or "none"
	// (no update).
	Name string
	// LR is the base learning rate. Default: 1e-3 (adam, adamw), 1e-2 (sgd).
	LR float64
	// Beta1, Beta2 and Eps are Adam's; defaults 0.9, 0.999, 1e-8.
	Beta1, Beta2, Eps float64
	// WeightDecay is L2 added to the gradient (adam, sgd) or decoupled
	// (adamw). Default 0, and 1e-2 for adamw, as in torch.
	WeightDecay float64
	// Momentum is SGD's momentum, without dampening. Default 0.
	Momentum float64
	// ClipGradNorm, when positive, scales the gradients so that their
	// global L2 norm is at most this, as torch's clip_grad_norm_.
	ClipGradNorm float64
	// Scheduler is "none" (default) or "linear": transformers'
	// get_linear_schedule_with_warmup, which hivemind uses (warmup, then
	// linear decay to 0 at NumTrainingSteps).
	Scheduler string
	// NumWarmupSteps and NumTrainingSteps shape the linear schedule.
	NumWarmupSteps, NumTrainingSteps int64
}

// WithDefaults returns c with its zero fields set to their defaults and
// its names in lower case.
func (c OptimizerConfig) WithDefaults() OptimizerConfig {
	c.Name = strings.ToLower(c.Name)
	c.Scheduler = strings.ToLower(c.Scheduler)
	if c.Name == "" {
		c.Name = AlgorithmAdam
	}
	if c.Scheduler == "" {
		c.Scheduler = ScheduleNone
	}
	if c.LR == 0 {
		c.LR = 1e-3
		if c.Name == AlgorithmSGD {
			c.LR = 1e-2
		}
	}
	if c.Beta1 == 0 {
		c.Beta1 = 0.9
	}
	if c.Beta2 == 0 {
		c.Beta2 = 0.999
	}
	if c.Eps == 0 {
		c.Eps = 1e-8
	}
	if c.WeightDecay == 0 && c.Name == AlgorithmAdamW {
		c.WeightDecay = 1e-2
	}
	return c
}

// Validate reports the first setting outside torch's accepted ranges.
func (c OptimizerConfig) Validate() error {
	c = c.WithDefaults()
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	switch {
	case !slices.Contains([]string{AlgorithmAdam, AlgorithmAdamW, AlgorithmSGD, AlgorithmNone}, c.Name):
		return fmt.Errorf("%w: unknown optimizer %q; want adam, adamw, sgd or none", ErrArgument, c.Name)
	case !slices.Contains([]string{ScheduleNone, ScheduleLinear}, c.Scheduler):
		return fmt.Errorf("%w: unknown scheduler %q; want linear or none", ErrArgument, c.Scheduler)
	case !(c.LR > 0) || !finite(c.LR):
		return fmt.Errorf("%w: learning rate %v is not positive", ErrArgument, c.LR)
	case !(c.Beta1 > 0 && c.Beta1 < 1), !(c.Beta2 > 0 && c.Beta2 < 1):
		return fmt.Errorf("%w: betas %v, %v not in (0, 1)", ErrArgument, c.Beta1, c.Beta2)
	case !(c.Eps > 0) || !finite(c.Eps):
		return fmt.Errorf("%w: eps %v is not positive", ErrArgument, c.Eps)
	case !(c.WeightDecay >= 0) || !finite(c.WeightDecay):
		return fmt.Errorf("%w: weight decay %v is negative", ErrArgument, c.WeightDecay)
	case !(c.Momentum >= 0 && c.Momentum < 1):
		return fmt.Errorf("%w: momentum %v not in [0, 1)", ErrArgument, c.Momentum)
	case !(c.ClipGradNorm >= 0) || !finite(c.ClipGradNorm):
		return fmt.Errorf("%w: clip grad norm %v is negative", ErrArgument, c.ClipGradNorm)
	case c.NumWarmupSteps < 0, c.NumTrainingSteps < 0:
		return fmt.Errorf("%w: warmup steps %d or training steps %d is negative", ErrArgument, c.NumWarmupSteps, c.NumTrainingSteps)
	case c.Scheduler == ScheduleLinear && c.NumTrainingSteps == 0:
		return fmt.Errorf("%w: the linear schedule needs the number of training steps", ErrArgument)
	}
	return nil
}

// LRAt returns the learning rate of the step after steps steps: the base
// rate times transformers' linear warmup-then-decay factor,
// step/warmup during warmup and (total−step)/(total−warmup) after it,
// never below 0. Like hivemind, which calls scheduler.step() after
// optimizer.step(), the first step uses factor 0 when there is a warmup.
func (c OptimizerConfig) LRAt(steps int64) float64 {
	c = c.WithDefaults()
	if c.Scheduler != ScheduleLinear {
		return c.LR
	}
	if steps < c.NumWarmupSteps {
		return c.LR * float64(steps) / float64(max(1, c.NumWarmupSteps))
	}
	return c.LR * max(0, float64(c.NumTrainingSteps-steps)/float64(max(1, c.NumTrainingSteps-c.NumWarmupSteps)))
}

// optimizer implements every algorithm of OptimizerConfig.
type optimizer struct {
	cfg   OptimizerConfig
	err   error // a bad config, reported by every Step
	steps int64
	// slots are the per-param buffers, nil before the first step: m and v
	// for Adam, the momentum buffer (in m) for SGD with momentum.
	m, v []*Tensor
}

// NewOptimizer returns the optimizer cfg describes. A config that fails
// Validate makes every Step fail with ErrArgument.
func NewOptimizer(cfg OptimizerConfig) Optimizer {
	o := &optimizer{cfg: cfg.WithDefaults()}
	if err := cfg.Validate(); err != nil {
		o.err = fmt.Errorf("%s: %w", o.cfg.Name, err)
	}
	return o
}

// NewSGD returns plain SGD: p −= lr·g.
func NewSGD(lr float64) Optimizer {
	o := &optimizer{cfg: OptimizerConfig{Name: AlgorithmSGD, LR: lr}.WithDefaults()}
	if !(lr > 0) {
		o.err = fmt.Errorf("%w: sgd: learning rate %v is not positive", ErrArgument, lr)
	}
	return o
}

// AdamConfig configures [NewAdam]. A zero field takes PyTorch's default:
// LR 1e-3, Beta1 0.9, Beta2 0.999, Eps 1e-8, WeightDecay 0. (So a beta of
// exactly 0 cannot be asked for; nobody trains with one.)
type AdamConfig struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
}

// NewAdam returns Adam with exactly torch.optim.Adam's update: L2 weight
// decay added to the gradient, bias-corrected moments, and eps added after
// the square root of the bias-corrected second moment. A config outside
// torch's accepted ranges makes every Step fail with ErrArgument.
func NewAdam(cfg AdamConfig) Optimizer {
	return NewOptimizer(OptimizerConfig{Name: AlgorithmAdam, LR: cfg.LR, Beta1: cfg.Beta1, Beta2: cfg.Beta2, Eps: cfg.Eps, WeightDecay: cfg.WeightDecay})
}

// checkStep validates the arguments of a Step.
func checkStep(params, grads []*Tensor) error {
	if len(params) != len(grads) {
		return fmt.Errorf("%w: step: %d params but %d grads", ErrArgument, len(params), len(grads))
	}
	for i, p := range params {
		if p == nil || p.dev == nil {
			return fmt.Errorf("%w: step: param %d is not a device tensor", ErrArgument, i)
		}
		if err := checkFloat(p.dev, p); err != nil {
			return fmt.Errorf("%w: step: param %d: %w", ErrArgument, i, err)
		}
		if err := checkFloat(p.dev, grads[i]); err != nil {
			return fmt.Errorf("%w: step: grad %d: %w", ErrArgument, i, err)
		}
		if !slices.Equal(p.shape, grads[i].shape) {
			return fmt.Errorf("%w: step: param %d is %v but its grad is %v", ErrShape, i, p.shape, grads[i].shape)
		}
	}
	return nil
}

// slotCount is how many buffers per param the algorithm keeps.
func (o *optimizer) slotCount() int {
	switch {
	case o.cfg.Name == AlgorithmAdam, o.cfg.Name == AlgorithmAdamW:
		return 2
	case o.cfg.Name == AlgorithmSGD && o.cfg.Momentum > 0:
		return 1
	}
	return 0
}

// checkState validates params against the buffers of earlier steps.
func (o *optimizer) checkState(params []*Tensor) error {
	if o.m == nil {
		return nil
	}
	if len(o.m) != len(params) {
		return fmt.Errorf("%w: %d params, earlier steps had %d", ErrArgument, len(params), len(o.m))
	}
	for i, p := range params {
		if o.m[i].dev != p.dev || !slices.Equal(o.m[i].shape, p.shape) {
			return fmt.Errorf("%w: param %d is %v, earlier steps had %v", ErrShape, i, p.shape, o.m[i].shape)
		}
	}
	return nil
}

// allocSlots makes zero buffers for params.
func (o *optimizer) allocSlots(params []*Tensor) error {
	n := o.slotCount()
	if n == 0 || o.m != nil {
		return nil
	}
	m := make([]*Tensor, len(params))
	var v []*Tensor
	if n == 2 {
		v = make([]*Tensor, len(params))
	}
	for i, p := range params {
		var err error
		if m[i], err = p.dev.Zeros(abi.DTypeFloat32, p.shape); err != nil {
			return err
		}
		m[i].Pin()
		if v != nil {
			if v[i], err = p.dev.Zeros(abi.DTypeFloat32, p.shape); err != nil {
				return err
			}
			v[i].Pin()
		}
	}
	o.m, o.v = m, v
	return nil
}

// gradScale returns torch's clip_grad_norm_ coefficient for grads, or 1.
func (o *optimizer) gradScale(grads []*Tensor) (float64, error) {
	if o.cfg.ClipGradNorm <= 0 {
		return 1, nil
	}
	var sq float64
	for i, g := range grads {
		s, err := g.dev.sumSquares(g)
		if err != nil {
			return 0, fmt.Errorf("norm of grad %d: %w", i, err)
		}
		sq += s
	}
	coef := o.cfg.ClipGradNorm / (math.Sqrt(sq) + 1e-6)
	return min(coef, 1), nil
}

func (o *optimizer) Step(params, grads []*Tensor) error {
	if o.err != nil {
		return o.err
	}
	name := o.cfg.Name
	if err := checkStep(params, grads); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := o.checkState(params); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := o.allocSlots(params); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	lr := o.cfg.LRAt(o.steps)
	o.steps++
	if name == AlgorithmNone {
		return nil
	}
	scale, err := o.gradScale(grads)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	for i, p := range params {
		switch name {
		case AlgorithmSGD:
			var buf *Tensor
			if o.m != nil {
				buf = o.m[i]
			}
			err = p.dev.sgdStep(p, grads[i], buf, sgdCoeffs{lr: lr, momentum: o.cfg.Momentum, weightDecay: o.cfg.WeightDecay, gradScale: scale})
		default:
			c := adamCoeffs{
				lr: lr, beta1: o.cfg.Beta1, beta2: o.cfg.Beta2,
				eps: o.cfg.Eps, weightDecay: o.cfg.WeightDecay,
				decoupled: name == AlgorithmAdamW, gradScale: scale,
				bc1: 1 - math.Pow(o.cfg.Beta1, float64(o.steps)),
				bc2: 1 - math.Pow(o.cfg.Beta2, float64(o.steps)),
			}
			err = p.dev.adamStep(p, grads[i], o.m[i], o.v[i], c)
		}
		if err != nil {
			return fmt.Errorf("%s: param %d: %w", name, i, err)
		}
	}
	return nil
}

// slotNames are torch's state_dict names of the buffers in o.m and o.v.
func (o *optimizer) slotNames() (m, v string) {
	if o.cfg.Name == AlgorithmSGD {
		return "momentum_buffer", ""
	}
	return "exp_avg", "exp_avg_sq"
}

func (o *optimizer) State() (OptimizerState, error) {
	st := OptimizerState{Steps: o.steps, Slots: map[string][][]float32{}}
	mName, vName := o.slotNames()
	for _, s := range []struct {
		name string
		ts   []*Tensor
	}{{mName, o.m}, {vName, o.v}} {
		if s.ts == nil {
			continue
		}
		vals := make([][]float32, len(s.ts))
		for i, t := range s.ts {
			var err error
			if vals[i], err = t.dev.Float32s(t); err != nil {
				return OptimizerState{}, fmt.Errorf("%s: exporting %s %d: %w", o.cfg.Name, s.name, i, err)
			}
		}
		st.Slots[s.name] = vals
	}
	return st, nil
}

func (o *optimizer) SetState(params []*Tensor, st OptimizerState) error {
	name := o.cfg.Name
	if st.Steps < 0 {
		return fmt.Errorf("%w: %s: state has %d steps", ErrArgument, name, st.Steps)
	}
	for _, p := range params {
		if p == nil || p.dev == nil {
			return fmt.Errorf("%w: %s: a param is not a device tensor", ErrArgument, name)
		}
	}
	mName, vName := o.slotNames()
	want := map[string]bool{}
	if len(st.Slots) > 0 && o.slotCount() > 0 {
		want[mName] = true
		if o.slotCount() == 2 {
			want[vName] = true
		}
	}
	for k := range st.Slots {
		if !want[k] {
			return fmt.Errorf("%w: %s: state has a %q buffer, which this optimizer does not keep", ErrArgument, name, k)
		}
	}
	load := func(slot string) ([]*Tensor, error) {
		vals, ok := st.Slots[slot]
		if !ok {
			return nil, fmt.Errorf("%w: %s: state has no %q buffer", ErrArgument, name, slot)
		}
		if len(vals) != len(params) {
			return nil, fmt.Errorf("%w: %s: %q has %d buffers for %d params", ErrArgument, name, slot, len(vals), len(params))
		}
		ts := make([]*Tensor, len(params))
		for i, p := range params {
			if len(vals[i]) != p.n {
				return nil, fmt.Errorf("%w: %s: %q buffer %d has %d values for a param of shape %v", ErrShape, name, slot, i, len(vals[i]), p.shape)
			}
			t, err := p.dev.FromFloat32(p.shape, vals[i])
			if err != nil {
				return nil, fmt.Errorf("%s: %q buffer %d: %w", name, slot, i, err)
			}
			t.Pin()
			ts[i] = t
		}
		return ts, nil
	}
	var m, v []*Tensor
	var err error
	if want[mName] {
		if m, err = load(mName); err != nil {
			return err
		}
	}
	if want[vName] {
		if v, err = load(vName); err != nil {
			return err
		}
	}
	o.steps, o.m, o.v = st.Steps, m, v
	return nil
}

var _ Optimizer = (*optimizer)(nil)

// Assign overwrites the float32 tensor dst with vals in place, on dst's
// device, so that a restored parameter stays the tensor that instances
// already hold.
func Assign(dst *Tensor, vals []float32) error {
	if dst == nil || dst.dev == nil {
		return fmt.Errorf("%w: assign: not a device tensor", ErrArgument)
	}
	if err := checkFloat(dst.dev, dst); err != nil {
		return fmt.Errorf("%w: assign: %w", ErrArgument, err)
	}
	if len(vals) != dst.n {
		return fmt.Errorf("%w: assign: %d values for %v", ErrShape, len(vals), dst.shape)
	}
	src, err := dst.dev.FromFloat32(dst.shape, vals)
	if err != nil {
		return fmt.Errorf("assign: %w", err)
	}
	defer dst.dev.Release(src)
	if err := dst.dev.copy(dst, src); err != nil {
		return fmt.Errorf("assign: %w", err)
	}
	return nil
}
