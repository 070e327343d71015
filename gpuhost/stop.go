package gpuhost

import (
	"context"
	"errors"
	"fmt"

	"github.com/moehost/moehost/gpuhost/internal/cpu"
)

// errStopped is a kernel's error when it gave up because its op's context
// ended; ApplyMultiContext returns the context's error instead.
var errStopped = errors.New("stopped")

// stopped reports whether stop is closed; a nil stop never is.
func stopped(stop <-chan struct{}) bool { return cpu.Stopped(stop) }

// forwardUntil runs rec's kernels with ctx's cancellation on its outputs,
// where the long kernels look for it (Tensor.stop). A kernel that gave up
// leaves its outputs half-written, and the error is ctx's.
func forwardUntil(ctx context.Context, dev Device, rec *record) error {
	done := ctx.Done()
	if done == nil {
		return forward(dev, rec)
	}
	for _, o := range rec.outs {
		o.stop = done
	}
	err := forward(dev, rec)
	for _, o := range rec.outs {
		o.stop = nil
	}
	if errors.Is(err, errStopped) {
		return fmt.Errorf("stopped between chunks: %w", context.Cause(ctx))
	}
	return err
}

// gradStop returns the stop channel of the first of a kernel's outputs
// that it writes (the others may be nil: gradients nobody needs).
func gradStop(ts ...*Tensor) <-chan struct{} {
	for _, t := range ts {
		if t != nil {
			return t.stop
		}
	}
	return nil
}

// rowStep is how many elements of one row a reduction or softmax walks
// between looks at its stop channel, so that one enormous row (a softmax
// over 2²⁸ elements) still stops within about a millisecond. Rows that
// fit in one step are never checked: the chunk loop around them is.
const rowStep = 1 << 16
