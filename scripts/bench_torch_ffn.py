#!/usr/bin/env python3
"""PyTorch eager reference for `make bench-compare`: hivemind's ffn expert.

FeedforwardBlock is hivemind's (hivemind/moe/server/layers/common.py):
LayerNorm(x + Linear(4h→h)(gelu_fast(Linear(h→4h)(x)))), LayerNorm eps 1e-12.
"fwd" is a forward under torch.no_grad(); "fwdbwd" is hivemind's
ExpertBackend.backward: a forward with grad, backward of random
grad_outputs, then an Adam step and zero_grad. "script_fwd" and
"script_fwdbwd" run the same on torch.jit.script of the block (a copy of
the eager one's parameters, with its own Adam): TorchScript's fuser
joins the elementwise ops of gelu_fast, which eager runs one by one.

Each line read from stdin ("round <seconds>") runs one measurement round of
both modes and prints one JSON line with samples/s; EOF ends the process.
With --once it runs a single round and exits. Importing torch takes
seconds, so the caller keeps one process and interleaves rounds with its
own.
"""
import argparse
import json
import math
import sys
import time

import torch

from hivemind_ffn import FeedforwardBlock  # beside this script


def rate(step, batch, seconds):
    """Samples/s of step, run for at least seconds after one warm-up call."""
    step()
    n, start = 0, time.perf_counter()
    while True:
        step()
        n += 1
        el = time.perf_counter() - start
        if el >= seconds and n >= 3:
            return n * batch / el


def gemm_gflops(seconds=1.0, n=1024):
    """GFLOP/s of torch's float32 GEMM on n×n matrices: the BLAS it runs on.

    Debian's python3-torch uses whatever libblas.so.3 is selected; with the
    reference BLAS it manages about 7 GFLOP/s, with OpenBLAS (the package
    libopenblas0-pthread) ten times that.
    """
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    k, start = 0, time.perf_counter()
    while True:
        a @ b
        k += 1
        el = time.perf_counter() - start
        if el >= seconds and k >= 3:
            return 2 * n**3 * k / el / 1e9


def blas_name():
    """The BLAS this process's torch calls, as OpenBLAS names itself.

    OpenBLAS picks its kernel per CPU at load time, and OPENBLAS_CORETYPE
    in the environment overrides it (some machines pin Haswell's AVX2
    kernel even on AVX-512 CPUs), so the table must say which one ran.
    """
    import ctypes
    paths = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            f = line.split()
            if len(f) >= 6 and "blas" in f[-1] and ".so" in f[-1] and f[-1] not in paths:
                paths.append(f[-1])
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            core, config = lib.openblas_get_corename, lib.openblas_get_config
        except (OSError, AttributeError):
            continue
        core.restype = config.restype = ctypes.c_char_p
        return f"OpenBLAS {core().decode()} kernel ({config().decode()})"
    return "not OpenBLAS: " + (", ".join(paths) or "no BLAS library mapped")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--once", action="store_true")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    expert = FeedforwardBlock(args.hidden)
    opt = torch.optim.Adam(expert.parameters())
    x = torch.randn(args.batch, args.hidden)
    gy = torch.randn(args.batch, args.hidden)

    scripted = FeedforwardBlock(args.hidden)
    scripted.load_state_dict(expert.state_dict())
    scripted = torch.jit.script(scripted)
    sopt = torch.optim.Adam(scripted.parameters())

    def fwd_of(model):
        def fwd():
            with torch.no_grad():
                model(x)
        return fwd

    def fwdbwd_of(model, opt):
        def fwdbwd():
            inp = x.detach().requires_grad_(True)
            out = model(inp)
            torch.autograd.backward([out], [gy])
            opt.step()
            opt.zero_grad()
            return inp.grad
        return fwdbwd

    fwd, fwdbwd = fwd_of(expert), fwdbwd_of(expert, opt)
    sfwd, sfwdbwd = fwd_of(scripted), fwdbwd_of(scripted, sopt)
    # The profiling executor optimises a scripted module after a few
    # calls: warm it up before any round is timed.
    for _ in range(3):
        sfwd()
        sfwdbwd()

    def one(seconds):
        res = {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "fwd": rate(fwd, args.batch, seconds),
            "fwdbwd": rate(fwdbwd, args.batch, seconds),
            "script_fwd": rate(sfwd, args.batch, seconds),
            "script_fwdbwd": rate(sfwdbwd, args.batch, seconds),
        }
        assert all(math.isfinite(res[k]) for k in ("fwd", "fwdbwd", "script_fwd", "script_fwdbwd"))
        print(json.dumps(res), flush=True)

    if args.once:
        one(args.seconds)
        return
    print(json.dumps({"ready": True, "torch": torch.__version__, "gemm_gflops": gemm_gflops(), "blas": blas_name()}), flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        if parts[0] != "round":
            sys.exit(f"unknown command {line!r}")
        one(float(parts[1]) if len(parts) > 1 else args.seconds)


if __name__ == "__main__":
    main()
