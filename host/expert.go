package host

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moehost/moehost/abi"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/host/rpc"
)

// unhealthyAfter is how many failed batches in a row mark an expert
// unhealthy. A success makes it healthy again.
const unhealthyAfter = 3

// expert is one hosted expert: a module instance bound to its own
// parameters and optimizer. It runs one batch at a time.
type expert struct {
	uid     string
	module  *sandbox.Module
	binding sandbox.Binding
	opt     gpuhost.Optimizer // replaced by a restore, under mu
	optCfg  OptimizerConfig
	optJSON string // optCfg, for checkpoints' metadata
	inputs  []*moehostv1.TensorSchema
	outputs []*moehostv1.TensorSchema
	// The same schema, as the sandbox checks it.
	inSpecs, outSpecs []sandbox.Spec

	slot  *instanceSlot // the instance, maybe shared with other experts (share.go)
	share string        // slot's key in the loader
	// compiledKey is the module's key in the loader; unpin lets its
	// owner delete the module again.
	compiledKey string
	unpin       func()
	owner       string // the tenant that deployed it; "" for the operator
	// forwardAccess and backwardAccess say who may call it.
	forwardAccess, backwardAccess Access
	// deployed is its deployment record when it was deployed while
	// serving (or restored from one), nil for a configured expert.
	deployed *deployment

	fwd                *batch.Pool[fwdReq, []*gpuhost.Tensor]
	bwd                *batch.Pool[bwdReq, []*gpuhost.Tensor]
	fwdStats, bwdStats *poolStats

	forwardBatches, backwardBatches   atomic.Int64
	forwardExamples, backwardExamples atomic.Int64
	failures                          atomic.Int64 // consecutive

	// callTimeout is the instances' CallTimeout, the unit of quarantine.
	callTimeout time.Duration
	// restarts counts replaced instances; timeouts counts calls killed
	// at callTimeout.
	restarts, timeouts atomic.Int64
	restartsC          prometheus.Counter
	// q is the expert's quarantine: its own for the operator's, its
	// tenant's for a tenant's (see quarantineOf).
	q *quarantine
}

// newExpert instantiates module for uid and reads its schema.
func newExpert(ctx context.Context, uid string, module *sandbox.Module, dev gpuhost.Device, config map[string]int64, opt gpuhost.Optimizer, paramBytes int64) (*expert, error) {
	b := sandbox.Binding{
		Device: dev,
		Params: sandbox.NewParamStore(dev, []byte(uid), paramBytes),
		Config: maps.Clone(config),
	}
	inst, err := module.Instantiate(ctx, b)
	if err != nil {
		return nil, fmt.Errorf("loading expert %q: %w", uid, err)
	}
	return &expert{
		uid:      uid,
		module:   module,
		binding:  b,
		opt:      opt,
		inputs:   schemaOf(inst.Inputs()),
		outputs:  schemaOf(inst.Outputs()),
		inSpecs:  inst.Inputs(),
		outSpecs: inst.Outputs(),
		slot:     &instanceSlot{inst: inst, users: 1},
	}, nil
}

func schemaOf(specs []sandbox.Spec) []*moehostv1.TensorSchema {
	out := make([]*moehostv1.TensorSchema, len(specs))
	for i, s := range specs {
		out[i] = &moehostv1.TensorSchema{Name: s.Name, Dtype: moehostv1.DType(s.DType), Shape: s.Shape}
	}
	return out
}

// instance returns a live instance bound to the expert's parameters,
// replacing one that trapped. Call with e.slot.mu held.
func (e *expert) instance(ctx context.Context) (*sandbox.Instance, error) {
	if e.slot.inst == nil || e.slot.inst.Closed() {
		e.restarts.Add(1)
		if e.restartsC != nil {
			e.restartsC.Inc()
		}
		inst, err := e.module.Instantiate(ctx, e.binding)
		if err != nil {
			return nil, fmt.Errorf("%w: replacing the instance of %q: %w", ErrNotRun, e.uid, err)
		}
		e.slot.inst = inst
	}
	if err := e.slot.inst.Bind(e.binding.Params); err != nil {
		return nil, fmt.Errorf("binding the parameters of %q: %w", e.uid, err)
	}
	return e.slot.inst, nil
}

// Quarantine: an expert whose call ran past its CallTimeout runs nothing
// for quarantineFactor call timeouts, doubled for each further timeout
// before a success, up to quarantineMaxDoublings doublings. A guest that
// spins in every call therefore holds its device worker for at most
// 1/(1+quarantineFactor) = 10% of the time, less as the backoff grows.
const (
	quarantineFactor       = 9
	quarantineMaxDoublings = 6
)

// quarantine is the state of a quarantine. An operator's expert has its
// own; a tenant's experts share their tenant's, so that a tenant whose
// guest ran past its call timeout cannot start afresh by deploying it
// again under a fresh uid: all of its experts wait the quarantine out,
// and its strikes (the backoff) carry over.
type quarantine struct {
	until   atomic.Int64 // UnixNano: nothing runs before
	by      atomic.Value // string: the uid that timed out last
	mu      sync.Mutex
	strikes int // timeouts since the last success, for the backoff
}

// quarantineOf returns the quarantine of a new expert of owner. Call with
// l.mu held.
func (l *loader) quarantineOf(owner string) *quarantine {
	if owner == "" {
		return new(quarantine)
	}
	if l.quarantines == nil {
		l.quarantines = map[string]*quarantine{}
	}
	q := l.quarantines[owner]
	if q == nil {
		q = new(quarantine)
		l.quarantines[owner] = q
	}
	return q
}

// quarantine starts or extends the quarantine after a timeout.
func (e *expert) quarantine() time.Duration {
	q := e.q
	q.mu.Lock()
	defer q.mu.Unlock()
	d := e.callTimeout * quarantineFactor << min(q.strikes, quarantineMaxDoublings)
	q.strikes++
	q.by.Store(e.uid)
	q.until.Store(time.Now().Add(d).UnixNano())
	return d
}

// checkQuarantine fails fast while the expert is quarantined.
func (e *expert) checkQuarantine() error {
	until := time.Unix(0, e.q.until.Load())
	if left := time.Until(until); left > 0 {
		if by, _ := e.q.by.Load().(string); by != e.uid {
			return fmt.Errorf("%w: %q of tenant %q ran past its call timeout, and the tenant's experts are quarantined for %v more", ErrQuarantined, by, e.owner, left.Round(time.Millisecond))
		}
		return fmt.Errorf("%w: %q ran past its call timeout of %v and is quarantined for %v more", ErrQuarantined, e.uid, e.callTimeout, left.Round(time.Millisecond))
	}
	return nil
}

func (e *expert) Device() gpuhost.Device { return e.binding.Device }

func (e *expert) Schema() (inputs, outputs []*moehostv1.TensorSchema) {
	return e.inputs, e.outputs
}

// Forward queues a forward request in the expert's pool and waits for it.
// It takes the inputs (see rpc.Expert): the pool or a refusal here
// releases them.
func (e *expert) Forward(ctx context.Context, inputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	if err := e.checkQuarantine(); err != nil {
		e.Device().Release(inputs...)
		return nil, err
	}
	outs, err := e.fwd.Submit(ctx, fwdReq{inputs: inputs})
	return outs, poolError(e.uid, err)
}

// Backward queues a backward request in the expert's pool and waits for
// it. It takes the inputs and output gradients, as Forward does.
func (e *expert) Backward(ctx context.Context, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	if err := e.checkQuarantine(); err != nil {
		e.Device().Release(slices.Concat(inputs, gradOutputs)...)
		return nil, err
	}
	grads, err := e.bwd.Submit(ctx, bwdReq{inputs: inputs, gradOutputs: gradOutputs})
	return grads, poolError(e.uid, err)
}

// poolError names the expert in the pools' own refusals.
func poolError(uid string, err error) error {
	if errors.Is(err, batch.ErrQueueFull) || errors.Is(err, batch.ErrClosed) {
		return fmt.Errorf("expert %q: %w", uid, err)
	}
	return err
}

// forward runs one batch. Called by the device worker.
func (e *expert) forward(ctx context.Context, inputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	e.slot.mu.Lock()
	defer e.slot.mu.Unlock()
	if err := e.checkQuarantine(); err != nil {
		return nil, err
	}
	inst, err := e.instance(ctx)
	if err != nil {
		return nil, err
	}
	outs, err := inst.Forward(ctx, inputs, nil)
	if err != nil {
		return nil, e.fail(err)
	}
	e.succeed()
	e.forwardBatches.Add(1)
	e.forwardExamples.Add(int64(inputs[0].Shape()[0]))
	return outs, nil
}

// backward runs one batch and takes one optimizer step. Called by the
// device worker.
func (e *expert) backward(ctx context.Context, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	e.slot.mu.Lock()
	defer e.slot.mu.Unlock()
	if err := e.checkQuarantine(); err != nil {
		return nil, err
	}
	gradInputs, gradParams, params, err := e.gradients(ctx, inputs, gradOutputs)
	if err != nil {
		return nil, err
	}
	if err := e.step(params, gradParams, gradInputs); err != nil {
		return nil, err
	}
	e.backwardBatches.Add(1)
	e.backwardExamples.Add(int64(inputs[0].Shape()[0]))
	return gradInputs, nil
}

// step takes one optimizer step and releases the parameter gradients.
// Call with e.slot.mu held.
func (e *expert) step(params, gradParams []*gpuhost.Tensor, gradInputs ...[]*gpuhost.Tensor) error {
	err := e.opt.Step(params, gradParams)
	// A custom backward may hand one tensor back as both a parameter's and
	// an input's gradient; the input's must survive until it is sent.
	e.Device().Release(slices.DeleteFunc(gradParams, func(g *gpuhost.Tensor) bool {
		return slices.ContainsFunc(gradInputs, func(gi []*gpuhost.Tensor) bool { return slices.Contains(gi, g) })
	})...)
	if err != nil {
		return e.fail(fmt.Errorf("optimizer step: %w", err))
	}
	e.succeed()
	return nil
}

// blamable reports whether a batch's error may come from one request's
// data, so that rerunning the requests one by one can find the culprit: a
// guest's error code, or a trap (a guest that divides by an input, say).
// Timeouts are not rerun: the expert is quarantined.
func blamable(err error) bool {
	return errors.Is(err, sandbox.ErrGuest) || trapped(err)
}

// trapped reports whether err is a trap that is not a timeout or a
// cancellation: one that cost the instance.
func trapped(err error) bool {
	return errors.Is(err, sandbox.ErrTrap) &&
		!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

// rerunTraps bounds the traps that the one-by-one rerun of a failed batch
// may cost, since each replaces the instance: past it, the requests not
// yet rerun fail instead. Two find a single culprit and serve every
// batch-mate; a batch with more culprits than that looks like an attack.
const rerunTraps = 2

// rerun tells whether the one-by-one rerun may run another request, and
// otherwise gives its error; traps counts the rerun's traps so far.
func (e *expert) rerun(traps int) error {
	if traps < rerunTraps {
		return nil
	}
	return fmt.Errorf("%w: expert %q trapped on %d requests of this batch, so the rest were not run", ErrNotRun, e.uid, traps)
}

// forwardEach runs each request as a batch of its own, after their batch
// failed with a guest error or a trap, so that the culprit gets the error
// and its batch-mates their results. Called by the device worker.
func (e *expert) forwardEach(ctx context.Context, reqs []fwdReq) ([][]*gpuhost.Tensor, error) {
	res := make([][]*gpuhost.Tensor, len(reqs))
	errs := make(batch.Errors, len(reqs))
	failed, traps := false, 0
	for i, r := range reqs {
		if errs[i] = e.rerun(traps); errs[i] == nil {
			res[i], errs[i] = e.forward(ctx, r.inputs)
		}
		if trapped(errs[i]) {
			traps++
		}
		failed = failed || errs[i] != nil
	}
	if !failed {
		return res, nil
	}
	return res, errs
}

// backwardEach is forwardEach for backward batches. The parameter
// gradients of the requests that succeed are summed, which is what their
// batch would have given, and the optimizer takes one step for them all.
func (e *expert) backwardEach(ctx context.Context, reqs []bwdReq) ([][]*gpuhost.Tensor, error) {
	e.slot.mu.Lock()
	defer e.slot.mu.Unlock()
	if err := e.checkQuarantine(); err != nil {
		return nil, err
	}
	dev := e.Device()
	res := make([][]*gpuhost.Tensor, len(reqs))
	errs := make(batch.Errors, len(reqs))
	var sum, params []*gpuhost.Tensor
	examples := 0
	traps := 0
	for i, r := range reqs {
		if errs[i] = e.rerun(traps); errs[i] != nil {
			continue
		}
		gradInputs, gradParams, ps, err := e.gradients(ctx, r.inputs, r.gradOutputs)
		if err != nil {
			if trapped(err) {
				traps++
			}
			errs[i] = err
			continue
		}
		res[i], params = gradInputs, ps
		examples += r.inputs[0].Shape()[0]
		if sum == nil {
			sum = gradParams
			continue
		}
		for j, g := range gradParams {
			s, err := gpuhost.Apply(dev, nil, abi.OpAdd, []*gpuhost.Tensor{sum[j], g}, nil)
			if err != nil {
				return nil, e.fail(fmt.Errorf("summing parameter gradients: %w", err))
			}
			// Summed in; a custom backward may have handed one on as an
			// input's gradient too, which must survive until it is sent.
			releaseBut(dev, res, sum[j], g)
			sum[j] = s
		}
	}
	if sum != nil {
		if err := e.step(params, sum, res...); err != nil {
			return nil, err
		}
		e.backwardBatches.Add(1)
		e.backwardExamples.Add(int64(examples))
	}
	if !slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
		return res, nil
	}
	return res, errs
}

// gradients runs hivemind's stateless recompute: the guest's forward with
// the tape on, then the tape backward from gradOutputs. It returns the
// gradients of the inputs and of the parameters. Call with e.slot.mu held.
func (e *expert) gradients(ctx context.Context, inputs, gradOutputs []*gpuhost.Tensor) (gradInputs, gradParams, params []*gpuhost.Tensor, err error) {
	inst, err := e.instance(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	ps := e.binding.Params.Params()
	params = make([]*gpuhost.Tensor, len(ps))
	for i, p := range ps {
		params[i] = p.Tensor
	}
	if inst.HasBackward() {
		gradInputs, gradParams, err = e.customGradients(ctx, inst, inputs, gradOutputs, params)
	} else {
		gradInputs, gradParams, err = e.tapeGradients(ctx, inst, inputs, gradOutputs, params)
	}
	if err != nil {
		return nil, nil, nil, e.fail(err)
	}
	// Only float inputs are differentiable. An integer or bool input (ids,
	// a key padding mask) gets a zero gradient of its own dtype and shape,
	// as hivemind returns zeros_like(input) for an input without a grad.
	for i, in := range inputs {
		if gradInputs[i] == nil {
			if gradInputs[i], err = e.Device().Zeros(in.DType(), in.Shape()); err != nil {
				return nil, nil, nil, e.fail(fmt.Errorf("gradient of input %d: %w", i, err))
			}
		}
	}
	return gradInputs, gradParams, params, nil
}

// tapeGradients runs the guest's forward with the tape on, then the tape
// backward. Inputs that are not float32 get nil gradients.
func (e *expert) tapeGradients(ctx context.Context, inst *sandbox.Instance, inputs, gradOutputs, params []*gpuhost.Tensor) (gradInputs, gradParams []*gpuhost.Tensor, err error) {
	tape := gpuhost.NewTape()
	// The forward's tensors are dead once the tape has run backward.
	defer tape.Release(e.Device())
	outs, err := inst.Forward(ctx, inputs, tape)
	if err != nil {
		return nil, nil, err
	}
	wrt := make([]*gpuhost.Tensor, 0, len(inputs)+len(params))
	var floatIn []int // indices into inputs of the wrt inputs
	for i, in := range inputs {
		if in.DType() == abi.DTypeFloat32 {
			floatIn = append(floatIn, i)
			wrt = append(wrt, in)
		}
	}
	wrt = append(wrt, params...)
	// The tape's backward runs the guest's graph on the host: it gets the
	// guest's CallTimeout, and the kernels stop within about a
	// millisecond of it or of the callers leaving.
	bctx := ctx
	if e.callTimeout > 0 {
		var cancel context.CancelFunc
		bctx, cancel = context.WithTimeoutCause(ctx, e.callTimeout, errTapeTimeout)
		defer cancel()
	}
	grads, err := tape.BackwardContext(bctx, e.Device(), outs, gradOutputs, wrt)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil, nil, fmt.Errorf("backward through the tape: %w", err)
	case errors.Is(err, errTapeTimeout):
		return nil, nil, fmt.Errorf("backward through the tape: %w", err)
	default:
		return nil, nil, fmt.Errorf("backward through the tape: %w", err)
	}
	gradInputs = make([]*gpuhost.Tensor, len(inputs))
	for j, i := range floatIn {
		gradInputs[i] = grads[j]
	}
	return gradInputs, grads[len(floatIn):], nil
}

// customGradients runs the module's own moe_backward. A parameter it gave
// no gradient gets zero.
func (e *expert) customGradients(ctx context.Context, inst *sandbox.Instance, inputs, gradOutputs, params []*gpuhost.Tensor) (gradInputs, gradParams []*gpuhost.Tensor, err error) {
	gradInputs, byParam, err := inst.Backward(ctx, inputs, gradOutputs)
	if err != nil {
		return nil, nil, err
	}
	gradParams = make([]*gpuhost.Tensor, len(params))
	for i, p := range params {
		if gradParams[i] = byParam[p]; gradParams[i] == nil {
			if gradParams[i], err = e.Device().Zeros(p.DType(), p.Shape()); err != nil {
				return nil, nil, fmt.Errorf("gradient of parameter %d: %w", i, err)
			}
		}
	}
	return gradInputs, gradParams, nil
}

// errTapeTimeout is the cause of a tape backward stopped at the call
// timeout: like a guest past its CallTimeout, the expert is quarantined,
// but its instance is not broken and stays.
var errTapeTimeout = fmt.Errorf("%w: the tape's backward ran past the call timeout", context.DeadlineExceeded)

// fail counts a failed call against the expert's health. Only the host's
// and the instance's failures (traps, timeouts, internal errors) count towards
// unhealthy: bad inputs, a guest's error code and cancellations come from
// the request, not from the expert. A call killed at its CallTimeout also
// quarantines the expert. Call with e.slot.mu held.
func (e *expert) fail(err error) error {
	switch {
	case limited(err), errors.Is(err, sandbox.ErrInvalidInput), errors.Is(err, sandbox.ErrGuest):
		// The memory limit, bad inputs and a guest's error code are not
		// the expert's fault: the batch is refused, and the expert stays
		// healthy.
		return err
	case errors.Is(err, sandbox.ErrTrap) && errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, errTapeTimeout):
		e.failures.Add(1)
		e.timeouts.Add(1)
		d := e.quarantine()
		return fmt.Errorf("expert %q ran past its call timeout of %v and is quarantined for %v: %w", e.uid, e.callTimeout, d, err)
	case errors.Is(err, sandbox.ErrTrap):
		e.failures.Add(1)
		return err
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return err
	}
	e.failures.Add(1)
	return err
}

// succeed records a successful batch. Call with e.slot.mu held.
func (e *expert) succeed() {
	e.failures.Store(0)
	e.q.mu.Lock()
	e.q.strikes = 0
	e.q.mu.Unlock()
}

// limited tells whether err comes from a limit on memory: the host's
// (gpuhost.ErrOutOfMemory) or the call's byte budget, which a guest
// reports by returning abi.ErrBudgetExceeded.
func limited(err error) bool {
	return errOutOfMemory(err) || errors.Is(err, sandbox.ErrBudget)
}

func (e *expert) Info() *moehostv1.ExpertInfo {
	return &moehostv1.ExpertInfo{
		Uid:            e.uid,
		Inputs:         e.inputs,
		Outputs:        e.outputs,
		ModuleDigest:   e.module.Digest(),
		AbiVersion:     abi.Version,
		ParameterCount: e.binding.Params.Count(),
		Config:         maps.Clone(e.binding.Config),
		Owner:          e.owner,
		Healthy:        e.failures.Load() < unhealthyAfter,
		ForwardPool:    e.fwdStats.snapshot(),
		BackwardPool:   e.bwdStats.snapshot(),
		Stats: &moehostv1.ExpertStats{
			ForwardBatches:   e.forwardBatches.Load(),
			BackwardBatches:  e.backwardBatches.Load(),
			ForwardExamples:  e.forwardExamples.Load(),
			BackwardExamples: e.backwardExamples.Load(),
			InstanceRestarts: e.restarts.Load(),
			CallTimeouts:     e.timeouts.Load(),
		},
	}
}

// close releases the expert's instance, once no other expert shares it.
func (e *expert) close(ctx context.Context) error { return e.slot.close(ctx) }

// Access implements rpc.Guarded: configured experts, whose accesses are
// zero, are public.
func (e *expert) Access() (owner string, forward, backward rpc.Access) {
	forward, backward = e.forwardAccess, e.backwardAccess
	if forward == 0 {
		forward = rpc.AccessPublic
	}
	if backward == 0 {
		backward = rpc.AccessPublic
	}
	return e.owner, forward, backward
}

var (
	_ rpc.Expert  = (*expert)(nil)
	_ rpc.Guarded = (*expert)(nil)
)
