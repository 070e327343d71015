/*
 * ffn-c is hivemind's "ffn" expert (FeedforwardBlock) written in C against
 * moehost_v1.h:
 *
 *   y = LayerNorm(x + Linear2(gelu_tanh(Linear1(x))))
 *
 * with Linear1: h->4h, Linear2: 4h->h and LayerNorm eps 1e-12; h comes from
 * the config key "hidden_dim" (default 1024).
 *
 * It is a line-for-line port of the Go expert in ../ffn: it declares the same
 * inputs, outputs and parameters (names, shapes, initialisers, order) and
 * issues the same ops in the same order. The host owns the parameters (it
 * seeds them from the expert's uid and each parameter's name) and runs every
 * kernel, so for one uid its outputs and gradients are bitwise equal to the
 * Go expert's; host/cguest_test.go checks that.
 *
 * It uses no libc: static buffers only, and no WASI imports. wasi-libc's
 * crt1-reactor.o provides _initialize.
 *
 * Build (from the repository root; `make examples-c` runs this):
 *
 *   clang --target=wasm32-wasi -mexec-model=reactor -O2 -Wall -Wextra -Werror \
 *     -Wl,--strip-debug -o examples/wasm-experts/ffn-c/ffn-c.wasm \
 *     examples/wasm-experts/ffn-c/ffn.c
 */
#include "moehost_v1.h"

/* A string literal's pointer and length, as the host functions take them. */
#define STR(s) (s), (int32_t)(sizeof(s) - 1)

/* Parameter handles, valid for the instance's life. */
static int32_t ffn_w, ffn_b;               /* ffn: h -> 4h */
static int32_t ffn_output_w, ffn_output_b; /* ffn_output: 4h -> h */
static int32_t norm_w, norm_b;             /* layer_norm */
static const double norm_eps = 1e-12;

/* ---- error reporting, as sdk/expert's failWith ---- */

static char msg_buf[1024];
static int32_t msg_len;

static void msg_put(const char *s, int32_t n) {
	for (int32_t i = 0; i < n && msg_len < (int32_t)sizeof(msg_buf); i++)
		msg_buf[msg_len++] = s[i];
}

static void msg_puts(const char *s) {
	int32_t n = 0;
	while (s[n])
		n++;
	msg_put(s, n);
}

static const char *errno_name(int32_t e) {
	switch (e) {
	case MOE_ERR_INVALID_HANDLE: return "invalid handle";
	case MOE_ERR_OUT_OF_BOUNDS: return "out of bounds";
	case MOE_ERR_INVALID_ARGUMENT: return "invalid argument";
	case MOE_ERR_SHAPE_MISMATCH: return "shape mismatch";
	case MOE_ERR_UNKNOWN_OP: return "unknown op";
	case MOE_ERR_BUDGET_EXCEEDED: return "budget exceeded";
	case MOE_ERR_WRONG_PHASE: return "wrong phase";
	case MOE_ERR_NOT_FOUND: return "not found";
	case MOE_ERR_ALREADY_EXISTS: return "already exists";
	case MOE_ERR_INTERNAL: return "internal error";
	}
	return "error";
}

/*
 * fail_host reports that host function fn returned the code e: it passes
 * "moehost <fn>: <code>: <host's message>" to moe_fail and returns e, for
 * the export to return.
 */
static int32_t fail_host(const char *fn, int32_t e) {
	msg_len = 0;
	msg_puts("moehost ");
	msg_puts(fn);
	msg_puts(": ");
	msg_puts(errno_name(e));
	msg_puts(": ");
	int32_t room = (int32_t)sizeof(msg_buf) - msg_len;
	int32_t n = moe_last_error(msg_buf + msg_len, room);
	if (n > 0)
		msg_len += n < room ? n : room;
	moe_fail(msg_buf, msg_len);
	return e;
}

/* ---- exports ---- */

MOE_EXPORT("moe_abi_version")
int32_t moe_abi_version(void) { return MOE_ABI_VERSION; }

static int64_t shape[2];

static int32_t param(const char *name, int32_t name_len, int32_t rank, int32_t init, double a, double b) {
	return moe_param_new(name, name_len, MOE_DTYPE_FLOAT32, shape, rank, init, a, b);
}

/* uniform_bound is PyTorch's nn.Linear bound, 1/sqrt(fan_in). */
static double uniform_bound(int64_t fan_in) { return 1.0 / __builtin_sqrt((double)fan_in); }

MOE_EXPORT("moe_init")
int32_t moe_init(void) {
	int64_t h;
	if (moe_config_i64(STR("hidden_dim"), &h) < 0)
		h = 1024;
	if (h <= 0) {
		moe_fail(STR("ffn: hidden_dim must be positive"));
		return MOE_ERR_INVALID_ARGUMENT;
	}
	int32_t r;
	shape[0] = MOE_BATCH_DIM;
	shape[1] = h;
	if ((r = moe_declare_input(STR("x"), MOE_DTYPE_FLOAT32, shape, 2)) < 0)
		return fail_host("declare_input", r);
	if ((r = moe_declare_output(STR("y"), MOE_DTYPE_FLOAT32, shape, 2)) < 0)
		return fail_host("declare_output", r);

	/* Like the Go SDK, declare all six and then report the first error. */
	int32_t hs[6];
	double b1 = uniform_bound(h), b2 = uniform_bound(4 * h);
	shape[0] = 4 * h;
	shape[1] = h;
	hs[0] = ffn_w = param(STR("ffn.weight"), 2, MOE_INIT_UNIFORM, -b1, b1);
	hs[1] = ffn_b = param(STR("ffn.bias"), 1, MOE_INIT_UNIFORM, -b1, b1);
	shape[0] = h;
	shape[1] = 4 * h;
	hs[2] = ffn_output_w = param(STR("ffn_output.weight"), 2, MOE_INIT_UNIFORM, -b2, b2);
	hs[3] = ffn_output_b = param(STR("ffn_output.bias"), 1, MOE_INIT_UNIFORM, -b2, b2);
	shape[0] = h;
	hs[4] = norm_w = param(STR("layer_norm.weight"), 1, MOE_INIT_ONES, 0, 0);
	hs[5] = norm_b = param(STR("layer_norm.bias"), 1, MOE_INIT_ZEROS, 0, 0);
	for (int i = 0; i < 6; i++)
		if (hs[i] < 0)
			return fail_host("param_new", hs[i]);
	return 0;
}

static int32_t args[3];

/* op runs code on nargs handles from args (and attrs) and fails the
 * forward when the host refuses. */
#define OP(dst, code, nargs, attrs, nattrs)                               \
	do {                                                              \
		if (((dst) = moe_op((code), args, (nargs), (attrs), (nattrs))) < 0) \
			return fail_host("op", (dst));                            \
	} while (0)

MOE_EXPORT("moe_forward")
int32_t moe_forward(void) {
	int32_t x, t, r;
	if ((x = moe_input(0)) < 0)
		return fail_host("input", x);

	args[0] = x, args[1] = ffn_w, args[2] = ffn_b;
	OP(t, MOE_OP_LINEAR, 3, 0, 0);
	args[0] = t;
	OP(t, MOE_OP_GELU_TANH, 1, 0, 0);
	args[0] = t, args[1] = ffn_output_w, args[2] = ffn_output_b;
	OP(t, MOE_OP_LINEAR, 3, 0, 0);
	args[0] = x, args[1] = t;
	OP(t, MOE_OP_ADD, 2, 0, 0);
	args[0] = t, args[1] = norm_w, args[2] = norm_b;
	OP(t, MOE_OP_LAYER_NORM, 3, &norm_eps, 1);

	if ((r = moe_output(0, t)) < 0)
		return fail_host("output", r);
	return 0;
}
