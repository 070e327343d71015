package abi

import "strconv"

// Errno is a negative result of a host function. Zero and positive values
// are never Errnos.
type Errno int32

// Error codes. The host's message from FuncLastError gives the details.
const (
	// ErrInvalidHandle: the handle is zero, forged, from another
	// instance, or from an earlier call.
	ErrInvalidHandle Errno = -1
	// ErrOutOfBounds: a pointer and length reach outside guest memory,
	// or a length is negative.
	ErrOutOfBounds Errno = -2
	// ErrInvalidArgument: a value is not allowed (dtype, rank, name,
	// index, attribute, number of args).
	ErrInvalidArgument Errno = -3
	// ErrShapeMismatch: tensor shapes or sizes do not fit the operation.
	ErrShapeMismatch Errno = -4
	// ErrUnknownOp: the op code is not served by this host.
	ErrUnknownOp Errno = -5
	// ErrBudgetExceeded: a per-call or per-expert limit (ops, bytes) is
	// spent.
	ErrBudgetExceeded Errno = -6
	// ErrWrongPhase: the function is not allowed in the current export
	// (for example FuncInput during ExportInit).
	ErrWrongPhase Errno = -7
	// ErrNotFound: a config key does not exist.
	ErrNotFound Errno = -8
	// ErrAlreadyExists: a name was declared twice.
	ErrAlreadyExists Errno = -9
	// ErrInternal: the host failed for a reason that is not the guest's
	// fault.
	ErrInternal Errno = -10
)

var errnoNames = map[Errno]string{
	ErrInvalidHandle:   "invalid handle",
	ErrOutOfBounds:     "out of bounds",
	ErrInvalidArgument: "invalid argument",
	ErrShapeMismatch:   "shape mismatch",
	ErrUnknownOp:       "unknown op",
	ErrBudgetExceeded:  "budget exceeded",
	ErrWrongPhase:      "wrong phase",
	ErrNotFound:        "not found",
	ErrAlreadyExists:   "already exists",
	ErrInternal:        "internal error",
}

// String returns the code's short name.
func (e Errno) String() string {
	if s, ok := errnoNames[e]; ok {
		return s
	}
	return "errno " + strconv.Itoa(int(e))
}

// Error makes an Errno usable as an error.
func (e Errno) Error() string { return e.String() }
