package host

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/dht"
	"github.com/moehost/moehost/host/internal/experts"
	"github.com/moehost/moehost/host/internal/hivemind"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/host/tenant"
	"github.com/moehost/moehost/modules"
)

// The server's own errors (the experts room's, re-exported, and its
// own), which say where a call failed; the rooms'
// sentinels (sandbox, batch, tenant, checkpoint, modules, gpuhost, dht)
// say what failed. Callers of Server's methods branch on either with
// errors.Is; the RPC layer codes both through errorCodes.
var (
	ErrUnknownExpert        = experts.ErrUnknownExpert
	ErrExpertServed         = experts.ErrExpertServed
	ErrBadTensors           = experts.ErrBadTensors
	ErrBadConfig            = experts.ErrBadConfig
	ErrQuarantined          = experts.ErrQuarantined
	ErrNotRun               = experts.ErrNotRun
	ErrTooManyLimits        = experts.ErrTooManyLimits
	ErrCheckpointsOff       = experts.ErrCheckpointsOff
	ErrCheckpointUnreadable = experts.ErrCheckpointUnreadable
	// ErrCheckpointMismatch is returned by Start (and Restore) for a
	// checkpoint that belongs to another module or other parameter shapes.
	ErrCheckpointMismatch = experts.ErrCheckpointMismatch
	// ErrNoTenants: a tenant's call on a server without tenants.
	ErrNoTenants = errors.New("the server has no tenants")
	// ErrNotYours: another owner's expert, or an expert's uid another
	// owner serves.
	ErrNotYours = errors.New("belongs to another owner")
)

// wireError is one row of the server's error table: a sentinel, the
// Connect code of every error that wraps it, and the exception hivemind's
// server would raise for it (nil: none, the error goes to hivemind's
// client as it is).
type wireError struct {
	err      error
	code     connect.Code
	hivemind error
}

// wireErrors is the one table from the sentinels of the server and its
// rooms to both wires: Connect codes (errorCodes, handed to every service
// the server serves: rpc.Options.Codes, ModuleService, CheckpointService,
// DiscoveryService) and hivemind's exceptions (hivemindError). The first
// row whose sentinel an error wraps decides. The server's own come first:
// they say where an error happened, which decides over what it was (a
// trap that replaces an instance is ErrNotRun). Context errors come next, so
// that a guest killed at its deadline is DeadlineExceeded, not a trap. A
// guest's fault (a trap, an error code, a module that breaks the ABI) is
// the caller's or the module's, never Internal: Internal is left for
// errors no entry matches, which are host bugs.
var wireErrors = []wireError{
	{ErrUnknownExpert, connect.CodeNotFound, hivemind.ErrNotFound},
	{ErrExpertServed, connect.CodeAlreadyExists, nil},
	{ErrBadTensors, connect.CodeInvalidArgument, hivemind.ErrInvalid},
	{ErrBadConfig, connect.CodeInvalidArgument, hivemind.ErrInvalid},
	{ErrQuarantined, connect.CodeUnavailable, hivemind.ErrBusy},
	{ErrNotRun, connect.CodeUnavailable, hivemind.ErrBusy},
	{ErrTooManyLimits, connect.CodeResourceExhausted, hivemind.ErrBusy},
	{ErrCheckpointsOff, connect.CodeFailedPrecondition, nil},
	{ErrCheckpointUnreadable, connect.CodeFailedPrecondition, nil},
	{ErrCheckpointMismatch, connect.CodeFailedPrecondition, nil},
	{ErrNoTenants, connect.CodePermissionDenied, nil},
	{ErrNotYours, connect.CodePermissionDenied, nil},

	{context.DeadlineExceeded, connect.CodeDeadlineExceeded, nil},
	{context.Canceled, connect.CodeCanceled, nil},
	// A guest's error code that is a budget refusal (ErrBudget and
	// ErrGuest both) is the resource, not the guest's fault.
	{sandbox.ErrBudget, connect.CodeResourceExhausted, hivemind.ErrBusy},
	{gpuhost.ErrOutOfMemory, connect.CodeResourceExhausted, hivemind.ErrBusy},

	{sandbox.ErrConfigRefused, connect.CodeInvalidArgument, hivemind.ErrInvalid},
	{sandbox.ErrInvalidModule, connect.CodeInvalidArgument, hivemind.ErrInvalid},
	{sandbox.ErrUnknownConfigKey, connect.CodeInvalidArgument, hivemind.ErrInvalid},
	{sandbox.ErrInvalidInput, connect.CodeInvalidArgument, hivemind.ErrInvalid},
	{sandbox.ErrGuest, connect.CodeInvalidArgument, hivemind.ErrInvalid},
	{sandbox.ErrTrap, connect.CodeFailedPrecondition, nil},
	{sandbox.ErrClosed, connect.CodeUnavailable, hivemind.ErrBusy},
	{batch.ErrQueueFull, connect.CodeResourceExhausted, hivemind.ErrBusy},
	{batch.ErrClosed, connect.CodeUnavailable, hivemind.ErrBusy},
	{modules.ErrNotFound, connect.CodeNotFound, hivemind.ErrNotFound},
	{modules.ErrTooLarge, connect.CodeResourceExhausted, hivemind.ErrBusy},
	{modules.ErrQuota, connect.CodeResourceExhausted, hivemind.ErrBusy},
	{modules.ErrInUse, connect.CodeFailedPrecondition, nil},
	{tenant.ErrUnknownTenant, connect.CodeUnauthenticated, nil},
	{tenant.ErrNotOwner, connect.CodePermissionDenied, nil},
	{tenant.ErrOperatorOwned, connect.CodePermissionDenied, nil},
	{tenant.ErrInvalidPattern, connect.CodeInvalidArgument, hivemind.ErrInvalid},
	{tenant.ErrCapExceeded, connect.CodeResourceExhausted, hivemind.ErrBusy},
	{checkpoint.ErrNotFound, connect.CodeNotFound, hivemind.ErrNotFound},
	{checkpoint.ErrCorrupt, connect.CodeFailedPrecondition, nil},
	{dht.ErrBadQuery, connect.CodeInvalidArgument, hivemind.ErrInvalid},
	{dht.ErrLookup, connect.CodeUnavailable, hivemind.ErrBusy},
	// A full disk: the server is out of a resource, not the caller wrong.
	{syscall.ENOSPC, connect.CodeResourceExhausted, hivemind.ErrBusy},
}

// errorCodes is wireErrors' Connect column, as rpc codes errors.
var errorCodes = func() rpc.Codes {
	cs := make(rpc.Codes, len(wireErrors))
	for i, w := range wireErrors {
		cs[i] = rpc.Code{Err: w.err, Code: w.code}
	}
	return cs
}()

// hivemindError maps the server's errors to the exceptions hivemind's
// server would raise, from the rooms' sentinels (wireErrors' hivemind
// column), without going through a Connect code: the first row whose
// sentinel err wraps decides, as for errorCodes. An error that no row
// matches, or whose row names no exception, is returned as it is.
func hivemindError(err error) error {
	for _, w := range wireErrors {
		if errors.Is(err, w.err) {
			if w.hivemind == nil {
				return err
			}
			return fmt.Errorf("%w: %w", w.hivemind, err)
		}
	}
	return err
}
