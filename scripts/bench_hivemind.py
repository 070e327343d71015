"""hivemind 1.1.11's own benchmark_throughput client against `moehost serve --hivemind` and hivemind's server.

Run by `make bench-hivemind` with the python of the hivemind build (scripts/build-hivemind.sh):

  bench_hivemind.py --moehost BIN --benchmarks PREFIX/share/hivemind-1.1.11/benchmarks

For each load (clients x rows, forward and forward+backward) it times, one after the other:
  moehost    benchmark_throughput's own client_process (imported, unchanged) against `moehost serve --hivemind`;
  hivemind   the same client against hivemind's Server started alone, built as benchmark_throughput builds it;
  own        benchmark_throughput(...) itself (its in-process server), its printed figure, to show the driver's
             hivemind number matches the script's.
Timing is the script's: from the moment the already started clients may begin (can_start) until all joined,
so each client's P2P.create is inside the window, as there. Every p2pd gets nat_port_map=False and listens on
127.0.0.1 only.
"""

import argparse
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time

import torch

from hivemind.p2p import P2P, PeerID

from moehost_hivemind import MoehostServe

_create = P2P.create.__func__


async def _create_no_natpmp(cls, *args, **kwargs):
    # As the shared bench.py: P2P.create's nat_port_map default (UPnP/NAT-PMP probes) off in every process,
    # including benchmark_throughput's clients, which call P2P.create(initial_peers=...) only.
    kwargs.setdefault("nat_port_map", False)
    kwargs.setdefault("host_maddrs", ["/ip4/127.0.0.1/tcp/0"])
    return await _create(cls, *args, **kwargs)


P2P.create = classmethod(_create_no_natpmp)


def settle():
    """Lets forked clients reach can_start.wait(), as they do while benchmark_throughput builds its server."""
    time.sleep(1.0)


def drive(bt, maddrs, peer_id, num_experts, num_clients, batch_size, num_batches, backprop):
    """benchmark_throughput's client phase against a running server; returns samples/s."""
    failed, can_start = mp.Event(), mp.Event()
    clients = [
        mp.Process(target=bt.client_process, name=f"client_process-{i}", daemon=True,
                   args=(can_start, failed, maddrs, peer_id, num_experts, batch_size, HID,
                         num_batches, backprop))
        for i in range(num_clients)
    ]
    for c in clients:
        c.start()
    settle()
    start = time.perf_counter()
    can_start.set()
    deadline = start + DRIVE_TIMEOUT
    for c in clients:
        c.join(max(0.0, deadline - time.perf_counter()))
    elapsed = time.perf_counter() - start
    if any(c.is_alive() for c in clients):
        # Seen with hivemind's server at 32x1 fwd+bwd under load: torch's shared memory manager timed out in
        # its handlers and the clients waited forever. The cell says so; the table still comes out.
        for c in clients:
            if c.is_alive():
                c.kill()
        print(f"clients still waiting after {DRIVE_TIMEOUT} s: the server failed", flush=True)
        return float("nan")
    if failed.is_set() or any(c.exitcode != 0 for c in clients):
        raise RuntimeError("a benchmark client failed (see its traceback above)")
    return batch_size * num_clients * num_batches / elapsed


def hivemind_server(bt, num_experts, num_handlers, max_batch_size, out, stop):
    """hivemind's Server alone, with the experts, optimizer and handlers benchmark_throughput gives it."""
    from hivemind.dht import DHT
    from hivemind.moe.server import ModuleBackend, Server
    from hivemind.moe.server.layers import name_to_block
    from hivemind.utils.tensor_descr import BatchTensorDescriptor

    dht = DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False)
    backends = {}
    for i in range(num_experts):
        expert = torch.jit.script(name_to_block["ffn"](HID))
        backends[f"expert.{i}"] = ModuleBackend(
            name=f"expert.{i}", module=expert, optimizer=torch.optim.Adam(expert.parameters()),
            args_schema=(BatchTensorDescriptor(HID),), outputs_schema=BatchTensorDescriptor(HID),
            max_batch_size=max_batch_size)
    server = Server(dht=dht, module_backends=backends, num_connection_handlers=num_handlers, device="cpu")
    server.start()
    server.ready.wait()
    out.put(([str(a) for a in dht.get_visible_maddrs()], dht.peer_id.to_base58()))
    stop.wait()
    server.shutdown()
    server.join()
    dht.shutdown()


class Moehost(MoehostServe):
    """`moehost serve --hivemind` in a child process, serving expert.0 … expert.N-1 (hivemind's ffn)."""

    def __init__(self, binary, num_experts, max_batch_size):
        super().__init__(binary, ["--experts", f"expert.[0:{num_experts}]", "--hidden-dim", str(HID), "--no-dht",
                                  "--no-checkpoints", "--optimizer", "adam", "--max-batch-size", str(max_batch_size)],
                         prefix="moehost-bench-hivemind-", timeout=300)


def own(benchmarks, kwargs):
    """benchmark_throughput(**kwargs) in a child python (it forks and shuts down its own server); its figure."""
    # A check column, not a result: a run that hangs (seen once at 32x1 under load, its DHT process dead) or
    # fails is reported as nan and the table still comes out. start_new_session lets the timeout kill its tree.
    proc = subprocess.Popen([sys.executable, __file__, "--own", repr(kwargs), "--benchmarks", benchmarks],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=OWN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        print(f"benchmark_throughput({kwargs}) did not finish in {OWN_TIMEOUT} s", flush=True)
        return float("nan")
    m = re.search(r"Throughput for .* passes: ([0-9.]+) samples / s", text)
    if proc.returncode != 0 or not m or "status:Success" not in text:
        print("benchmark_throughput failed:\n" + text[-4000:], flush=True)
        return float("nan")
    return float(m.group(1))


OWN_TIMEOUT = 300
DRIVE_TIMEOUT = 600


HID = 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moehost", help="the moehost binary")
    ap.add_argument("--benchmarks", required=True, help="hivemind 1.1.11's benchmarks folder (PREFIX/share/...)")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--loads", default="8x256x8,32x1x32",
                    help="comma-separated CLIENTSxROWSxBATCHES_PER_CLIENT (default: %(default)s)")
    ap.add_argument("--no-own", action="store_true", help="skip benchmark_throughput's own run")
    ap.add_argument("--own", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, args.benchmarks)
    import benchmark_throughput as bt  # hivemind 1.1.11's module, unmodified

    if args.own is not None:
        import ast
        bt.benchmark_throughput(**ast.literal_eval(args.own))
        return

    loads = [tuple(int(x) for x in s.split("x")) for s in args.loads.split(",")]
    rows = []
    moehost = Moehost(args.moehost, args.experts, max(4 * b for _, b, _ in loads))
    try:
        for clients, batch, batches in loads:
            # benchmark_throughput's defaults: max_batch_size 4x the rows, num_handlers clients//2; for 1-row
            # loads the script's small-batch presets (and the shared README's 32x1 figure) use 8192.
            max_batch = 8192 if batch < 32 else 4 * batch
            handlers = max(1, clients // 2)
            for backprop in (False, True):
                label = f"{clients}x{batch} {'fwd+bwd' if backprop else 'fwd'}"
                m = drive(bt, moehost.maddrs, PeerID.from_base58(moehost.peer_id), args.experts, clients, batch,
                          batches, backprop)
                print(f"{label}: moehost {m:.1f} samples/s", flush=True)
                out, stop = mp.Queue(), mp.Event()
                srv = mp.Process(target=hivemind_server, args=(bt, args.experts, handlers, max_batch, out, stop))
                srv.start()
                try:
                    maddrs, peer = out.get(timeout=300)
                    h = drive(bt, maddrs, PeerID.from_base58(peer), args.experts, clients, batch, batches, backprop)
                finally:
                    stop.set()
                    srv.join(60)
                    if srv.is_alive():
                        srv.kill()
                print(f"{label}: hivemind {h:.1f} samples/s", flush=True)
                o = float("nan")
                if not args.no_own:
                    o = own(args.benchmarks, dict(
                        num_experts=args.experts, num_clients=clients, num_handlers=handlers, batch_size=batch,
                        num_batches_per_client=batches, max_batch_size=max_batch, backprop=backprop,
                        hid_dim=HID, expert_cls="ffn", device="cpu"))
                    print(f"{label}: benchmark_throughput {o:.1f} samples/s", flush=True)
                rows.append((label, m, h, o))
    finally:
        moehost.stop()

    print()
    print(f"{args.experts} ffn experts, hidden {HID}, CPU; samples/s (higher is better); load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    print("| load | moehost | hivemind Server | benchmark_throughput (own server) | moehost / hivemind |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, m, h, o in rows:
        ratio = f"{m / h:.2f}x" if m == m and h == h else "-"
        print(f"| {label} | {m:.1f} | {h:.1f} | {o:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
