#!/usr/bin/env python3
"""The PyTorch peer of the device check (scripts/device-run.sh) on a GPU.

It measures, on the same GPU and in the same run as moehost's benchmarks:

- torch.matmul's fp32 TFLOP/s at each GEMM shape of the driver's
  BenchmarkSgemm (MxNxK:AB, A and B each N or T), with TF32 off
  (torch.backends.cuda.matmul.allow_tf32 = False and "highest" matmul
  precision), so that both sides do plain fp32 through cuBLAS;
- hivemind's ffn (hivemind_ffn.FeedforwardBlock) in eager mode at the
  same hidden size and batch: a forward under no_grad, and a forward,
  backward of random output gradients (to the input too, as a Backward
  request returns) and an Adam step, in samples/s.

With --ours FILE (the Go benchmarks' output) it prints one table of
moehost against PyTorch with the ratios and the issue's bars (GEMM at
least 0.7 of cuBLAS through PyTorch; ffn samples/s at least PyTorch
eager's), and writes it as JSON too with --json FILE.
"""
import argparse
import json
import re
import sys
import time

import torch

from hivemind_ffn import FeedforwardBlock  # beside this script


def cuda_time(fn, iters, warmup=3):
    """Seconds per call of fn on the GPU, by CUDA events, after warm-ups."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def parse_shape(s):
    dims, ops = s.split(":")
    m, n, k = (int(v) for v in dims.split("x"))
    return m, n, k, ops[0] == "T", ops[1] == "T"


def shape_name(m, n, k, ta, tb):
    return f"{m}x{n}x{k}_{'T' if ta else 'N'}{'T' if tb else 'N'}"


def matmul_tflops(m, n, k, ta, tb, iters):
    dev = "cuda"
    a = torch.randn((k, m) if ta else (m, k), device=dev)
    b = torch.randn((n, k) if tb else (k, n), device=dev)
    opa, opb = (a.t() if ta else a), (b.t() if tb else b)
    out = torch.empty(m, n, device=dev)
    sec = cuda_time(lambda: torch.matmul(opa, opb, out=out), iters)
    return 2.0 * m * n * k / sec / 1e12


def ffn_rates(hidden, batch, iters):
    torch.manual_seed(0)
    expert = FeedforwardBlock(hidden).cuda()
    opt = torch.optim.Adam(expert.parameters())
    x = torch.randn(batch, hidden, device="cuda")
    gy = torch.randn(batch, hidden, device="cuda")

    def fwd():
        with torch.no_grad():
            expert(x)

    def train():
        inp = x.detach().requires_grad_(True)
        out = expert(inp)
        torch.autograd.backward([out], [gy])
        opt.step()
        opt.zero_grad()
        return inp.grad

    return batch / cuda_time(fwd, iters), batch / cuda_time(train, iters)


BENCH_LINE = re.compile(r"^Benchmark(\S+?)(?:-\d+)?\s+\d+\s+(.*)$")


def parse_go_bench(path):
    """{name: {unit: value}} from `go test -bench` output."""
    res = {}
    with open(path) as f:
        for line in f:
            m = BENCH_LINE.match(line.strip())
            if not m:
                continue
            fields = m.group(2).split()
            res[m.group(1)] = {fields[i + 1]: float(fields[i]) for i in range(0, len(fields) - 1, 2)}
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096x1024:NT,4096x1024x4096:NT,4096x1024x4096:TN")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--gemm-iters", type=int, default=50)
    ap.add_argument("--ffn-iters", type=int, default=20)
    ap.add_argument("--ours", help="the Go benchmarks' output (BenchmarkSgemm, BenchmarkDeviceFFN)")
    ap.add_argument("--json", help="write the table here as JSON too")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        sys.exit("torch_cuda_peer: torch sees no GPU")
    # Plain fp32 on both sides. PyTorch 2.9 added fp32_precision and
    # deprecated allow_tf32 (mixing the two may be refused): use the new
    # switch where it exists.
    # (The ffn has no convolutions: cuDNN's switch does not matter.)
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    except (AttributeError, RuntimeError, ValueError):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")

    ours = parse_go_bench(args.ours) if args.ours else {}
    rows = []  # (what, unit, moehost, torch, bar)
    for s in args.shapes.split(","):
        shape = parse_shape(s)
        name = shape_name(*shape)
        theirs = matmul_tflops(*shape, args.gemm_iters)
        mine = ours.get("Sgemm/" + name, {}).get("TFLOP/s")
        rows.append((f"GEMM {name} (driver's Sgemm vs torch.matmul)", "TFLOP/s", mine, theirs, 0.7))
    fwd, train = ffn_rates(args.hidden, args.batch, args.ffn_iters)
    flops_fwd = 16.0 * args.batch * args.hidden**2
    for key, what, theirs, flops in (
        ("forward", "ffn forward", fwd, flops_fwd),
        ("train", "ffn forward+backward+Adam", train, 3 * flops_fwd),
    ):
        mine = ours.get("DeviceFFN/" + key, {})
        rows.append((f"{what}, h={args.hidden} batch={args.batch}", "samples/s", mine.get("samples/s"), theirs, 1.0))
        rows.append((f"{what} GEMM rate", "TFLOP/s", mine.get("TFLOP/s"), theirs * flops / args.batch / 1e12, None))

    gpu = torch.cuda.get_device_name(0)
    print(f"device: {gpu}; torch {torch.__version__}, CUDA {torch.version.cuda}, TF32 off")
    print(f"| {'what':<62} | {'unit':<9} | {'moehost':>10} | {'PyTorch':>10} | {'ratio':>6} | bar |")
    print(f"|{'-' * 64}|{'-' * 11}|{'-' * 12}|{'-' * 12}|{'-' * 8}|-----|")
    table = []
    for what, unit, mine, theirs, bar in rows:
        ratio = mine / theirs if mine is not None and theirs else None
        ok = "" if bar is None else ("?" if ratio is None else ("ok" if ratio >= bar else "NO"))
        fmt = lambda v: "—" if v is None else f"{v:.4g}"
        bar_s = "" if bar is None else f"≥{bar:g} {ok}"
        print(f"| {what:<62} | {unit:<9} | {fmt(mine):>10} | {fmt(theirs):>10} | {fmt(ratio):>6} | {bar_s} |")
        table.append({"what": what, "unit": unit, "moehost": mine, "pytorch": theirs, "ratio": ratio, "bar": bar})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": gpu, "torch": torch.__version__, "cuda": torch.version.cuda, "rows": table}, f, indent=1)


if __name__ == "__main__":
    main()
