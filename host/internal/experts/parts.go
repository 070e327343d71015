package experts

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/host/internal/sched"
	"github.com/moehost/moehost/sdk/wire"
)

// The values an expert is made of, one job each. Each keeps its own
// fields behind its own methods; the expert's request paths (expert.go)
// combine them.

// guest is what runs an expert: its compiled module, the instance it runs
// on (maybe shared with other experts, share.go) and the binding of its
// own parameters and config to that instance.
type guest struct {
	module  *sandbox.Module
	binding sandbox.Binding
	slot    *instanceSlot
	// share is slot's key in the loader; compiledKey is the module's, and
	// unpin lets the loader delete the module again once it is unused.
	share, compiledKey string
	unpin              func()
	// callTimeout is the instances' CallTimeout, the unit of quarantine
	// and the bound of a tape's backward.
	callTimeout time.Duration
	// restores are the digests of the modules whose checkpoints the
	// expert restores as its own (ModuleSource.RestoresCheckpointsOf).
	restores []string
}

// instance returns st's live instance bound to the guest's parameters,
// replacing one that trapped (or making the slot's spare); replaced says
// whether it did. uid names the expert in errors. Call with st held.
func (g *guest) instance(ctx context.Context, uid string, st seat) (inst *sandbox.Instance, replaced bool, err error) {
	if *st.inst == nil || (*st.inst).Closed() {
		// The spare's first instance replaces nothing.
		replaced = *st.inst != nil || st.inst == &g.slot.inst
		inst, err := g.module.Instantiate(ctx, g.binding)
		if err != nil {
			return nil, true, fmt.Errorf("%w: replacing the instance of %q: %w", ErrNotRun, uid, err)
		}
		*st.inst = inst
	}
	if err := (*st.inst).Bind(g.binding.Params); err != nil {
		return nil, replaced, fmt.Errorf("binding the parameters of %q: %w", uid, err)
	}
	return *st.inst, replaced, nil
}

// device is where the guest's parameters and tensors live.
func (g *guest) device() gpuhost.Device { return g.binding.Device }

// digest is the module's.
func (g *guest) digest() string { return g.module.Digest() }

// params returns the parameters' tensors, in declaration order.
func (g *guest) params() []*gpuhost.Tensor {
	ps := g.binding.Params.Params()
	out := make([]*gpuhost.Tensor, len(ps))
	for i, p := range ps {
		out[i] = p.Tensor
	}
	return out
}

// schema is what an expert takes and gives, as its instance declared it,
// in the one vocabulary of the wire (Info publishes it, and clients check
// against it).
type schema struct {
	inputs, outputs []*moehostv1.TensorSchema
}

// schemaOf reads inst's declared schema.
func schemaOf(inst *sandbox.Instance) schema {
	return schema{inputs: protoSchema(inst.Inputs()), outputs: protoSchema(inst.Outputs())}
}

func protoSchema(specs []sandbox.Spec) []*moehostv1.TensorSchema {
	out := make([]*moehostv1.TensorSchema, len(specs))
	for i, s := range specs {
		out[i] = &moehostv1.TensorSchema{Name: s.Name, Dtype: moehostv1.DType(s.DType), Shape: s.Shape}
	}
	return out
}

// check is the one schema check of a request, on every path: the
// ingress (admitTensors) runs it before anything is admitted or reaches
// the device. gradOutputs are a backward request's output gradients; a
// forward has none.
func (s schema) check(inputs, gradOutputs []wire.Meta, backward bool) error {
	batch, err := wire.Fit(s.inputs, "input", inputs, -1)
	if err == nil && backward {
		_, err = wire.Fit(s.outputs, "grad_output", gradOutputs, batch)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadTensors, err)
	}
	return nil
}

// trainer is an expert's optimizer and the config it was built from.
type trainer struct {
	opt  gpuhost.Optimizer // replaced by a restore, under the slot's mu
	cfg  gpuhost.OptimizerConfig
	json string // cfg, for checkpoints' metadata
	// updates counts the optimizer steps and restores, under the slot's
	// mu, so that a save sees that nothing changed since the last one
	// without copying the state.
	updates atomic.Int64
}

// configure records the config the optimizer was built from.
func (t *trainer) configure(cfg gpuhost.OptimizerConfig) { t.cfg, t.json = cfg, optimizerJSON(cfg) }

// tenancy says who owns an expert and who may call it, and how it came to
// be served.
type tenancy struct {
	owner string // the tenant that deployed it; "" for the operator
	// forward and backward say who may call it; zero for a configured
	// expert, which is public.
	forward, backward Access
	// deployed is its deployment record when it was deployed while
	// serving (or restored from one), nil for a configured expert.
	deployed *deployment
}

// access resolves the zero accesses: zero accesses are public.
func (t *tenancy) access() (owner string, forward, backward Access) {
	forward, backward = t.forward, t.backward
	if forward == 0 {
		forward = AccessPublic
	}
	if backward == 0 {
		backward = AccessPublic
	}
	return t.owner, forward, backward
}

// pools are an expert's forward and backward queues and their statistics.
// The zero value is an expert whose pools are not attached yet.
type pools struct {
	fwd                *batch.Pool[fwdReq, []*gpuhost.Tensor]
	bwd                *batch.Pool[bwdReq, []*gpuhost.Tensor]
	fwdStats, bwdStats *poolStats
}

// close fails what is queued with err and refuses what comes.
func (p *pools) close(err error) {
	if p.fwd != nil {
		p.fwd.Close(err)
		p.bwd.Close(err)
	}
}

// Schedule puts both pools on w.
func (p *pools) schedule(w *sched.Worker, opts ...sched.AddOption) {
	w.Add(p.fwd, opts...)
	w.Add(p.bwd, opts...)
}

// unschedule takes both pools off w, waiting for a batch of theirs that
// runs.
func (p *pools) unschedule(w *sched.Worker) {
	w.Remove(p.fwd)
	w.Remove(p.bwd)
}

// UnhealthyAfter is how many failed batches in a row mark an expert
// unhealthy. A success makes it healthy again.
const UnhealthyAfter = 3

// counters are what an expert has done, for Info, /metrics and
// checkpoints.
type counters struct {
	forwardBatches, backwardBatches   atomic.Int64
	forwardExamples, backwardExamples atomic.Int64
	failures                          atomic.Int64 // consecutive
	// restarts counts replaced instances; timeouts counts calls killed
	// at the call timeout.
	restarts, timeouts atomic.Int64
	restartsC          prometheus.Counter // restarts in /metrics; nil before the pools are attached
}

func (c *counters) forwarded(examples int) {
	c.forwardBatches.Add(1)
	c.forwardExamples.Add(int64(examples))
}

func (c *counters) backwarded(examples int) {
	c.backwardBatches.Add(1)
	c.backwardExamples.Add(int64(examples))
}

// restored sets the backward counters from a checkpoint.
func (c *counters) restored(steps, examples int64) {
	c.backwardBatches.Store(steps)
	c.backwardExamples.Store(examples)
}

func (c *counters) restarted() {
	c.restarts.Add(1)
	if c.restartsC != nil {
		c.restartsC.Inc()
	}
}

// failed counts a failure against health; timedOut one that ran past the
// call timeout too.
func (c *counters) failed()   { c.failures.Add(1) }
func (c *counters) timedOut() { c.failures.Add(1); c.timeouts.Add(1) }
func (c *counters) succeeded() {
	c.failures.Store(0)
}

func (c *counters) healthy() bool { return c.failures.Load() < UnhealthyAfter }

func (c *counters) proto() *moehostv1.ExpertStats {
	return &moehostv1.ExpertStats{
		ForwardBatches:   c.forwardBatches.Load(),
		BackwardBatches:  c.backwardBatches.Load(),
		ForwardExamples:  c.forwardExamples.Load(),
		BackwardExamples: c.backwardExamples.Load(),
		InstanceRestarts: c.restarts.Load(),
		CallTimeouts:     c.timeouts.Load(),
	}
}

// Quarantine: an expert whose call ran past its CallTimeout runs nothing
// for QuarantineFactor call timeouts, doubled for each further timeout
// before a success, up to quarantineMaxDoublings doublings. A guest that
// spins in every call therefore holds its device worker for at most
// 1/(1+QuarantineFactor) = 10% of the time, less as the backoff grows.
const (
	QuarantineFactor       = 9
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

// impose starts or extends the quarantine after uid's call ran past
// callTimeout, and returns its length.
func (q *quarantine) impose(uid string, callTimeout time.Duration) time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	d := callTimeout * QuarantineFactor << min(q.strikes, quarantineMaxDoublings)
	q.strikes++
	q.by.Store(uid)
	q.until.Store(time.Now().Add(d).UnixNano())
	return d
}

// check fails fast while the quarantine lasts, for expert uid of owner,
// whose call timeout is callTimeout.
func (q *quarantine) check(uid, owner string, callTimeout time.Duration) error {
	until := time.Unix(0, q.until.Load())
	if left := time.Until(until); left > 0 {
		if by, _ := q.by.Load().(string); by != uid {
			return fmt.Errorf("%w: %q of tenant %q ran past its call timeout, and the tenant's experts are quarantined for %v more", ErrQuarantined, by, owner, left.Round(time.Millisecond))
		}
		return fmt.Errorf("%w: %q ran past its call timeout of %v and is quarantined for %v more", ErrQuarantined, uid, callTimeout, left.Round(time.Millisecond))
	}
	return nil
}

// forgive resets the backoff after a success.
func (q *quarantine) forgive() {
	q.mu.Lock()
	q.strikes = 0
	q.mu.Unlock()
}
