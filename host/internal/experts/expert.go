package experts

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/moehost/moehost/abi"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// Expert is one hosted expert: a module instance bound to its own
// parameters and optimizer. It runs one batch at a time. It is made of
// small values with one job each (parts.go); its own methods are the
// request paths that combine them.
type Expert struct {
	uid     string
	guest   guest    // what runs: the module, its instance and its parameters
	schema  schema   // what it takes and gives
	trainer trainer  // its optimizer
	tenancy tenancy  // who owns it and may call it; its deployment record
	pools   pools    // its forward and backward queues
	stats   counters // what it has done
	// q is the expert's quarantine: its own for the operator's, its
	// tenant's for a tenant's (see quarantineOf).
	q *quarantine
	// mu is held by each batch of the expert, and by snapshots and
	// restores, which so see its state between two batches. The instance
	// a batch runs on has its own lock (instanceSlot), taken after mu.
	mu sync.Mutex
}

// newExpert instantiates module for uid and reads its schema.
func newExpert(ctx context.Context, uid string, module *sandbox.Module, dev gpuhost.Device, config map[string]int64, opt gpuhost.Optimizer, paramBytes int64) (*Expert, error) {
	b := sandbox.Binding{
		Device: dev,
		Params: sandbox.NewParamStore(dev, []byte(uid), paramBytes),
		Config: maps.Clone(config),
	}
	inst, err := module.Instantiate(ctx, b)
	if err != nil {
		return nil, fmt.Errorf("loading expert %q: %w", uid, err)
	}
	return &Expert{
		uid:     uid,
		guest:   guest{module: module, binding: b, slot: &instanceSlot{inst: inst, users: 1}},
		schema:  schemaOf(inst),
		trainer: trainer{opt: opt},
	}, nil
}

// instance returns st's live instance bound to the expert's parameters,
// replacing one that trapped. Call with e.mu and st held.
func (e *Expert) instance(ctx context.Context, st seat) (*sandbox.Instance, error) {
	inst, replaced, err := e.guest.instance(ctx, e.uid, st)
	if replaced {
		e.stats.restarted()
	}
	return inst, err
}

func (e *Expert) Device() gpuhost.Device { return e.guest.device() }

func (e *Expert) Schema() (inputs, outputs []*moehostv1.TensorSchema) {
	return e.schema.inputs, e.schema.outputs
}

// checkQuarantine fails fast while the expert is quarantined.
func (e *Expert) checkQuarantine() error {
	return e.q.check(e.uid, e.tenancy.owner, e.guest.callTimeout)
}

// submitForward queues a forward request in the expert's pool and waits for it.
// It takes the inputs (see rpc.Expert): the pool or a refusal here
// releases them.
func (e *Expert) submitForward(ctx context.Context, inputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	if err := e.checkQuarantine(); err != nil {
		e.Device().Release(inputs...)
		return nil, err
	}
	outs, err := e.pools.fwd.Submit(ctx, fwdReq{inputs: inputs})
	return outs, poolError(e.uid, err)
}

// submitBackward queues a backward request in the expert's pool and waits for
// it. It takes the inputs and output gradients, as Forward does.
func (e *Expert) submitBackward(ctx context.Context, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	if err := e.checkQuarantine(); err != nil {
		e.Device().Release(slices.Concat(inputs, gradOutputs)...)
		return nil, err
	}
	grads, err := e.pools.bwd.Submit(ctx, bwdReq{inputs: inputs, gradOutputs: gradOutputs})
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
func (e *Expert) forward(ctx context.Context, inputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	lockOffDevice(ctx, &e.mu)
	defer e.mu.Unlock()
	if err := e.checkQuarantine(); err != nil {
		return nil, err
	}
	st := e.guest.slot.take(ctx)
	defer st.release()
	inst, err := e.instance(ctx, st)
	if err != nil {
		return nil, err
	}
	outs, err := inst.Forward(ctx, inputs, nil)
	if err != nil {
		return nil, e.fail(err)
	}
	e.succeed()
	e.stats.forwarded(inputs[0].Shape()[0])
	return outs, nil
}

// backward runs one batch and takes one optimizer step. Called by the
// device worker.
func (e *Expert) backward(ctx context.Context, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	lockOffDevice(ctx, &e.mu)
	defer e.mu.Unlock()
	if err := e.checkQuarantine(); err != nil {
		return nil, err
	}
	st := e.guest.slot.take(ctx)
	defer st.release()
	gradInputs, gradParams, params, err := e.gradients(ctx, st, inputs, gradOutputs)
	if err != nil {
		return nil, err
	}
	if err := e.step(params, gradParams, gradInputs); err != nil {
		return nil, err
	}
	e.stats.backwarded(inputs[0].Shape()[0])
	return gradInputs, nil
}

// step takes one optimizer step and releases the parameter gradients.
// Call with e.mu held.
func (e *Expert) step(params, gradParams []*gpuhost.Tensor, gradInputs ...[]*gpuhost.Tensor) error {
	e.trainer.updates.Add(1) // a failed step may have changed some
	err := e.trainer.opt.Step(params, gradParams)
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
func (e *Expert) rerun(traps int) error {
	if traps < rerunTraps {
		return nil
	}
	return fmt.Errorf("%w: expert %q trapped on %d requests of this batch, so the rest were not run", ErrNotRun, e.uid, traps)
}

// forwardEach runs each request as a batch of its own, after their batch
// failed with a guest error or a trap, so that the culprit gets the error
// and its batch-mates their results. Called by the device worker.
func (e *Expert) forwardEach(ctx context.Context, reqs []fwdReq) ([][]*gpuhost.Tensor, error) {
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
func (e *Expert) backwardEach(ctx context.Context, reqs []bwdReq) ([][]*gpuhost.Tensor, error) {
	lockOffDevice(ctx, &e.mu)
	defer e.mu.Unlock()
	if err := e.checkQuarantine(); err != nil {
		return nil, err
	}
	st := e.guest.slot.take(ctx)
	defer st.release()
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
		gradInputs, gradParams, ps, err := e.gradients(ctx, st, r.inputs, r.gradOutputs)
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
		e.stats.backwarded(examples)
	}
	if !slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
		return res, nil
	}
	return res, errs
}

// gradients runs hivemind's stateless recompute: the guest's forward with
// the tape on, then the tape backward from gradOutputs. It returns the
// gradients of the inputs and of the parameters. Call with e.mu and st
// held.
func (e *Expert) gradients(ctx context.Context, st seat, inputs, gradOutputs []*gpuhost.Tensor) (gradInputs, gradParams, params []*gpuhost.Tensor, err error) {
	inst, err := e.instance(ctx, st)
	if err != nil {
		return nil, nil, nil, err
	}
	params = e.guest.params()
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
func (e *Expert) tapeGradients(ctx context.Context, inst *sandbox.Instance, inputs, gradOutputs, params []*gpuhost.Tensor) (gradInputs, gradParams []*gpuhost.Tensor, err error) {
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
	if t := e.guest.callTimeout; t > 0 {
		var cancel context.CancelFunc
		bctx, cancel = context.WithTimeoutCause(ctx, t, errTapeTimeout)
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
func (e *Expert) customGradients(ctx context.Context, inst *sandbox.Instance, inputs, gradOutputs, params []*gpuhost.Tensor) (gradInputs, gradParams []*gpuhost.Tensor, err error) {
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
// quarantines the expert. Call with e.mu held.
func (e *Expert) fail(err error) error {
	switch {
	case limited(err), errors.Is(err, sandbox.ErrInvalidInput), errors.Is(err, sandbox.ErrGuest):
		// The memory limit, bad inputs and a guest's error code are not
		// the expert's fault: the batch is refused, and the expert stays
		// healthy.
		return err
	case errors.Is(err, sandbox.ErrTrap) && errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, errTapeTimeout):
		e.stats.timedOut()
		d := e.q.impose(e.uid, e.guest.callTimeout)
		return fmt.Errorf("expert %q ran past its call timeout of %v and is quarantined for %v: %w", e.uid, e.guest.callTimeout, d, err)
	case errors.Is(err, sandbox.ErrTrap):
		e.stats.failed()
		return err
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return err
	}
	e.stats.failed()
	return err
}

// succeed records a successful batch. Call with e.mu held.
func (e *Expert) succeed() {
	e.stats.succeeded()
	e.q.forgive()
}

// limited tells whether err comes from a limit on memory: the host's
// (gpuhost.ErrOutOfMemory) or the call's byte budget, which a guest
// reports by returning abi.ErrBudgetExceeded.
func limited(err error) bool {
	return errors.Is(err, gpuhost.ErrOutOfMemory) || errors.Is(err, sandbox.ErrBudget)
}

func (e *Expert) Info() *moehostv1.ExpertInfo {
	return &moehostv1.ExpertInfo{
		Uid:            e.uid,
		Inputs:         e.schema.inputs,
		Outputs:        e.schema.outputs,
		ModuleDigest:   e.guest.digest(),
		AbiVersion:     abi.Version,
		ParameterCount: e.guest.binding.Params.Count(),
		Config:         maps.Clone(e.guest.binding.Config),
		Owner:          e.tenancy.owner,
		Healthy:        e.stats.healthy(),
		ForwardPool:    e.pools.fwdStats.snapshot(),
		BackwardPool:   e.pools.bwdStats.snapshot(),
		Stats:          e.stats.proto(),
	}
}

// close releases the expert's instance, once no other expert shares it.
func (e *Expert) close(ctx context.Context) error { return e.guest.slot.close(ctx) }

// Access says who owns the expert and may call it (rpc.Guarded): configured experts, whose accesses are
// zero, are public.
func (e *Expert) Access() (owner string, forward, backward Access) { return e.tenancy.access() }
