package gpuhost

import (
	"fmt"
	"math"
	"slices"

	"github.com/moehost/moehost/abi"
)

// Optimizer updates parameters from their gradients.
type Optimizer interface {
	// Step updates params in place from grads, which come in the same
	// order and with the same shapes. State, such as Adam's moments, is
	// kept per position in params.
	Step(params, grads []*Tensor) error
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

// sgd is plain stochastic gradient descent, without momentum.
type sgd struct{ lr float64 }

// NewSGD returns plain SGD: p −= lr·g.
func NewSGD(lr float64) Optimizer { return &sgd{lr: lr} }

func (o *sgd) Step(params, grads []*Tensor) error {
	if err := checkStep(params, grads); err != nil {
		return fmt.Errorf("sgd: %w", err)
	}
	for i, p := range params {
		if err := p.dev.sgdStep(p, grads[i], o.lr); err != nil {
			return fmt.Errorf("sgd: param %d: %w", i, err)
		}
	}
	return nil
}

// AdamConfig configures [NewAdam]. A zero field takes PyTorch's default:
// LR 1e-3, Beta1 0.9, Beta2 0.999, Eps 1e-8, WeightDecay 0. (So a beta of
// exactly 0 cannot be asked for; nobody trains with one.)
type AdamConfig struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
}

// withDefaults fills in PyTorch's defaults.
func (c AdamConfig) withDefaults() AdamConfig {
	if c.LR == 0 {
		c.LR = 1e-3
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
	return c
}

// adam is torch.optim.Adam without amsgrad.
type adam struct {
	cfg   AdamConfig
	err   error // a bad config, reported by every Step
	state []adamState
}

// adamState is one param's moments and step count.
type adamState struct {
	m, v *Tensor
	step int
}

// NewAdam returns Adam with exactly torch.optim.Adam's update: L2 weight
// decay added to the gradient, bias-corrected moments, and eps added after
// the square root of the bias-corrected second moment. A config outside
// torch's accepted ranges makes every Step fail with ErrArgument.
func NewAdam(cfg AdamConfig) Optimizer {
	c := cfg.withDefaults()
	o := &adam{cfg: c}
	switch {
	case !(c.LR > 0) || math.IsInf(c.LR, 0):
		o.err = fmt.Errorf("%w: adam: LR %v", ErrArgument, cfg.LR)
	case !(c.Beta1 > 0 && c.Beta1 < 1), !(c.Beta2 > 0 && c.Beta2 < 1):
		o.err = fmt.Errorf("%w: adam: betas %v, %v not in (0, 1)", ErrArgument, cfg.Beta1, cfg.Beta2)
	case !(c.Eps > 0), !(c.WeightDecay >= 0):
		o.err = fmt.Errorf("%w: adam: eps %v or weight decay %v", ErrArgument, cfg.Eps, cfg.WeightDecay)
	}
	return o
}

func (o *adam) Step(params, grads []*Tensor) error {
	if o.err != nil {
		return o.err
	}
	if err := checkStep(params, grads); err != nil {
		return fmt.Errorf("adam: %w", err)
	}
	if o.state != nil && len(o.state) != len(params) {
		return fmt.Errorf("%w: adam: %d params, earlier steps had %d", ErrArgument, len(params), len(o.state))
	}
	for i, p := range params {
		if o.state != nil && (o.state[i].m.dev != p.dev || !slices.Equal(o.state[i].m.shape, p.shape)) {
			return fmt.Errorf("%w: adam: param %d is %v, earlier steps had %v", ErrShape, i, p.shape, o.state[i].m.shape)
		}
	}
	if o.state == nil {
		st := make([]adamState, len(params))
		for i, p := range params {
			var err error
			if st[i].m, err = p.dev.Zeros(abi.DTypeFloat32, p.shape); err != nil {
				return fmt.Errorf("adam: %w", err)
			}
			if st[i].v, err = p.dev.Zeros(abi.DTypeFloat32, p.shape); err != nil {
				return fmt.Errorf("adam: %w", err)
			}
		}
		o.state = st
	}
	for i, p := range params {
		s := &o.state[i]
		s.step++
		c := adamCoeffs{
			lr: o.cfg.LR, beta1: o.cfg.Beta1, beta2: o.cfg.Beta2,
			eps: o.cfg.Eps, weightDecay: o.cfg.WeightDecay,
			bc1: 1 - math.Pow(o.cfg.Beta1, float64(s.step)),
			bc2: 1 - math.Pow(o.cfg.Beta2, float64(s.step)),
		}
		if err := p.dev.adamStep(p, grads[i], s.m, s.v, c); err != nil {
			return fmt.Errorf("adam: param %d: %w", i, err)
		}
	}
	return nil
}
