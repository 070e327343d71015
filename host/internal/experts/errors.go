package experts

import "errors"

// The room's errors, which say where a call failed; the lower rooms'
// sentinels (sandbox, batch, checkpoint, modules, gpuhost) say what
// failed. host re-exports them and maps them to wire codes in its one
// table.
var (
	// ErrUnknownExpert: no expert of that uid is served here.
	ErrUnknownExpert = errors.New("no such expert")
	// ErrExpertServed: Deploy of a uid that is served already.
	ErrExpertServed = errors.New("expert already served")
	// ErrBadTensors: a call's tensors do not fit the expert's schema, or
	// are not on its device.
	ErrBadTensors = errors.New("tensors do not fit the expert")
	// ErrBadConfig: a spec, deployment or uid pattern that cannot be
	// served as given.
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
	// ErrCheckpointMismatch: a checkpoint that belongs to another module
	// or other parameter shapes.
	ErrCheckpointMismatch = errors.New("checkpoint does not match the expert")
)
