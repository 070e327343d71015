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
	"github.com/moehost/moehost/host/internal/hivemind"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/host/tenant"
	"github.com/moehost/moehost/modules"
)

// The server's own errors, which say where a call failed; the rooms'
// sentinels (sandbox, batch, tenant, checkpoint, modules, gpuhost, dht)
// say what failed. Callers of Server's methods branch on either with
// errors.Is; the RPC layer codes both through errorCodes.
var (
	// ErrUnknownExpert: no expert of that uid is served here.
	ErrUnknownExpert = errors.New("no such expert")
	// ErrExpertServed: Deploy of a uid that is served already.
	ErrExpertServed = errors.New("expert already served")
	// ErrBadTensors: a call's tensors do not fit the expert's schema, or
	// are not on its device.
	ErrBadTensors = errors.New("tensors do not fit the expert")
	// ErrBadConfig: an ExpertConfig, deployment or uid pattern that
	// cannot be served as given.
	ErrBadConfig = errors.New("bad expert config")
	// ErrQuarantined: the expert ran past its call timeout and runs
	// nothing for a while.
	ErrQuarantined = errors.New("expert quarantined")
	// ErrNotRun: a request that was not run, and may be retried: the
	// server is not serving, an instance could not be replaced, or its
	// batch-mates trapped too often.
	ErrNotRun = errors.New("request not run")
	// ErrTooManyLimits: an owner asked for more distinct sets of guest
	// limits than maxRuntimesPerOwner.
	ErrTooManyLimits = errors.New("too many sets of guest limits")
	// ErrCheckpointsOff: a checkpoint call on a server without
	// checkpoints.
	ErrCheckpointsOff = errors.New("checkpoints are off on this server")
	// ErrCheckpointUnreadable: a stored checkpoint that cannot be loaded.
	ErrCheckpointUnreadable = errors.New("checkpoint unreadable")
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
