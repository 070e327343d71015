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
	"github.com/moehost/moehost/host/internal/experts"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/host/rpc"
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
