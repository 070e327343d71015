package gpuhost

import (
	"context"
	"errors"
	"fmt"
)

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
