"""RemoteExpert: a moehost expert as a PyTorch module."""

import os
import sys
from typing import Dict, Optional, Tuple

import grpc
import numpy as np
import torch
from torch import nn

from moehost.errors import from_rpc_error, grpc_target

try:
    from moehost.v1 import expert_pb2, expert_pb2_grpc, tensor_pb2
except ImportError as e:  # pragma: no cover - a setup error, said plainly
    raise ImportError(
        f"moehost: cannot load its protobuf stubs (moehost.v1): {e}. They ship in the package "
        "and need protobuf 3.20 or later; in a checkout, `make python-stubs` rewrites them"
    ) from e

# The server's default request cap (moehost serve --max-request-bytes).
# grpcio's own default is 4 MiB, which a 1024x1024 float32 batch exceeds.
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20

if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("moehost: tensors on the wire are little-endian; this host is not")

# TOKEN_ENV holds the bearer token a client sends when given no token.
TOKEN_ENV = "MOEHOST_TOKEN"


# CA_FILE_ENV names the PEM file of the CA that signs https:// servers'
# certificates, when a client is given no ca_file.
CA_FILE_ENV = "MOEHOST_CA_FILE"


def open_channel(endpoint: str, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 ca_file: Optional[str] = None) -> grpc.Channel:
    """A gRPC channel to endpoint whose message limit, both ways, is
    max_message_bytes: over TLS for an https:// URL, trusting the CA
    certificates in ca_file (default ``$MOEHOST_CA_FILE``; with neither,
    grpcio's own roots); in cleartext for "host:port" and http:// URLs."""
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
    if not endpoint.startswith("https://"):
        return grpc.insecure_channel(grpc_target(endpoint), options=options)
    if ca_file is None:
        ca_file = os.environ.get(CA_FILE_ENV) or None
    roots = None
    if ca_file is not None:
        with open(ca_file, "rb") as f:
            roots = f.read()
        if b"-----BEGIN CERTIFICATE-----" not in roots:
            raise ValueError(f"moehost: CA file {ca_file}: no PEM certificate in it")
    return grpc.secure_channel(grpc_target(endpoint), grpc.ssl_channel_credentials(root_certificates=roots), options=options)


def auth_metadata(token: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    """The gRPC metadata that carries token as "authorization: Bearer
    <token>": none for "", and $MOEHOST_TOKEN's for None."""
    if token is None:
        token = os.environ.get(TOKEN_ENV, "")
    token = token.strip()
    return (("authorization", f"Bearer {token}"),) if token else ()


_DT = tensor_pb2.DType

# torch dtypes the wire may carry float32 tensors in.
wire_dtypes: Dict[torch.dtype, int] = {
    torch.float32: _DT.DTYPE_FLOAT32,
    torch.float16: _DT.DTYPE_FLOAT16,
    torch.bfloat16: _DT.DTYPE_BFLOAT16,
}


def _to_wire(t: torch.Tensor, wire: int) -> tensor_pb2.Tensor:
    """Encodes a tensor; floating ones go as the wire dtype."""
    t = t.detach().cpu().contiguous()
    shape = list(t.shape)
    if t.is_floating_point():
        if wire == _DT.DTYPE_FLOAT16:
            data = t.to(torch.float16).numpy().tobytes()
        elif wire == _DT.DTYPE_BFLOAT16:
            # numpy has no bfloat16: send its bits.
            data = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            data = t.to(torch.float32).numpy().tobytes()
        return tensor_pb2.Tensor(dtype=wire, shape=shape, data=data)
    if t.dtype == torch.int64:
        return tensor_pb2.Tensor(dtype=_DT.DTYPE_INT64, shape=shape, data=t.numpy().tobytes())
    if t.dtype == torch.int32:
        return tensor_pb2.Tensor(dtype=_DT.DTYPE_INT32, shape=shape, data=t.numpy().tobytes())
    if t.dtype == torch.bool:
        return tensor_pb2.Tensor(dtype=_DT.DTYPE_BOOL, shape=shape, data=t.numpy().tobytes())
    raise TypeError(f"moehost: cannot send a {t.dtype} tensor")


_NUMPY = {
    _DT.DTYPE_FLOAT32: np.float32,
    _DT.DTYPE_FLOAT16: np.float16,
    _DT.DTYPE_INT32: np.int32,
    _DT.DTYPE_INT64: np.int64,
    _DT.DTYPE_BOOL: np.bool_,
}


def _from_wire(pb: tensor_pb2.Tensor) -> torch.Tensor:
    """Decodes a tensor; 16-bit floats are widened to float32."""
    shape = tuple(pb.shape)
    if pb.dtype == _DT.DTYPE_BFLOAT16:
        bits = np.frombuffer(pb.data, dtype=np.int16).copy()
        return torch.from_numpy(bits).view(torch.bfloat16).float().reshape(shape)
    if pb.dtype not in _NUMPY:
        raise ValueError(f"moehost: the server sent dtype {pb.dtype}")
    t = torch.from_numpy(np.frombuffer(pb.data, dtype=_NUMPY[pb.dtype]).copy()).reshape(shape)
    return t.float() if pb.dtype == _DT.DTYPE_FLOAT16 else t


class _RemoteCall(torch.autograd.Function):
    """Forward and Backward of one expert, as one autograd node.

    The first argument is a dummy tensor that requires grad, so that
    backward runs (and the server trains) even when no input requires
    grad, as in hivemind's _RemoteModuleCall.
    """

    @staticmethod
    def forward(ctx, dummy: torch.Tensor, expert: "RemoteExpert", *inputs: torch.Tensor):
        ctx.expert = expert
        ctx.save_for_backward(*inputs)
        return tuple(expert._call_forward(inputs))

    @staticmethod
    def backward(ctx, *grad_outputs: torch.Tensor):
        inputs = ctx.saved_tensors
        grads = ctx.expert._call_backward(inputs, grad_outputs)
        grads = [g.to(x.device, x.dtype) if x.is_floating_point() else None for g, x in zip(grads, inputs)]
        return (None, None, *grads)


class RemoteExpert(nn.Module):
    """An expert on a moehost server, used like a local module.

    ``RemoteExpert("ffn.0", "127.0.0.1:7700")(x)`` runs the expert's
    forward on the server; ``loss.backward()`` then calls the server's
    Backward, which returns the input gradients and applies one optimizer
    step to the expert's parameters. So every backward trains the server's
    expert once: accumulating gradients over several backward calls before
    your optimizer step trains the expert that many times.

    ``wire_dtype`` (torch.float32, torch.float16 or torch.bfloat16) is the
    dtype float tensors travel in, both ways; the half ones halve the bytes
    of every call, at their format's precision. The server computes in
    float32, and outputs are float32 either way.

    ``max_message_bytes`` raises grpcio's 4 MiB message limit to the
    server's (``--max-request-bytes``, 256 MiB by default).

    ``token`` goes with every call as ``authorization: Bearer <token>``: a
    tenant's (``moehost tenant add``), with which it may train its own
    experts, or the server's admin token. None (the default) takes
    ``$MOEHOST_TOKEN``; "" sends none.

    ``endpoint`` is "host:port" or an http:// URL for a plaintext server,
    and an https:// URL (``moehost serve --tls-cert``) for TLS, with the
    server's certificate checked against the CA certificates of
    ``ca_file`` (PEM; default ``$MOEHOST_CA_FILE``, else grpcio's roots).
    """

    def __init__(
        self,
        uid: str,
        endpoint: str = "127.0.0.1:7700",
        *,
        wire_dtype: torch.dtype = torch.float32,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        timeout: Optional[float] = None,
        channel: Optional[grpc.Channel] = None,
        token: Optional[str] = None,
        ca_file: Optional[str] = None,
    ):
        super().__init__()
        if wire_dtype not in wire_dtypes:
            raise ValueError(f"moehost: wire_dtype {wire_dtype}: want torch.float32, torch.float16 or torch.bfloat16")
        self.uid, self.endpoint, self.timeout = uid, endpoint, timeout
        self._wire = wire_dtypes[wire_dtype]
        if channel is None:
            channel = open_channel(endpoint, max_message_bytes, ca_file)
        self._channel = channel
        self._metadata = auth_metadata(token)
        self._stub = expert_pb2_grpc.ExpertServiceStub(channel)
        self._dummy = nn.Parameter(torch.empty(0), requires_grad=True)
        self._info = None

    @property
    def info(self) -> expert_pb2.ExpertInfo:
        """The expert's description (schema, digest, stats), fetched once."""
        if self._info is None:
            self._info = self.fetch_info()
        return self._info

    def fetch_info(self) -> expert_pb2.ExpertInfo:
        """Fetches the expert's description now, with fresh stats."""
        return self._call(self._stub.Info, expert_pb2.InfoRequest(uid=self.uid))

    def fetch_parameters(self) -> Tuple[int, Dict[str, torch.Tensor]]:
        """Fetches the expert's parameters now, through the server's
        CheckpointService.GetParameters: the optimizer steps behind them,
        and the tensors by the names the module declares (for the ffn
        expert, those of hivemind's FeedforwardBlock's state_dict). The
        server answers loopback callers, callers with its admin token,
        and, under --tenants, the expert's owner.
        """
        from moehost.v1 import checkpoint_pb2, checkpoint_pb2_grpc

        stub = checkpoint_pb2_grpc.CheckpointServiceStub(self._channel)
        res = self._call(stub.GetParameters, checkpoint_pb2.CheckpointServiceGetParametersRequest(uid=self.uid))
        return res.step, {p.name: _from_wire(p.tensor) for p in res.parameters}

    def forward(self, *inputs: torch.Tensor):
        outputs = _RemoteCall.apply(self._dummy, self, *inputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def _call_forward(self, inputs) -> Tuple[torch.Tensor, ...]:
        req = expert_pb2.ForwardRequest(uid=self.uid, inputs=[_to_wire(x, self._wire) for x in inputs], output_dtype=self._wire)
        res = self._call(self._stub.Forward, req)
        device = inputs[0].device if inputs else torch.device("cpu")
        return tuple(_from_wire(t).to(device) for t in res.outputs)

    def _call_backward(self, inputs, grad_outputs) -> Tuple[torch.Tensor, ...]:
        req = expert_pb2.BackwardRequest(
            uid=self.uid,
            inputs=[_to_wire(x, self._wire) for x in inputs],
            grad_outputs=[_to_wire(g, self._wire) for g in grad_outputs],
            grad_input_dtype=self._wire,
        )
        res = self._call(self._stub.Backward, req)
        return tuple(_from_wire(t) for t in res.grad_inputs)

    def _call(self, method, req):
        """Calls method, raising a typed moehost error with the server's
        message instead of grpcio's."""
        try:
            return method(req, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def extra_repr(self) -> str:
        return f"uid={self.uid!r}, endpoint={self.endpoint!r}"
