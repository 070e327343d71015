package experts

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Loaded is one spec that LoadAll made.
type Loaded struct {
	Expert *Expert
	Fresh  bool // its module was compiled for it
}

// LoadAll loads specs side by side, as many at a time as threads (the
// kernels' threads, the cores; one at a time on several devices, so that
// they go round-robin in order): experts of one module and config wait
// for the first to compile the module and start the instance they share,
// then restore or draw their parameters in parallel. Each is in the
// registry once made, so that a failed start releases it; none is
// scheduled yet. The error is that of the first spec in order that failed
// for a reason of its own (not the cancellation that a failure of another
// caused).
func (r *Registry) LoadAll(ctx context.Context, specs []Spec, threads int) ([]Loaded, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make([]Loaded, len(specs))
	errs := make([]error, len(specs))
	n := max(1, min(threads, len(specs)))
	if r.MultiLane() {
		// Each load picks the device with the fewest experts made so
		// far (pickLane), which loads side by side would all see alike.
		n = 1
	}
	r.mu.Lock()
	l := r.loader
	r.mu.Unlock()
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i, ec := range specs {
		sem <- struct{}{} // loads start in the given order
		wg.Go(func() {
			defer func() { <-sem }()
			if err := ctx.Err(); err != nil {
				errs[i] = fmt.Errorf("starting: %w", err)
				return
			}
			l.mu.Lock()
			e, fresh, err := r.load(ctx, l, ec)
			l.mu.Unlock()
			if err != nil {
				errs[i] = err
				// A checkpoint mismatch stops nothing else: the loads go
				// on, so that the error names every expert whose
				// checkpoints belong to another module or config, not
				// the first only.
				if !errors.Is(err, ErrCheckpointMismatch) {
					cancel()
				}
				return
			}
			out[i] = Loaded{Expert: e, Fresh: fresh}
			r.put(e)
		})
	}
	wg.Wait()
	var first error
	var mismatches []error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if errors.Is(err, ErrCheckpointMismatch) {
			mismatches = append(mismatches, err)
		}
		if first == nil || (errors.Is(first, context.Canceled) && !errors.Is(err, context.Canceled)) {
			first = err
		}
	}
	if len(mismatches) > 1 && errors.Is(first, ErrCheckpointMismatch) {
		// One error, one line per expert (in the given order).
		return out, fmt.Errorf("%d experts' checkpoints do not match:\n%w", len(mismatches), errors.Join(mismatches...))
	}
	return out, first
}

// RestoreDeployments deploys what the deployments file holds, before the
// registry serves (see restoreDeployments).
func (r *Registry) RestoreDeployments(ctx context.Context) error {
	r.mu.Lock()
	l := r.loader
	r.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	return r.restoreDeployments(ctx, l)
}

// ValidateModule compiles wasm (of digest) in owner's runtime, which
// checks it against the ABI and the module limits, and warms the
// compilation cache. It takes the bytes rather than a digest so that an
// upload is validated while staged, before the store shows it to anyone.
func (r *Registry) ValidateModule(ctx context.Context, owner string, wasm []byte, digest string) error {
	l, err := r.live()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, key, _, err := l.compile(ctx, owner, l.limits(owner), wasm, digest)
	if err != nil {
		return err
	}
	return l.release(ctx, key)
}
