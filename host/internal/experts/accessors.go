package experts

import (
	"context"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// UID is the expert's name.
func (e *Expert) UID() string { return e.uid }

// Owner is the tenant that deployed the expert, "" for the operator's.
func (e *Expert) Owner() string { return e.tenancy.owner }

// Digest is the digest of the module the expert runs.
func (e *Expert) Digest() string { return e.guest.digest() }

// ParamCount is the number of the expert's parameters' elements.
func (e *Expert) ParamCount() int64 { return e.guest.binding.Params.Count() }

// ParamBytes is what the expert's parameters cost its owner, overhead
// included.
func (e *Expert) ParamBytes() int64 { return e.guest.binding.Params.Bytes() }

// What follows is for diagnostics and the server's tests: they read the
// room's state through these rather than its fields.

// Params returns the expert's parameters, in declaration order.
func (e *Expert) Params() []sandbox.Param { return e.guest.binding.Params.Params() }

// InstanceKey identifies the Wasm instance the expert runs on: experts
// that share an instance have equal keys.
func (e *Expert) InstanceKey() any { return e.guest.slot }

// QueueDepths returns the requests waiting in the expert's forward and
// backward pools.
func (e *Expert) QueueDepths() (forward, backward int) {
	if e.pools.fwd == nil {
		return 0, 0
	}
	return e.pools.fwd.Depth(), e.pools.bwd.Depth()
}

// Running reports whether a batch of the expert runs now.
func (e *Expert) Running() bool {
	if !e.mu.TryLock() {
		return true
	}
	e.mu.Unlock()
	return false
}

// Barrier returns once no batch of the expert runs, waiting for one that
// does.
func (e *Expert) Barrier() {
	e.mu.Lock()
	defer e.mu.Unlock()
}

// ClosePools fails what the expert's pools hold with err and refuses what
// comes, as Undeploy does first.
func (e *Expert) ClosePools(err error) { e.pools.close(err) }

// LoaderStats are what the loader holds.
type LoaderStats struct {
	Compiled, Runtimes, Slots int // modules, runtimes and shared instances
	Starting, Busy            int // instances starting; uids being deployed or undeployed
}

// LoaderStats counts what the loader holds.
func (r *Registry) LoaderStats() LoaderStats {
	r.mu.Lock()
	l := r.loader
	r.mu.Unlock()
	if l == nil {
		return LoaderStats{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return LoaderStats{Compiled: len(l.compiled), Runtimes: len(l.runtimes), Slots: len(l.slots), Starting: len(l.starting), Busy: len(l.busy)}
}

// InstanceUsers counts the experts that run on e's instance.
func (e *Expert) InstanceUsers() int {
	e.guest.slot.mu.Lock()
	defer e.guest.slot.mu.Unlock()
	return e.guest.slot.users
}

// LaneIndex returns the index of the device e runs on.
func (r *Registry) LaneIndex(e *Expert) int {
	ln := r.laneOf(e)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, l := range r.lanes {
		if l == ln {
			return i
		}
	}
	return -1
}

// ForwardBatch runs one forward batch on the expert directly, as its
// device worker does, without its pools: for benchmarks of the batch
// path alone. The caller keeps inputs and owns the outputs.
func (e *Expert) ForwardBatch(ctx context.Context, inputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	return e.forward(ctx, inputs)
}

// BackwardBatch is ForwardBatch for a backward batch, optimizer step
// included.
func (e *Expert) BackwardBatch(ctx context.Context, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	return e.backward(ctx, inputs, gradOutputs)
}

// CheckQuarantine returns ErrQuarantined while the expert is quarantined.
func (e *Expert) CheckQuarantine() error { return e.checkQuarantine() }

// QuarantineStrikes counts the expert's quarantine's timeouts since its
// last success, which set its backoff.
func (e *Expert) QuarantineStrikes() int {
	e.q.mu.Lock()
	defer e.q.mu.Unlock()
	return e.q.strikes
}

// DistinctWorkers counts the device workers: one per device.
func (r *Registry) DistinctWorkers() int {
	seen := map[any]bool{}
	for _, w := range r.workers() {
		seen[w] = true
	}
	return len(seen)
}
