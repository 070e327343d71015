package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/dht"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/host/tenant"
	"github.com/moehost/moehost/modules"
)

// TestErrorCodes enumerates every sentinel of the server's one table and
// the code it maps to: a sentinel added to the table without a line here,
// or one that changes code, fails. Each keeps its code under wrapping, and
// the message a client sees is the error's own, without its code's name.
func TestErrorCodes(t *testing.T) {
	want := []struct {
		err  error
		code connect.Code
	}{
		{ErrUnknownExpert, connect.CodeNotFound},
		{ErrExpertServed, connect.CodeAlreadyExists},
		{ErrBadTensors, connect.CodeInvalidArgument},
		{ErrBadConfig, connect.CodeInvalidArgument},
		{ErrQuarantined, connect.CodeUnavailable},
		{ErrNotRun, connect.CodeUnavailable},
		{ErrTooManyLimits, connect.CodeResourceExhausted},
		{ErrCheckpointsOff, connect.CodeFailedPrecondition},
		{ErrCheckpointUnreadable, connect.CodeFailedPrecondition},
		{ErrCheckpointMismatch, connect.CodeFailedPrecondition},
		{ErrNoTenants, connect.CodePermissionDenied},
		{ErrNotYours, connect.CodePermissionDenied},
		{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
		{context.Canceled, connect.CodeCanceled},
		{sandbox.ErrBudget, connect.CodeResourceExhausted},
		{gpuhost.ErrOutOfMemory, connect.CodeResourceExhausted},
		{sandbox.ErrConfigRefused, connect.CodeInvalidArgument},
		{sandbox.ErrInvalidModule, connect.CodeInvalidArgument},
		{sandbox.ErrUnknownConfigKey, connect.CodeInvalidArgument},
		{sandbox.ErrInvalidInput, connect.CodeInvalidArgument},
		{sandbox.ErrGuest, connect.CodeInvalidArgument},
		{sandbox.ErrTrap, connect.CodeFailedPrecondition},
		{sandbox.ErrClosed, connect.CodeUnavailable},
		{batch.ErrQueueFull, connect.CodeResourceExhausted},
		{batch.ErrClosed, connect.CodeUnavailable},
		{modules.ErrNotFound, connect.CodeNotFound},
		{modules.ErrTooLarge, connect.CodeResourceExhausted},
		{modules.ErrQuota, connect.CodeResourceExhausted},
		{modules.ErrInUse, connect.CodeFailedPrecondition},
		{tenant.ErrUnknownTenant, connect.CodeUnauthenticated},
		{tenant.ErrNotOwner, connect.CodePermissionDenied},
		{tenant.ErrOperatorOwned, connect.CodePermissionDenied},
		{tenant.ErrInvalidPattern, connect.CodeInvalidArgument},
		{tenant.ErrCapExceeded, connect.CodeResourceExhausted},
		{checkpoint.ErrNotFound, connect.CodeNotFound},
		{checkpoint.ErrCorrupt, connect.CodeFailedPrecondition},
		{dht.ErrBadQuery, connect.CodeInvalidArgument},
		{dht.ErrLookup, connect.CodeUnavailable},
		{syscall.ENOSPC, connect.CodeResourceExhausted},
	}
	if len(want) != len(errorCodes) {
		t.Errorf("the table has %d entries, the test %d", len(errorCodes), len(want))
	}
	for i, w := range want {
		if i < len(errorCodes) && (errorCodes[i].Err != w.err || errorCodes[i].Code != w.code) {
			t.Errorf("entry %d: %v → %v, want %v → %v", i, errorCodes[i].Err, errorCodes[i].Code, w.err, w.code)
		}
		err := fmt.Errorf("deploying %q: %w", "alice.ffn.0", w.err)
		if got := errorCodes.Of(err); got != w.code {
			t.Errorf("%v wrapped: %v, want %v", w.err, got, w.code)
		}
		var ce *connect.Error
		if !errors.As(errorCodes.Coded(err), &ce) || ce.Message() != err.Error() {
			t.Errorf("%v: coded as %v, want its own message %q", w.err, ce, err)
		}
		// Go's own context errors name themselves; ours must not say
		// what the code says already.
		if w.err != context.DeadlineExceeded && w.err != context.Canceled &&
			strings.Contains(strings.ToLower(w.err.Error()), strings.ReplaceAll(w.code.String(), "_", " ")) {
			t.Errorf("%q repeats its code %v", w.err, w.code)
		}
	}
	if got := errorCodes.Of(errors.New("BUG: a host bug")); got != connect.CodeInternal {
		t.Errorf("an unknown error: %v, want Internal", got)
	}
	if errorCodes.Coded(nil) != nil {
		t.Error("Coded(nil) is not nil")
	}
	// Where beats what: a guest killed at its deadline is not its trap,
	// and a request not run because its batch-mates trapped is
	// Unavailable, not the trap's FailedPrecondition.
	for _, c := range []struct {
		err  error
		code connect.Code
	}{
		{fmt.Errorf("%w in moe_forward: %w", sandbox.ErrTrap, context.DeadlineExceeded), connect.CodeDeadlineExceeded},
		{fmt.Errorf("%w: replacing the instance: %w", ErrNotRun, sandbox.ErrTrap), connect.CodeUnavailable},
		{fmt.Errorf("expert %q: %w", "x", fmt.Errorf("%w: undeployed", batch.ErrClosed)), connect.CodeUnavailable},
		{&sandbox.GuestError{Export: "moe_forward", Code: abi.ErrBudgetExceeded}, connect.CodeResourceExhausted},
	} {
		if got := errorCodes.Of(c.err); got != c.code {
			t.Errorf("%v: %v, want %v", c.err, got, c.code)
		}
	}
	// A real full disk: writing to /dev/full fails with ENOSPC.
	if runtime.GOOS == "linux" {
		err := os.WriteFile("/dev/full", []byte("x"), 0)
		if got := errorCodes.Of(fmt.Errorf("storing module: %w", err)); err == nil || got != connect.CodeResourceExhausted {
			t.Errorf("a full disk (%v): %v, want ResourceExhausted", err, got)
		}
	}
}
