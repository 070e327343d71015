package host

import (
	"context"
	"fmt"

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
func (e *expert) attachPools(lim batch.Limits, m *metrics, notify func()) {
	dev := e.Device()
	e.restartsC = m.restarts.With(prometheus.Labels{"expert": e.uid})
	e.fwdStats = newPoolStats(m, e.uid, "forward", lim.WithDefaults())
	e.bwdStats = newPoolStats(m, e.uid, "backward", lim.WithDefaults())
	e.fwd = batch.NewPool(lim, batch.Ops[fwdReq, []*gpuhost.Tensor]{
		Rows: func(r fwdReq) int { return r.inputs[0].Shape()[0] },
		Split: func(r fwdReq, rows []int) ([]fwdReq, error) {
			parts, err := splitAll(dev, r.inputs, rows)
			out := make([]fwdReq, len(parts))
			for i, p := range parts {
				out[i] = fwdReq{inputs: p}
			}
			return out, err
		},
		Run: func(ctx context.Context, reqs []fwdReq) ([][]*gpuhost.Tensor, error) {
			ctx = gated(ctx)
			ins := make([][]*gpuhost.Tensor, len(reqs))
			for i, r := range reqs {
				ins[i] = r.inputs
			}
			inputs, rows, err := concatAll(dev, ins)
			if err != nil {
				return nil, err
			}
			outs, err := e.forward(ctx, inputs)
			if err != nil && len(reqs) > 1 && blamable(err) {
				dev.Release(inputs...)
				return e.forwardEach(ctx, reqs)
			}
			if err != nil {
				return nil, err
			}
			res, err := splitBack(dev, outs, rows)
			if len(reqs) > 1 {
				// The requests got copies; the batch's own tensors are dead.
				dev.Release(append(inputs, outs...)...)
			}
			return res, err
		},
		Join: func(parts [][]*gpuhost.Tensor) ([]*gpuhost.Tensor, error) { return joinAll(dev, parts) },
	}, e.fwdStats, notify)
	e.bwd = batch.NewPool(lim, batch.Ops[bwdReq, []*gpuhost.Tensor]{
		Rows: func(r bwdReq) int { return r.inputs[0].Shape()[0] },
		Split: func(r bwdReq, rows []int) ([]bwdReq, error) {
			ins, err := splitAll(dev, r.inputs, rows)
			if err != nil {
				return nil, err
			}
			grads, err := splitAll(dev, r.gradOutputs, rows)
			out := make([]bwdReq, len(ins))
			for i := range ins {
				out[i] = bwdReq{inputs: ins[i], gradOutputs: grads[i]}
			}
			return out, err
		},
		Run: func(ctx context.Context, reqs []bwdReq) ([][]*gpuhost.Tensor, error) {
			ctx = gated(ctx)
			ins := make([][]*gpuhost.Tensor, len(reqs))
			grads := make([][]*gpuhost.Tensor, len(reqs))
			for i, r := range reqs {
				ins[i], grads[i] = r.inputs, r.gradOutputs
			}
			inputs, rows, err := concatAll(dev, ins)
			if err != nil {
				return nil, err
			}
			gradOutputs, _, err := concatAll(dev, grads)
			if err != nil {
				return nil, err
			}
			gradInputs, err := e.backward(ctx, inputs, gradOutputs)
			if err != nil && len(reqs) > 1 && blamable(err) {
				dev.Release(append(inputs, gradOutputs...)...)
				return e.backwardEach(ctx, reqs)
			}
			if err != nil {
				return nil, err
			}
			res, err := splitBack(dev, gradInputs, rows)
			if len(reqs) > 1 {
				dev.Release(append(append(inputs, gradOutputs...), gradInputs...)...)
			}
			return res, err
		},
		Join: func(parts [][]*gpuhost.Tensor) ([]*gpuhost.Tensor, error) { return joinAll(dev, parts) },
	}, e.bwdStats, notify)
}

// gated hands the batch's lease on the device worker to the sandbox, so
// that the guest's own code runs without holding the device (see
// sched.Lease and sandbox.Gate).
func gated(ctx context.Context) context.Context {
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
// them by piece.
func splitAll(dev gpuhost.Device, ts []*gpuhost.Tensor, rows []int) ([][]*gpuhost.Tensor, error) {
	out := make([][]*gpuhost.Tensor, len(rows))
	for i := range out {
		out[i] = make([]*gpuhost.Tensor, len(ts))
	}
	for j, t := range ts {
		parts, err := dev.Split(t, rows)
		if err != nil {
			return nil, fmt.Errorf("unbatching tensor %d: %w", j, err)
		}
		for i, p := range parts {
			out[i][j] = p
		}
	}
	return out, nil
}

// joinAll concatenates the pieces of a split request, tensor by tensor.
func joinAll(dev gpuhost.Device, parts [][]*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	out, _, err := concatAll(dev, parts)
	return out, err
}
