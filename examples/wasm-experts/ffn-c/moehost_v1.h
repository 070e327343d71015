/*
 * moehost_v1.h: ABI v1 of moehost for guests written in C.
 *
 * This header restates, for C authors, the contract that the Go package abi
 * (github.com/moehost/moehost/abi) specifies; abi/ is the authority, and the
 * codes here must match it (host/cguest_test.go checks that they do).
 *
 * A guest is a wasm32 reactor module. It imports the host functions below
 * from the module "moehost_v1", exports its linear memory as "memory", and
 * exports three functions of type () -> i32:
 *
 *   moe_abi_version  returns MOE_ABI_VERSION;
 *   moe_init         declares inputs, outputs and parameters (once per
 *                    instance, after _initialize when the module has one);
 *   moe_forward      computes one batch and sets every declared output.
 *
 * Calling convention: every host function returns an int32_t. A value >= 0
 * is success (a handle, an index, a count, or zero); a negative value is a
 * MOE_ERR_* code, and moe_last_error copies out the host's message. An
 * export returns a negative code to fail, after calling moe_fail with a
 * message for the caller.
 *
 * Tensors live on the host; the guest holds positive int32_t handles. Handles
 * from moe_input, moe_tensor_new and moe_op live for one call of
 * moe_forward; those from moe_param_new live as long as the instance.
 *
 * Memory layouts (pointers are byte offsets into "memory", little-endian):
 *
 *   string:  ptr -> [len bytes of UTF-8]
 *   shape:   ptr -> [int64_t dim0][int64_t dim1]...      (rank*8 bytes)
 *   args:    ptr -> [int32_t handle0][int32_t handle1]... (n*4 bytes)
 *   attrs:   ptr -> [double attr0][double attr1]...      (n*8 bytes)
 *   data:    ptr -> [elements, row-major, dtype-sized]   (len bytes)
 *
 * In input and output shapes the first dim is the batch dim, MOE_BATCH_DIM.
 *
 * Build a guest with Debian's clang, lld, wasi-libc and
 * libclang-rt-dev-wasm32 (scripts/install-c-wasm-toolchain.sh installs
 * them), for example:
 *
 *   clang --target=wasm32-wasi -mexec-model=reactor -O2 -o expert.wasm expert.c
 */
#ifndef MOEHOST_V1_H
#define MOEHOST_V1_H

#include <stdint.h>

/* The ABI version that moe_abi_version must return. */
#define MOE_ABI_VERSION 1
/* The batch dim in a declared input or output shape. */
#define MOE_BATCH_DIM (-1)
/* The largest tensor rank the host accepts. */
#define MOE_MAX_RANK 8

/* Element types (abi.DType). Float32 is the compute type. */
enum {
	MOE_DTYPE_FLOAT32 = 1,
	MOE_DTYPE_FLOAT16 = 2,  /* reserved */
	MOE_DTYPE_BFLOAT16 = 3, /* reserved */
	MOE_DTYPE_INT32 = 4,
	MOE_DTYPE_INT64 = 5,
	MOE_DTYPE_BOOL = 6,
};

/* Parameter initialisers (abi.Init); a and b are moe_param_new's doubles. */
enum {
	MOE_INIT_ZEROS = 1,   /* a and b unused */
	MOE_INIT_ONES = 2,    /* a and b unused */
	MOE_INIT_UNIFORM = 3, /* uniform on [a, b) */
	MOE_INIT_NORMAL = 4,  /* mean a, standard deviation b */
};

/* Error codes (abi.Errno). */
enum {
	MOE_ERR_INVALID_HANDLE = -1,   /* zero, forged, other-instance or stale handle */
	MOE_ERR_OUT_OF_BOUNDS = -2,    /* pointer/length outside memory, or negative */
	MOE_ERR_INVALID_ARGUMENT = -3, /* dtype, rank, name, index, attr, arg count */
	MOE_ERR_SHAPE_MISMATCH = -4,   /* shapes do not fit the operation */
	MOE_ERR_UNKNOWN_OP = -5,       /* op code not served by this host */
	MOE_ERR_BUDGET_EXCEEDED = -6,  /* a per-call or per-expert limit is spent */
	MOE_ERR_WRONG_PHASE = -7,      /* not allowed in the current export */
	MOE_ERR_NOT_FOUND = -8,        /* no such config key */
	MOE_ERR_ALREADY_EXISTS = -9,   /* a name declared twice */
	MOE_ERR_INTERNAL = -10,        /* the host failed, not the guest */
};

/*
 * Op codes (abi.Op) for moe_op. abi/op.go documents each op's args and
 * attrs; the short form is given here. Attrs are doubles; trailing attrs
 * with a default may be left out.
 */
enum {
	MOE_OP_MATMUL = 1,         /* A, B; attrs transpose_a, transpose_b */
	MOE_OP_LINEAR = 2,         /* x [...,in], W [out,in], b [out] (optional) */
	MOE_OP_ADD = 3,            /* a, b (leading-dim broadcasting) */
	MOE_OP_GELU_TANH = 4,      /* x */
	MOE_OP_LAYER_NORM = 5,     /* x [...,H], w [H], b [H]; attrs eps (1e-5) */
	MOE_OP_SUB = 6,            /* a, b */
	MOE_OP_MUL = 7,            /* a, b */
	MOE_OP_DIV = 8,            /* a, b */
	MOE_OP_SCALE = 9,          /* x; attrs s (1) */
	MOE_OP_ADD_SCALAR = 10,    /* x; attrs c (0) */
	MOE_OP_RELU = 11,          /* x */
	MOE_OP_GELU = 12,          /* x (exact, erf) */
	MOE_OP_TANH = 13,          /* x */
	MOE_OP_SIGMOID = 14,       /* x */
	MOE_OP_SILU = 15,          /* x */
	MOE_OP_EXP = 16,           /* x */
	MOE_OP_LOG = 17,           /* x */
	MOE_OP_SQRT = 18,          /* x */
	MOE_OP_NEG = 19,           /* x */
	MOE_OP_SOFTMAX = 20,       /* x; attrs axis (-1) */
	MOE_OP_LOG_SOFTMAX = 21,   /* x; attrs axis (-1) */
	MOE_OP_RMS_NORM = 22,      /* x [...,H], w [H]; attrs eps (1e-6) */
	MOE_OP_RESHAPE = 23,       /* x; attrs the new dims (one may be -1) */
	MOE_OP_PERMUTE = 24,       /* x; attrs perm (rank attrs) */
	MOE_OP_TRANSPOSE = 25,     /* x; attrs dim0, dim1 */
	MOE_OP_CONCAT = 26,        /* x0, x1, ...; attrs axis (0) */
	MOE_OP_SLICE = 27,         /* x; attrs axis, start, end */
	MOE_OP_SPLIT = 28,         /* x; attrs axis, size0, size1, ... (moe_op_multi) */
	MOE_OP_SUM = 29,           /* x; attrs axis (-1), keepdim (0) */
	MOE_OP_MEAN = 30,          /* x; attrs axis (-1), keepdim (0) */
	MOE_OP_MAX = 31,           /* x; attrs axis (-1), keepdim (0) */
	MOE_OP_DROPOUT = 32,       /* x, mask; attrs keep_prob (1) */
	MOE_OP_EMBEDDING = 33,     /* ids (int32|int64), table [V,D] */
	MOE_OP_CROSS_ENTROPY = 34, /* logits [N,C], targets [N]; attrs reduction, ignore_index */
	MOE_OP_BATCH_MATMUL = 35,  /* a [...,M,K], b [...,K,N]; attrs transpose_a, transpose_b */
	MOE_OP_ATTENTION = 36,     /* q, k, v, key_padding_mask (optional); attrs causal, scale */
	/* Fused pairs: the result and gradients of the two ops; a host older
	   than them returns MOE_ERR_UNKNOWN_OP, and the guest runs the pair. */
	MOE_OP_LINEAR_GELU_TANH = 37, /* x, W, b (optional): gelu_tanh(linear) */
	MOE_OP_ADD_LAYER_NORM = 38,   /* x, r, w, b; attrs eps (1e-5): layer_norm(x + r) */
	MOE_OP_CAST = 39,             /* x (float32|int32|int64|bool); attrs dtype (1, float32): x as float32 */
};

#define MOE_IMPORT(name) __attribute__((import_module("moehost_v1"), import_name(name)))
#define MOE_EXPORT(name) __attribute__((export_name(name)))

/*
 * Host functions. abi/funcs.go documents each one's errors in full.
 */

/* Copies up to buf_cap bytes of the last error message to buf and returns
 * the message's full length; buf_cap 0 asks for the length alone. */
MOE_IMPORT("last_error")
int32_t moe_last_error(char *buf, int32_t buf_cap);

/* Writes the integer config value key (e.g. "hidden_dim") to *out.
 * MOE_ERR_NOT_FOUND when there is no such integer key. */
MOE_IMPORT("config_i64")
int32_t moe_config_i64(const char *key, int32_t key_len, int64_t *out);

/* Declares the next input (moe_init only) and returns its index. shape[0]
 * must be MOE_BATCH_DIM, the other dims positive. */
MOE_IMPORT("declare_input")
int32_t moe_declare_input(const char *name, int32_t name_len, int32_t dtype, const int64_t *shape, int32_t rank);

/* Declares the next output, as moe_declare_input. */
MOE_IMPORT("declare_output")
int32_t moe_declare_output(const char *name, int32_t name_len, int32_t dtype, const int64_t *shape, int32_t rank);

/* Declares a parameter (moe_init only) and returns its instance-lived
 * handle. The host fills it with init (MOE_INIT_*, arguments a and b) from
 * a seed derived from the expert's uid and the parameter's name. */
MOE_IMPORT("param_new")
int32_t moe_param_new(const char *name, int32_t name_len, int32_t dtype, const int64_t *shape, int32_t rank, int32_t init, double a, double b);

/* Returns the handle of the batched input index (moe_forward only). */
MOE_IMPORT("input")
int32_t moe_input(int32_t index);

/* Sets output index to the tensor behind handle (moe_forward only). */
MOE_IMPORT("output")
int32_t moe_output(int32_t index, int32_t handle);

/* Creates a zero-filled call-lived tensor and returns its handle. */
MOE_IMPORT("tensor_new")
int32_t moe_tensor_new(int32_t dtype, const int64_t *shape, int32_t rank);

/* Copies len bytes (exactly the tensor's size) from ptr into the tensor. */
MOE_IMPORT("tensor_write")
int32_t moe_tensor_write(int32_t handle, const void *ptr, int32_t len);

/* Copies the tensor to ptr (len must be at least its size) and returns the
 * number of bytes written. */
MOE_IMPORT("tensor_read")
int32_t moe_tensor_read(int32_t handle, void *ptr, int32_t len);

/* Writes the tensor's dims to shape (room for cap dims) and returns its
 * rank; nothing is written when cap is smaller than the rank. */
MOE_IMPORT("tensor_shape")
int32_t moe_tensor_shape(int32_t handle, int64_t *shape, int32_t cap);

/* Returns the tensor's dtype (MOE_DTYPE_*). */
MOE_IMPORT("tensor_dtype")
int32_t moe_tensor_dtype(int32_t handle);

/* Runs op code (MOE_OP_*) on nargs handles at args with nattrs doubles at
 * attrs and returns the result's call-lived handle. */
MOE_IMPORT("op")
int32_t moe_op(int32_t code, const int32_t *args, int32_t nargs, const double *attrs, int32_t nattrs);

/* Runs an op with several results (MOE_OP_SPLIT), writes their handles to
 * out (room for out_cap) and returns their number. */
MOE_IMPORT("op_multi")
int32_t moe_op_multi(int32_t code, const int32_t *args, int32_t nargs, const double *attrs, int32_t nattrs, int32_t *out, int32_t out_cap);

/* Records the guest's own error message (at most 1 KiB is kept) for the
 * current export; then return a negative code from the export. */
MOE_IMPORT("fail")
int32_t moe_fail(const char *msg, int32_t msg_len);

#endif /* MOEHOST_V1_H */
