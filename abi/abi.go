// Package abi is the contract between an expert module (the guest, a
// WebAssembly module) and moehost (the host). It names the import module, the
// host functions and the guest exports, and fixes the numeric codes (dtypes,
// ops, initialisers, errors) and the guest-memory layouts they use.
//
// The package is the specification; host/internal/sandbox implements it and
// sdk/expert wraps it for Go guests. It imports only the standard library so
// that it builds for GOOS=wasip1 as well as for the host.
//
// # Versions
//
// The host functions live in the import module named [ModuleName]
// ("moehost_v1"). A guest also exports [ExportABIVersion], which returns
// [Version]. A breaking change gets a new module name ("moehost_v2") and a new
// Version; the host keeps serving the old module next to the new one, and
// picks the implementation by the module a guest imports. Additions that break
// nothing (a new op code, a new dtype) keep the name: a guest that uses an op
// an older host lacks gets [ErrUnknownOp] at run time.
//
// # Calling convention
//
// Every host function returns an i32. A value >= 0 is success (a handle, an
// index, a count, or zero). A negative value is an [Errno]; the host keeps a
// message for the most recent error, which the guest copies out with
// [FuncLastError]. No host function traps on bad input: a guest that lies gets
// an error code, never a crash of the host.
//
// # Handles
//
// Tensors live on the host (on the GPU when there is one); the guest holds
// positive i32 handles. Zero is never a valid handle. A handle is valid only
// in the instance that received it. Handles from [FuncInput], [FuncTensorNew],
// [FuncOp] and [FuncOpMulti] live for one call of [ExportForward]; parameter
// handles from
// [FuncParamNew] live as long as the instance. Using a handle outside its
// lifetime returns [ErrInvalidHandle]. README.md in this directory is the
// full, language-neutral specification.
//
// # Memory layouts
//
// Pointers and lengths are i32 byte offsets into the guest's exported memory
// "memory". All multi-byte values are little-endian.
//
//	string:  ptr ─▶ [len bytes of UTF-8]
//	shape:   ptr ─▶ [i64 dim0][i64 dim1]…[i64 dim(rank-1)]   (rank*8 bytes)
//	args:    ptr ─▶ [i32 handle0][i32 handle1]…               (n*4 bytes)
//	attrs:   ptr ─▶ [f64 attr0][f64 attr1]…                   (n*8 bytes)
//	data:    ptr ─▶ [elements, row-major, dtype-sized]        (len bytes)
//
// In schema shapes (inputs and outputs) the first dimension is the batch
// dimension and is written as [BatchDim] (-1).
package abi

// Version is the ABI version that [ModuleName] implements and that a guest's
// [ExportABIVersion] must return.
const Version = 1

// IsVersion1 lets a guest SDK fail at compile time against an abi package of
// another major version: `const _ = abi.IsVersion1`.
const IsVersion1 = true

// ModuleName is the Wasm import module that holds the host functions of
// version 1.
const ModuleName = "moehost_v1"

// BatchDim marks the batch dimension in a declared schema shape.
const BatchDim = -1

// MaxRank is the largest tensor rank the host accepts.
const MaxRank = 8

// Guest exports. Each takes no parameters and returns an i32: a
// non-negative value is success, a negative one an Errno (usually the code
// the guest got from the host).
const (
	// ExportABIVersion returns the ABI version the guest was built
	// against. The host refuses a module whose version it does not serve.
	ExportABIVersion = "moe_abi_version"

	// ExportInit declares the expert: its inputs and outputs
	// ([FuncDeclareInput], [FuncDeclareOutput]) and parameters
	// ([FuncParamNew]), reading its config with [FuncConfigI64]. The
	// host calls it once per instance, after [ExportInitialize] and
	// [ExportABIVersion] and before any [ExportForward]. It must declare
	// at least one input and one output. The keys it asks
	// [FuncConfigI64] for, found or not, are the module's config keys:
	// the host refuses an expert whose config holds any other key (a
	// misspelt key would otherwise leave the module on its default).
	ExportInit = "moe_init"

	// ExportForward computes the outputs of one batch: it reads input
	// handles with [FuncInput], calls ops, and sets every declared
	// output with [FuncOutput]. For a backward request the host runs
	// the same export with its autograd tape on.
	ExportForward = "moe_forward"

	// ExportBackward, when a module exports it, replaces the host's
	// autograd tape for backward requests. The host calls it with the
	// inputs ([FuncInput]) and the gradients of the outputs
	// ([FuncGradOutput]); it sets the gradient of every float32 input
	// with [FuncGradInput] and may give parameter gradients with
	// [FuncParamGrad] (a parameter without one gets zero). Its ops are not
	// recorded. A module without it is differentiated by the tape.
	ExportBackward = "moe_backward"

	// ExportMemory is the guest memory the host reads and writes.
	ExportMemory = "memory"

	// ExportInitialize is the WASI reactor initialiser, of type () -> ().
	// When present the host calls it first, before ExportABIVersion and
	// ExportInit, so that language runtimes (Go's c-shared mode,
	// wasi-libc) set themselves up.
	ExportInitialize = "_initialize"
)
