package abi

// Host functions of [ModuleName]. Every one returns an i32 as described in
// the package comment; the parameter lists below are the Wasm signatures.
const (
	// FuncLastError copies the message of the most recent error into
	// guest memory and returns the message's full length in bytes. When
	// buf_cap is smaller than that, the message is truncated to buf_cap
	// bytes; calling with buf_cap 0 asks for the length alone. The
	// message is that of the most recent failing host call in the
	// current export; when none has failed, it is the message given to
	// FuncFail, and otherwise empty (length 0). Messages are cleared when
	// each ExportForward call begins, not by successful calls.
	//
	//	(buf_ptr i32, buf_cap i32) -> i32
	//
	//	buf_ptr ─▶ [min(len, buf_cap) bytes of UTF-8]
	//
	// Errors: ErrOutOfBounds (buf_cap negative, or the buffer outside
	// memory). A failing last_error keeps the previous message.
	FuncLastError = "last_error"

	// FuncConfigI64 reads the integer config value named by key (for
	// example "hidden_dim") and writes it as an i64 at out_ptr. It is
	// allowed in every phase; the keys read during [ExportInit] declare
	// the module's config keys, so a key read later must be read there
	// too.
	//
	//	(key_ptr i32, key_len i32, out_ptr i32) -> i32
	//
	//	key_ptr ─▶ [key_len bytes of UTF-8]
	//	out_ptr ─▶ [i64 value]          (written)
	//
	// Errors: ErrOutOfBounds, ErrInvalidArgument (key longer than 256
	// bytes or not UTF-8), ErrNotFound (no such key).
	FuncConfigI64 = "config_i64"

	// FuncDeclareInput declares the next input of the expert and returns
	// its index (0, 1, …). Only during ExportInit. The first dimension
	// of the shape must be BatchDim; the others must be positive.
	//
	//	(name_ptr i32, name_len i32, dtype i32, shape_ptr i32, rank i32) -> i32
	//
	//	name_ptr  ─▶ [name_len bytes of UTF-8]
	//	shape_ptr ─▶ [i64 × rank]
	//
	// Errors: ErrOutOfBounds, ErrInvalidArgument (name empty, longer
	// than 256 bytes or not UTF-8; unknown dtype; rank outside 1..MaxRank;
	// dims), ErrAlreadyExists (name taken), ErrWrongPhase.
	FuncDeclareInput = "declare_input"

	// FuncDeclareOutput declares the next output, with the same
	// parameters, layout and errors as FuncDeclareInput.
	FuncDeclareOutput = "declare_output"

	// FuncParamNew declares a trainable parameter and returns a handle
	// that lives as long as the instance. Only during ExportInit. The
	// dtype must be DTypeFloat32, and a and b must be finite. The host
	// owns the values: the first instance to declare the name makes the
	// parameter and initialises it with init (an [Init], whose arguments
	// are a and b) from a seed derived from the expert's uid and the
	// parameter's name; later instances get the same tensor. A host that
	// keeps checkpoints and holds one for the expert fills the parameter
	// from its newest checkpoint instead, and init is never drawn. All
	// instances of one expert share the same parameters.
	//
	//	(name_ptr i32, name_len i32, dtype i32, shape_ptr i32, rank i32,
	//	 init i32, a f64, b f64) -> i32
	//
	//	name_ptr  ─▶ [name_len bytes of UTF-8]
	//	shape_ptr ─▶ [i64 × rank]   (all dims positive)
	//
	// Errors: ErrOutOfBounds, ErrInvalidArgument (bad name, dtype, shape,
	// init, or a or b), ErrAlreadyExists (name declared twice),
	// ErrShapeMismatch (another instance of the expert declared the name
	// with another dtype or shape), ErrBudgetExceeded (parameter bytes,
	// or more than 2⁴⁰ elements), ErrWrongPhase, ErrInternal.
	FuncParamNew = "param_new"

	// FuncInput returns a handle to the batched input with the given
	// index, shaped as declared with the batch dimension filled in.
	// Only during ExportForward.
	//
	//	(index i32) -> i32
	//
	// Errors: ErrInvalidArgument (no such input), ErrWrongPhase.
	FuncInput = "input"

	// FuncOutput sets the output with the given index to the tensor
	// behind handle. The tensor must match the declared dtype and shape
	// (with the batch dimension equal to the inputs'). Only during
	// ExportForward; every declared output must be set before it
	// returns.
	//
	//	(index i32, handle i32) -> i32
	//
	// Errors: ErrInvalidArgument (no such output), ErrInvalidHandle,
	// ErrShapeMismatch, ErrWrongPhase.
	FuncOutput = "output"

	// FuncTensorNew creates a zero-filled tensor for this call and
	// returns its handle.
	//
	//	(dtype i32, shape_ptr i32, rank i32) -> i32
	//
	//	shape_ptr ─▶ [i64 × rank]   (all dims positive)
	//
	// Errors: ErrOutOfBounds, ErrInvalidArgument, ErrBudgetExceeded,
	// ErrWrongPhase.
	FuncTensorNew = "tensor_new"

	// FuncTensorWrite copies len bytes from guest memory into the tensor.
	// len must equal the tensor's size in bytes. Only a tensor from
	// FuncTensorNew may be written, and only until it is used (read by an
	// op or set as an output). Parameters, inputs and op results may not
	// be written; the host owns parameters.
	//
	//	(handle i32, ptr i32, len i32) -> i32
	//
	//	ptr ─▶ [len bytes: elements, row-major, little-endian]
	//
	// Errors: ErrInvalidHandle, ErrOutOfBounds, ErrShapeMismatch,
	// ErrInvalidArgument (not a fresh FuncTensorNew tensor), ErrInternal.
	FuncTensorWrite = "tensor_write"

	// FuncTensorRead copies the tensor into guest memory and returns the
	// number of bytes written, which is the tensor's size in bytes. len
	// must be at least that.
	//
	//	(handle i32, ptr i32, len i32) -> i32
	//
	//	ptr ─▶ [size bytes: elements, row-major, little-endian]  (written)
	//
	// Errors: ErrInvalidHandle, ErrOutOfBounds, ErrShapeMismatch (len
	// too small).
	FuncTensorRead = "tensor_read"

	// FuncTensorShape writes the tensor's dims as i64s at shape_ptr and
	// returns its rank. cap is the room at shape_ptr in dims; when it is
	// smaller than the rank, nothing is written.
	//
	//	(handle i32, shape_ptr i32, cap i32) -> i32
	//
	//	shape_ptr ─▶ [i64 × rank]   (written)
	//
	// Errors: ErrInvalidHandle, ErrOutOfBounds.
	FuncTensorShape = "tensor_shape"

	// FuncTensorDType returns the tensor's [DType].
	//
	//	(handle i32) -> i32
	//
	// Errors: ErrInvalidHandle.
	FuncTensorDType = "tensor_dtype"

	// FuncOp runs the op with the given code on the tensors in args, with
	// the numeric attributes in attrs, and returns the handle of the
	// result, which lives for the current call. Each [Op] documents its
	// args and attrs. When the host's tape is on (a backward request),
	// the op is recorded so that gradients flow through it.
	//
	//	(code i32, args_ptr i32, nargs i32, attrs_ptr i32, nattrs i32) -> i32
	//
	//	args_ptr  ─▶ [i32 handle × nargs]
	//	attrs_ptr ─▶ [f64 × nattrs]
	//
	// Errors: ErrUnknownOp, ErrOutOfBounds, ErrInvalidHandle,
	// ErrInvalidArgument (more than 64 args or attrs, wrong number of
	// args or attrs for the op, bad dtype or attr, an op with several
	// results), ErrShapeMismatch, ErrBudgetExceeded (ops or bytes per
	// call; every call counts against the op budget, failed ones too),
	// ErrWrongPhase, ErrInternal.
	FuncOp = "op"

	// FuncOpMulti runs an op like FuncOp but for ops with several results
	// (OpSplit): it writes the result handles at out_ptr and returns
	// their number. out_cap is the room at out_ptr in handles; when it is
	// smaller than the number of results, the call fails and no handle is
	// made. A single-result op gives one handle.
	//
	//	(code i32, args_ptr i32, nargs i32, attrs_ptr i32, nattrs i32,
	//	 out_ptr i32, out_cap i32) -> i32
	//
	//	args_ptr  ─▶ [i32 handle × nargs]
	//	attrs_ptr ─▶ [f64 × nattrs]
	//	out_ptr   ─▶ [i32 handle × count]   (written)
	//
	// Errors: those of FuncOp, ErrOutOfBounds (out_cap outside
	// [0, 65536], or the result array outside memory) and
	// ErrInvalidArgument (out_cap too small).
	FuncOpMulti = "op_multi"

	// FuncGradOutput returns a handle to the gradient of the output with
	// the given index, shaped like that output. Only during
	// ExportBackward.
	//
	//	(index i32) -> i32
	//
	// Errors: ErrInvalidArgument (no such output), ErrWrongPhase.
	FuncGradOutput = "grad_output"

	// FuncGradInput sets the gradient of the input with the given index
	// to the tensor behind handle, which must be shaped like that input.
	// Only during ExportBackward; every float32 input needs one.
	//
	//	(index i32, handle i32) -> i32
	//
	// Errors: ErrInvalidArgument (no such input, or not float32),
	// ErrInvalidHandle, ErrShapeMismatch, ErrWrongPhase.
	FuncGradInput = "grad_input"

	// FuncParamGrad gives the gradient of the parameter behind param
	// (a FuncParamNew handle) as the tensor behind grad, shaped like the
	// parameter. Only during ExportBackward; the host's optimizer applies
	// it after the call.
	//
	//	(param i32, grad i32) -> i32
	//
	// Errors: ErrInvalidHandle, ErrInvalidArgument (param is not a
	// parameter), ErrShapeMismatch, ErrWrongPhase.
	FuncParamGrad = "param_grad"

	// FuncFail records the guest's own error message for the current
	// export, so that the caller sees why the expert refused a batch. The
	// guest then returns a negative value from the export.
	//
	//	(msg_ptr i32, msg_len i32) -> i32
	//
	//	msg_ptr ─▶ [msg_len bytes of UTF-8]   (at most 1 KiB is kept)
	//
	// Errors: ErrOutOfBounds.
	FuncFail = "fail"
)
