package host

import (
	"context"
	"errors"
	"syscall"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/dht"
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

// errorCodes is the one table from sentinels to Connect codes, handed to
// every service the server serves (rpc.Options.Codes, ModuleService,
// CheckpointService, DiscoveryService). The server's own come first: they
// say where an error happened, which decides over what it was (a trap
// that replaces an instance is ErrNotRun). Context errors come next, so
// that a guest killed at its deadline is DeadlineExceeded, not a trap. A
// guest's fault (a trap, an error code, a module that breaks the ABI) is
// the caller's or the module's, never Internal: Internal is left for
// errors no entry matches, which are host bugs.
var errorCodes = rpc.Codes{
	{Err: ErrUnknownExpert, Code: connect.CodeNotFound},
	{Err: ErrExpertServed, Code: connect.CodeAlreadyExists},
	{Err: ErrBadTensors, Code: connect.CodeInvalidArgument},
	{Err: ErrBadConfig, Code: connect.CodeInvalidArgument},
	{Err: ErrQuarantined, Code: connect.CodeUnavailable},
	{Err: ErrNotRun, Code: connect.CodeUnavailable},
	{Err: ErrTooManyLimits, Code: connect.CodeResourceExhausted},
	{Err: ErrCheckpointsOff, Code: connect.CodeFailedPrecondition},
	{Err: ErrCheckpointUnreadable, Code: connect.CodeFailedPrecondition},
	{Err: ErrCheckpointMismatch, Code: connect.CodeFailedPrecondition},
	{Err: ErrNoTenants, Code: connect.CodePermissionDenied},
	{Err: ErrNotYours, Code: connect.CodePermissionDenied},

	{Err: context.DeadlineExceeded, Code: connect.CodeDeadlineExceeded},
	{Err: context.Canceled, Code: connect.CodeCanceled},
	// A guest's error code that is a budget refusal (ErrBudget and
	// ErrGuest both) is the resource, not the guest's fault.
	{Err: sandbox.ErrBudget, Code: connect.CodeResourceExhausted},
	{Err: gpuhost.ErrOutOfMemory, Code: connect.CodeResourceExhausted},

	{Err: sandbox.ErrInvalidModule, Code: connect.CodeInvalidArgument},
	{Err: sandbox.ErrUnknownConfigKey, Code: connect.CodeInvalidArgument},
	{Err: sandbox.ErrInvalidInput, Code: connect.CodeInvalidArgument},
	{Err: sandbox.ErrGuest, Code: connect.CodeInvalidArgument},
	{Err: sandbox.ErrTrap, Code: connect.CodeFailedPrecondition},
	{Err: sandbox.ErrClosed, Code: connect.CodeUnavailable},
	{Err: batch.ErrQueueFull, Code: connect.CodeResourceExhausted},
	{Err: batch.ErrClosed, Code: connect.CodeUnavailable},
	{Err: modules.ErrNotFound, Code: connect.CodeNotFound},
	{Err: modules.ErrTooLarge, Code: connect.CodeResourceExhausted},
	{Err: modules.ErrQuota, Code: connect.CodeResourceExhausted},
	{Err: modules.ErrInUse, Code: connect.CodeFailedPrecondition},
	{Err: tenant.ErrUnknownTenant, Code: connect.CodeUnauthenticated},
	{Err: tenant.ErrNotOwner, Code: connect.CodePermissionDenied},
	{Err: tenant.ErrOperatorOwned, Code: connect.CodePermissionDenied},
	{Err: tenant.ErrInvalidPattern, Code: connect.CodeInvalidArgument},
	{Err: tenant.ErrCapExceeded, Code: connect.CodeResourceExhausted},
	{Err: checkpoint.ErrNotFound, Code: connect.CodeNotFound},
	{Err: checkpoint.ErrCorrupt, Code: connect.CodeFailedPrecondition},
	{Err: dht.ErrBadQuery, Code: connect.CodeInvalidArgument},
	{Err: dht.ErrLookup, Code: connect.CodeUnavailable},
	// A full disk: the server is out of a resource, not the caller wrong.
	{Err: syscall.ENOSPC, Code: connect.CodeResourceExhausted},
}
