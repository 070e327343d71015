"""RemoteMixtureOfExperts: a layer that sends each sample to the k best
experts of a grid found through a server's DiscoveryService, after
hivemind's RemoteMixtureOfExperts and our Go sdk/client.MixtureOfExperts.
"""

import queue
import time
from typing import Dict, List, Optional, Sequence, Tuple

import grpc
import torch
from torch import nn

from moehost.expert import DEFAULT_MAX_MESSAGE_BYTES, _from_wire, _to_wire, auth_metadata, open_channel, wire_dtypes
from moehost.v1 import discovery_pb2, discovery_pb2_grpc, expert_pb2, expert_pb2_grpc


# MAX_TRUSTED_PEERS bounds trusted_peers, as the DiscoveryService bounds
# BeamSearchRequest.peers.
MAX_TRUSTED_PEERS = 1024


class KMinNotMetError(RuntimeError):
    """Fewer than k_min (or backward_k_min) experts of a sample answered."""


class _Choice:
    """One expert chosen for one sample: its uid, grid coordinates and the
    address of the server picked to call ("host:port", or its https://
    URL)."""

    __slots__ = ("uid", "coords", "addr")

    def __init__(self, uid: str, coords: Tuple[int, ...], addr: str):
        self.uid, self.coords, self.addr = uid, coords, addr


def _addr_of(url: str) -> str:
    """A record's base URL as the address to call: "host:port" for an
    http:// URL, and an https:// one as it is, for a channel over TLS."""
    url = url.rstrip("/")
    return url[len("http://"):] if url.startswith("http://") else url


class _RemoteCallMany(torch.autograd.Function):
    """Forward and Backward of every chosen expert of every sample, as one
    autograd node. Returns the experts' outputs, [batch, k, *out], zero
    where an expert did not answer, and the mask of those that did.
    Backward goes to the responders only. The first argument is a dummy
    that requires grad, so that backward runs (and the experts train)
    even when the input does not require grad."""

    @staticmethod
    def forward(ctx, dummy, moe: "RemoteMixtureOfExperts", chosen: List[List[_Choice]], x: torch.Tensor):
        outputs, mask = moe._forward_all(chosen, x)
        ctx.moe, ctx.chosen = moe, chosen
        ctx.save_for_backward(x, mask)
        ctx.mark_non_differentiable(mask)
        return outputs, mask

    @staticmethod
    def backward(ctx, grad_outputs, _grad_mask):
        x, mask = ctx.saved_tensors
        grad_x = ctx.moe._backward_all(ctx.chosen, x, mask, grad_outputs)
        return None, None, None, grad_x.to(x.dtype)


class RemoteMixtureOfExperts(nn.Module):
    """A mixture of remote experts, gated by a local linear layer.

    For each sample, ``proj`` (a ``Linear(in_features, sum(grid_size))``)
    scores every coordinate of every grid dimension; the server at
    ``discovery`` beam-searches its DHT for the ``k_best`` existing experts
    ``uid_prefix.i.j…`` with the highest sum of scores; the sample goes to
    each of them (as a batch of one, to the least loaded server hosting
    it), and the output is their outputs mixed by a softmax of their scores
    over those that answered. Gradients reach the input, through the
    experts' Backward, and ``proj``, through the softmax; every backward is
    an optimizer step of each responding expert on its server.

    ``k_min`` experts must answer each sample's forward, within
    ``forward_timeout`` seconds (None: no limit); once ``k_min`` have,
    the rest get ``timeout_after_k_min`` more seconds. ``backward_k_min``
    of the responders must answer the backward, within
    ``backward_timeout``. Otherwise the call raises KMinNotMetError.
    Experts take and return one float tensor.

    A server that fails a call is avoided for ``ban_base`` seconds,
    doubling per failure in a row up to ``ban_max`` (as the Go client
    does): its experts are skipped and the next best take their place.
    Among an expert's servers, one never called is tried first (the least
    loaded by its record's claim), then the one that failed least and
    answered fastest; a record's claimed load never outranks what was
    measured. ``trusted_peers``, if given (at most 1024 peer ids), pins
    the servers the mixture calls: the discovery server's beam search runs
    over the records signed by those keys alone, so that the k_best
    experts they host are found however many others score higher, and
    each endpoint's peer id is checked again here, since the discovery
    server is not trusted to have filtered.

    ``token`` goes with every call (beam searches, Forward, Backward) as
    ``authorization: Bearer <token>``, so that a tenant trains its own
    experts; None (the default) takes ``$MOEHOST_TOKEN``, "" sends none.
    It goes to every server the mixture calls: pin them with
    ``trusted_peers``.

    ``discovery`` is "host:port" or a URL; servers whose records give
    https:// URLs (``moehost serve --tls-cert``), and an https://
    ``discovery``, are called over TLS, their certificates checked against
    the CA certificates of ``ca_file`` (PEM; default ``$MOEHOST_CA_FILE``,
    else grpcio's roots).
    """

    def __init__(
        self,
        *,
        in_features: int,
        grid_size: Sequence[int],
        uid_prefix: str,
        discovery: str,
        k_best: int,
        k_min: int = 1,
        forward_timeout: Optional[float] = None,
        timeout_after_k_min: Optional[float] = 1.0,
        backward_k_min: int = 1,
        backward_timeout: Optional[float] = None,
        wire_dtype: torch.dtype = torch.float32,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        ban_base: float = 1.0,
        ban_max: float = 60.0,
        trusted_peers: Optional[Sequence[str]] = None,
        token: Optional[str] = None,
        ca_file: Optional[str] = None,
    ):
        super().__init__()
        if not grid_size or any(g <= 0 for g in grid_size):
            raise ValueError(f"moehost: grid_size {tuple(grid_size)}: want positive sizes")
        if not 1 <= k_min <= k_best:
            raise ValueError(f"moehost: k_min {k_min}, k_best {k_best}: want 1 <= k_min <= k_best")
        if not 1 <= backward_k_min <= k_best:
            raise ValueError(f"moehost: backward_k_min {backward_k_min}: want 1 <= backward_k_min <= k_best")
        if wire_dtype not in wire_dtypes:
            raise ValueError(f"moehost: wire_dtype {wire_dtype}: want torch.float32, torch.float16 or torch.bfloat16")
        self.grid_size = tuple(grid_size)
        self.uid_prefix = uid_prefix.rstrip(".")
        self.k_best, self.k_min, self.backward_k_min = k_best, k_min, backward_k_min
        self.forward_timeout, self.timeout_after_k_min = forward_timeout, timeout_after_k_min
        self.backward_timeout = backward_timeout
        self.proj = nn.Linear(in_features, sum(self.grid_size))
        self._wire = wire_dtypes[wire_dtype]
        self._metadata = auth_metadata(token)
        self._max_message_bytes, self._ca_file = max_message_bytes, ca_file
        self._discovery = discovery_pb2_grpc.DiscoveryServiceStub(open_channel(discovery, max_message_bytes, ca_file))
        self._stubs: Dict[str, expert_pb2_grpc.ExpertServiceStub] = {}
        self._dummy = nn.Parameter(torch.empty(0), requires_grad=True)
        self.ban_base, self.ban_max = ban_base, ban_max
        if trusted_peers is not None and len(trusted_peers) > MAX_TRUSTED_PEERS:
            raise ValueError(f"moehost: {len(trusted_peers)} trusted peers: want at most {MAX_TRUSTED_PEERS}")
        self.trusted_peers = frozenset(trusted_peers) if trusted_peers is not None else None
        # Sent with every beam search; sorted, so that requests are stable.
        self._peers = sorted(self.trusted_peers) if self.trusted_peers is not None else []
        self._bans: Dict[str, Tuple[float, float]] = {}  # addr -> (until, backoff)
        self._seen: Dict[str, Tuple[float, int]] = {}  # addr -> (latency average, failures in a row)

    def banned(self, addr: str) -> bool:
        """Whether the server at addr ("host:port") is being avoided."""
        ban = self._bans.get(addr)
        return ban is not None and time.monotonic() < ban[0]

    def _fail(self, addr: str):
        _, backoff = self._bans.get(addr, (0.0, 0.0))
        backoff = min(max(2 * backoff, self.ban_base), self.ban_max)
        self._bans[addr] = (time.monotonic() + backoff, backoff)
        lat, fails = self._seen.get(addr, (0.0, 0))
        self._seen[addr] = (lat, fails + 1)

    def _succeed(self, addr: str, took: float):
        self._bans.pop(addr, None)
        lat, _ = self._seen.get(addr, (None, 0))
        self._seen[addr] = (took if lat is None or lat == 0.0 else 0.3 * took + 0.7 * lat, 0)

    def _pick(self, endpoints) -> Optional[str]:
        """The address to call among an expert's endpoints, or None."""
        best, best_key = None, None
        for ep in endpoints:
            if self.trusted_peers is not None and ep.peer_id not in self.trusted_peers:
                continue
            addr = _addr_of(ep.url)
            if self.banned(addr):
                continue
            seen = self._seen.get(addr)
            key = (1, ep.queue_depth, 0.0) if seen is None else (2, seen[1], seen[0])
            if best_key is None or key < best_key:
                best, best_key = addr, key
        return best

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            raise ValueError(f"moehost: input of shape {tuple(x.shape)}: want [batch, in_features]")
        grid_scores = self.proj(x).split(self.grid_size, dim=-1)
        chosen = self.beam_search(grid_scores)
        outputs, mask = _RemoteCallMany.apply(self._dummy, self, chosen, x)
        # Each slot's logit: the sum of its coordinates' scores.
        k = outputs.shape[1]
        coords = torch.zeros(x.shape[0], k, len(self.grid_size), dtype=torch.long, device=x.device)
        for b, row in enumerate(chosen):
            for j, c in enumerate(row):
                coords[b, j] = torch.tensor(c.coords)
        logits = sum(s.gather(1, coords[:, :, d]) for d, s in enumerate(grid_scores))
        weights = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=1)
        weights = weights.reshape(*weights.shape, *([1] * (outputs.dim() - 2)))
        return (weights * outputs.to(weights.dtype)).sum(dim=1)

    def beam_search(self, grid_scores: Sequence[torch.Tensor]) -> List[List[_Choice]]:
        """Asks the discovery server for each sample's k_best experts, best
        first, and picks a server for each (the least loaded)."""
        scores = [s.detach().double().cpu() for s in grid_scores]
        # Ask for more than k_best while servers are banned, so that the
        # next best experts replace theirs. Untrusted servers need no
        # margin: the search runs over the trusted peers' records alone.
        extra = sum(1 for a in self._bans if self.banned(a))
        k = min(self.k_best * (1 + extra), 1024)
        futures = [
            self._discovery.BeamSearch.future(
                discovery_pb2.BeamSearchRequest(
                    prefix=self.uid_prefix,
                    grid_scores=[discovery_pb2.Scores(values=s[b].tolist()) for s in scores],
                    k=k,
                    peers=self._peers,
                ),
                timeout=self.forward_timeout,
                metadata=self._metadata,
            )
            for b in range(scores[0].shape[0])
        ]
        chosen = []
        for fut in futures:
            row = []
            for e in fut.result().experts:
                if len(row) == self.k_best:
                    break
                addr = self._pick(e.endpoints)
                if addr is None:
                    continue
                coords = tuple(int(c) for c in e.uid[len(self.uid_prefix) + 1:].split("."))
                if len(coords) != len(self.grid_size):
                    raise ValueError(f"moehost: expert {e.uid} has {len(coords)} coordinates, the grid {len(self.grid_size)}")
                row.append(_Choice(e.uid, coords, addr))
            if len(row) < self.k_min:
                raise KMinNotMetError(
                    f"moehost: the DHT knows {len(row)} experts under {self.uid_prefix!r} with a server "
                    f"not banned{' and trusted' if self.trusted_peers is not None else ''}, k_min is {self.k_min}"
                )
            chosen.append(row)
        return chosen

    def _stub(self, addr: str) -> expert_pb2_grpc.ExpertServiceStub:
        stub = self._stubs.get(addr)
        if stub is None:
            stub = expert_pb2_grpc.ExpertServiceStub(open_channel(addr, self._max_message_bytes, self._ca_file))
            self._stubs[addr] = stub
        return stub

    def _forward_all(self, chosen, x):
        calls = []
        for b, row in enumerate(chosen):
            xb = _to_wire(x[b:b + 1], self._wire)
            for j, c in enumerate(row):
                req = expert_pb2.ForwardRequest(uid=c.uid, inputs=[xb], output_dtype=self._wire)
                calls.append((b, j, self._stub(c.addr).Forward.future(req, timeout=self.forward_timeout, metadata=self._metadata)))
        got = _gather(calls, len(chosen), self.k_min, self.timeout_after_k_min, chosen, "forward", self)
        first = next(iter(got.values()))
        k = max(len(row) for row in chosen)
        outputs = torch.zeros(len(chosen), k, *first.shape[1:], device=x.device)
        mask = torch.zeros(len(chosen), k, dtype=torch.bool, device=x.device)
        for (b, j), out in got.items():
            if out.shape != first.shape:
                raise ValueError(f"moehost: experts returned outputs of shapes {tuple(first.shape)} and {tuple(out.shape)}")
            outputs[b, j] = out[0].to(x.device)
            mask[b, j] = True
        return outputs, mask

    def _backward_all(self, chosen, x, mask, grad_outputs):
        calls = []
        for b, row in enumerate(chosen):
            xb = _to_wire(x[b:b + 1], self._wire)
            for j, c in enumerate(row):
                if not mask[b, j]:
                    continue  # only the responders of the forward pass
                req = expert_pb2.BackwardRequest(
                    uid=c.uid, inputs=[xb], grad_outputs=[_to_wire(grad_outputs[b, j:j + 1], self._wire)],
                    grad_input_dtype=self._wire,
                )
                calls.append((b, j, self._stub(c.addr).Backward.future(req, timeout=self.backward_timeout, metadata=self._metadata)))
        got = _gather(calls, len(chosen), self.backward_k_min, None, chosen, "backward", self)
        grad_x = torch.zeros_like(x, dtype=torch.float32)
        for (b, _), g in got.items():
            grad_x[b] += g[0].to(x.device)
        return grad_x


def _gather(calls, samples, k_min, after_k_min, chosen, what, moe=None):
    """Waits for (sample, slot, grpc future) calls; once a sample has k_min
    answers, its other calls get after_k_min more seconds (None: no
    limit) and are then cancelled. A failed call bans its server in moe,
    an answered one measures it. Returns {(sample, slot): tensor};
    raises KMinNotMetError if a sample has fewer than k_min."""
    begin = time.monotonic()
    done: "queue.Queue[int]" = queue.Queue()
    for i, (_, _, fut) in enumerate(calls):
        fut.add_done_callback(lambda _f, i=i: done.put(i))
    pending = [0] * samples
    for b, _, _ in calls:
        pending[b] += 1
    answered = [0] * samples
    deadline: List[Optional[float]] = [None] * samples
    got, failures = {}, [[] for _ in range(samples)]
    for _ in range(len(calls)):
        while True:
            waits = [d for b, d in enumerate(deadline) if d is not None and pending[b] > 0]
            timeout = max(0.0, min(waits) - time.monotonic()) if waits else None
            try:
                i = done.get(timeout=timeout)
                break
            except queue.Empty:
                now = time.monotonic()
                for b, d in enumerate(deadline):
                    if d is not None and d <= now:
                        deadline[b] = None  # cancel once; the callbacks still come
                        for cb, _, fut in calls:
                            if cb == b:
                                fut.cancel()
        b, j, fut = calls[i]
        pending[b] -= 1
        try:
            res = fut.result()
        except grpc.FutureCancelledError:
            failures[b].append(f"{chosen[b][j].uid}: cancelled {after_k_min}s after k_min answered")
            continue
        except grpc.RpcError as e:
            failures[b].append(f"{chosen[b][j].uid} at {chosen[b][j].addr}: {e.code().name}: {e.details()}")
            if moe is not None:
                moe._fail(chosen[b][j].addr)
            continue
        if moe is not None:
            moe._succeed(chosen[b][j].addr, time.monotonic() - begin)
        outs = list(res.outputs if what == "forward" else res.grad_inputs)
        if len(outs) != 1:
            failures[b].append(f"{chosen[b][j].uid} returned {len(outs)} tensors, want 1")
            continue
        got[(b, j)] = _from_wire(outs[0])
        answered[b] += 1
        if answered[b] == k_min and after_k_min is not None and pending[b] > 0:
            deadline[b] = time.monotonic() + after_k_min
    for b in range(samples):
        if answered[b] < k_min:
            raise KMinNotMetError(
                f"moehost: sample {b}: {answered[b]} of {len(chosen[b])} experts answered the {what}, "
                f"k_min is {k_min}: " + "; ".join(failures[b])
            )
    return got
