package experts

import (
	"context"
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/host/internal/sched"
)

// The payloads of the expert's pools. Every tensor has the batch as its
// first dimension.
type (
	fwdReq struct{ inputs []*gpuhost.Tensor }
	bwdReq struct{ inputs, gradOutputs []*gpuhost.Tensor }
)

// attachPools gives e its forward and backward pools, served by notify's
// worker.
//
// The pools own the tensors of a request from Submit on (see batch.Ops):
// Run releases a batch's inputs and everything it made but the results;
// Drop releases a request that never ran, Discard a result nobody
// collected, Split and Join the tensors they copied from. So device
// memory goes back when the work is over, not when the garbage collector
// runs.
func (e *Expert) attachPools(lim batch.Limits, m *Metrics, notify func(), kill context.Context) {
	dev := e.Device()
	e.stats.restartsC = m.restarts.With(prometheus.Labels{"expert": e.uid})
	p := &e.pools
	p.fwdStats = newPoolStats(m, e.uid, "forward", lim.WithDefaults())
	p.bwdStats = newPoolStats(m, e.uid, "backward", lim.WithDefaults())
	discard := func(ts []*gpuhost.Tensor) { dev.Release(ts...) }
	p.fwd = batch.NewPool(lim, batch.Ops[fwdReq, []*gpuhost.Tensor]{
		Rows: func(r fwdReq) int { return r.inputs[0].Shape()[0] },
		Split: func(r fwdReq, rows []int) ([]fwdReq, error) {
			defer dev.Release(r.inputs...)
			parts, err := splitAll(dev, r.inputs, rows)
			out := make([]fwdReq, len(parts))
			for i, p := range parts {
				out[i] = fwdReq{inputs: p}
			}
			return out, err
		},
		Run: func(ctx context.Context, reqs []fwdReq) (res [][]*gpuhost.Tensor, err error) {
			ctx = gated(ctx, kill)
			ins := make([][]*gpuhost.Tensor, len(reqs))
			for i, r := range reqs {
				ins[i] = r.inputs
			}
			var inputs, outs []*gpuhost.Tensor
			defer func() { releaseBut(dev, res, slices.Concat(append(ins, inputs, outs)...)...) }()
			inputs, rows, err := concatAll(dev, ins)
			if err != nil {
				return nil, err
			}
			outs, err = e.forward(ctx, inputs)
			if err != nil && len(reqs) > 1 && blamable(err) {
				return e.forwardEach(ctx, reqs)
			}
			if err != nil {
				return nil, err
			}
			return splitBack(dev, outs, rows)
		},
		Join:    func(parts [][]*gpuhost.Tensor) ([]*gpuhost.Tensor, error) { return joinAll(dev, parts) },
		Drop:    func(r fwdReq) { dev.Release(r.inputs...) },
		Discard: discard,
	}, p.fwdStats, notify)
	p.bwd = batch.NewPool(lim, batch.Ops[bwdReq, []*gpuhost.Tensor]{
		Rows: func(r bwdReq) int { return r.inputs[0].Shape()[0] },
		Split: func(r bwdReq, rows []int) ([]bwdReq, error) {
			defer dev.Release(slices.Concat(r.inputs, r.gradOutputs)...)
			ins, err := splitAll(dev, r.inputs, rows)
			if err != nil {
				return nil, err
			}
			grads, err := splitAll(dev, r.gradOutputs, rows)
			if err != nil {
				dev.Release(slices.Concat(ins...)...)
				return nil, err
			}
			out := make([]bwdReq, len(ins))
			for i := range ins {
				out[i] = bwdReq{inputs: ins[i], gradOutputs: grads[i]}
			}
			return out, nil
		},
		Run: func(ctx context.Context, reqs []bwdReq) (res [][]*gpuhost.Tensor, err error) {
			ctx = gated(ctx, kill)
			ins := make([][]*gpuhost.Tensor, len(reqs))
			grads := make([][]*gpuhost.Tensor, len(reqs))
			for i, r := range reqs {
				ins[i], grads[i] = r.inputs, r.gradOutputs
			}
			var inputs, gradOutputs, gradInputs []*gpuhost.Tensor
			defer func() {
				releaseBut(dev, res, slices.Concat(append(append(ins, grads...), inputs, gradOutputs, gradInputs)...)...)
			}()
			inputs, rows, err := concatAll(dev, ins)
			if err != nil {
				return nil, err
			}
			if gradOutputs, _, err = concatAll(dev, grads); err != nil {
				return nil, err
			}
			gradInputs, err = e.backward(ctx, inputs, gradOutputs)
			if err != nil && len(reqs) > 1 && blamable(err) {
				return e.backwardEach(ctx, reqs)
			}
			if err != nil {
				return nil, err
			}
			return splitBack(dev, gradInputs, rows)
		},
		Join:    func(parts [][]*gpuhost.Tensor) ([]*gpuhost.Tensor, error) { return joinAll(dev, parts) },
		Drop:    func(r bwdReq) { dev.Release(slices.Concat(r.inputs, r.gradOutputs)...) },
		Discard: discard,
	}, p.bwdStats, notify)
}

// releaseBut releases ts, but not the tensors of keep: a guest may hand
// an input on as an output, or an output gradient as an input's.
func releaseBut(dev gpuhost.Device, keep [][]*gpuhost.Tensor, ts ...*gpuhost.Tensor) {
	dev.Release(slices.DeleteFunc(ts, func(t *gpuhost.Tensor) bool {
		return slices.ContainsFunc(keep, func(k []*gpuhost.Tensor) bool { return slices.Contains(k, t) })
	})...)
}

// gated hands the batch's lease on the device worker to the sandbox, so
// that the guest's own code runs without holding the device (see
// sched.Lease and sandbox.Gate), and the registry's kill context, which
// ends the guest at shutdown (sandbox.WithKill).
func gated(ctx, kill context.Context) context.Context {
	ctx = sandbox.WithKill(ctx, kill)
	if l := sched.LeaseFrom(ctx); l != nil {
		return sandbox.WithGate(ctx, l)
	}
	return ctx
}

// concatAll joins the requests' tensors along the batch dimension, tensor
// by tensor, and returns each request's rows. One request is passed
// through without a copy.
func concatAll(dev gpuhost.Device, reqs [][]*gpuhost.Tensor) ([]*gpuhost.Tensor, []int, error) {
	rows := make([]int, len(reqs))
	for i, r := range reqs {
		rows[i] = r[0].Shape()[0]
	}
	if len(reqs) == 1 {
		return reqs[0], rows, nil
	}
	out := make([]*gpuhost.Tensor, len(reqs[0]))
	parts := make([]*gpuhost.Tensor, len(reqs))
	for j := range out {
		for i, r := range reqs {
			parts[i] = r[j]
		}
		t, err := dev.Concat(parts)
		if err != nil {
			dev.Release(out[:j]...)
			return nil, nil, fmt.Errorf("batching tensor %d: %w", j, err)
		}
		out[j] = t
	}
	return out, rows, nil
}

// splitBack cuts batch outputs into one []*Tensor per request.
func splitBack(dev gpuhost.Device, outs []*gpuhost.Tensor, rows []int) ([][]*gpuhost.Tensor, error) {
	if len(rows) == 1 {
		return [][]*gpuhost.Tensor{outs}, nil
	}
	return splitAll(dev, outs, rows)
}

// splitAll splits each tensor into pieces of the given rows and regroups
// them by piece. On error it releases the pieces it made.
func splitAll(dev gpuhost.Device, ts []*gpuhost.Tensor, rows []int) ([][]*gpuhost.Tensor, error) {
	out := make([][]*gpuhost.Tensor, len(rows))
	for i := range out {
		out[i] = make([]*gpuhost.Tensor, len(ts))
	}
	for j, t := range ts {
		parts, err := dev.Split(t, rows)
		if err != nil {
			dev.Release(slices.Concat(out...)...)
			return nil, fmt.Errorf("unbatching tensor %d: %w", j, err)
		}
		for i, p := range parts {
			out[i][j] = p
		}
	}
	return out, nil
}

// joinAll concatenates the pieces of a split request, tensor by tensor,
// and releases the pieces.
func joinAll(dev gpuhost.Device, parts [][]*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	out, _, err := concatAll(dev, parts)
	if len(parts) > 1 {
		dev.Release(slices.Concat(parts...)...)
	}
	return out, err
}
