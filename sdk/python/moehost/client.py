"""Client: a moehost server's ServerService and ModuleService, the calls
that the CLI's ``moehost upload``, ``deploy``, ``undeploy``, ``modules``
and ``experts`` make."""

import datetime
import os
from typing import IO, Iterator, List, Mapping, Optional, Union

import grpc

from moehost.errors import from_rpc_error
from moehost.expert import DEFAULT_MAX_MESSAGE_BYTES, TOKEN_ENV, RemoteExpert, auth_metadata, open_channel
from moehost.v1 import expert_pb2, expert_pb2_grpc, module_pb2, module_pb2_grpc, server_pb2, server_pb2_grpc

# UPLOAD_CHUNK_BYTES is the size of each UploadModuleRequest's chunk: the
# most the server takes in one message.
UPLOAD_CHUNK_BYTES = 1 << 20

# ACCESSES are the names deploy's forward_access and backward_access take,
# as the CLI's --forward-access and --backward-access spell them.
ACCESSES = {
    "public": module_pb2.ACCESS_PUBLIC,
    "owner": module_pb2.ACCESS_OWNER,
    "tenants": module_pb2.ACCESS_TENANTS,
}

# A module to upload: a path, its bytes, or a binary file open for reading.
ModuleSource = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, IO[bytes]]


class Client:
    """A moehost server's description and its tenants' modules and experts.

    ``Client("127.0.0.1:7700", token=token)`` calls the server at
    endpoint ("host:port", or the ``http://`` URLs the CLI prints; an
    ``https://`` URL for a server with ``--tls-cert``, whose certificate
    is checked against ``ca_file``, PEM, default ``$MOEHOST_CA_FILE``,
    else grpcio's roots):

    - ``server_info()`` (ServerService): version, uptime, devices,
      addresses, DHT peers;
    - ``experts()`` (ExpertService.ListExperts) and ``expert(uid)``, a
      ``RemoteExpert`` on the same connection;
    - ``upload_module``, ``modules``, ``delete_module``, ``deploy`` and
      ``undeploy`` (ModuleService): served only by a server started with
      ``--tenants``, and only with a tenant's (or the operator's) token.

    ``token`` goes with every call as ``authorization: Bearer <token>``:
    None (the default) takes ``$MOEHOST_TOKEN``; "" sends none.
    ``timeout`` (seconds) bounds each call, ``max_message_bytes`` raises
    grpcio's 4 MiB message limit (to 256 MiB by default), and ``channel``
    uses your own ``grpc.Channel``, which ``close()`` then leaves open.
    A failed call raises ``moehost.MoehostError`` (or its subclass for the
    code, e.g. ``UnauthenticatedError``) with the server's message.
    """

    def __init__(
        self,
        endpoint: str = "127.0.0.1:7700",
        *,
        token: Optional[str] = None,
        timeout: Optional[float] = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        channel: Optional[grpc.Channel] = None,
        ca_file: Optional[str] = None,
    ):
        self.endpoint, self.timeout = endpoint, timeout
        self._token = os.environ.get(TOKEN_ENV, "") if token is None else token
        self._metadata = auth_metadata(self._token)
        self._own_channel = channel is None
        self._channel = open_channel(endpoint, max_message_bytes, ca_file) if channel is None else channel
        self._server = server_pb2_grpc.ServerServiceStub(self._channel)
        self._modules = module_pb2_grpc.ModuleServiceStub(self._channel)
        self._experts = expert_pb2_grpc.ExpertServiceStub(self._channel)
        m = self._modules
        self._module_methods = (m.UploadModule, m.ListModules, m.DeleteModule, m.DeployExpert, m.UndeployExpert)

    def close(self) -> None:
        """Closes the channel, unless it was given."""
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"moehost.Client({self.endpoint!r})"

    def server_info(self) -> server_pb2.GetServerInfoResponse:
        """The server's version, start time and uptime, devices, listen and
        announce addresses, DHT peer id, addresses and records, expert
        count and memory limit (ServerService.GetServerInfo)."""
        return self._call(self._server.GetServerInfo, server_pb2.GetServerInfoRequest())

    def experts(self) -> List[expert_pb2.ExpertInfo]:
        """Every expert the server hosts, with its owner, module digest,
        schema and health (ExpertService.ListExperts)."""
        return list(self._call(self._experts.ListExperts, expert_pb2.ListExpertsRequest()).experts)

    def expert(self, uid: str, **kwargs) -> RemoteExpert:
        """A ``RemoteExpert`` for uid on this client's channel, with its token
        unless ``token=`` says otherwise; kwargs go to ``RemoteExpert``."""
        kwargs.setdefault("token", self._token)
        kwargs.setdefault("timeout", self.timeout)
        return RemoteExpert(uid, self.endpoint, channel=self._channel, **kwargs)

    def upload_module(self, module: ModuleSource, *, name: Optional[str] = None) -> module_pb2.ModuleInfo:
        """Uploads a WebAssembly module and returns it as stored, with its
        ``digest`` ("sha256:<hex>") for ``deploy``.

        module is a path, the module's bytes, or a binary file open for
        reading. It goes as a stream of chunks of ``UPLOAD_CHUNK_BYTES``
        (1 MiB, the most the server takes in one message), the first
        declaring its name (default: a path's base name) and, where it is
        known, its length, so that a server whose cap (``--max-upload-bytes``)
        it exceeds refuses it (``ResourceExhaustedError``) before any byte
        is sent. The server validates the module before it keeps it (an
        invalid one is ``InvalidArgumentError``, saying why); uploading the
        same bytes again returns the same digest.
        """
        if isinstance(module, (str, os.PathLike)):
            path = os.fspath(module)
            if name is None:
                name = os.path.basename(path)
            size = os.stat(path).st_size  # a missing file fails here, before any call
            requests = _upload_requests(_file_chunks(path), name, size)
        elif isinstance(module, (bytes, bytearray, memoryview)):
            data = memoryview(module).cast("B")
            chunks = (data[i:i + UPLOAD_CHUNK_BYTES].tobytes() for i in range(0, len(data), UPLOAD_CHUNK_BYTES))
            requests = _upload_requests(chunks, name or "", len(data))
        elif hasattr(module, "read"):
            if name is None and isinstance(getattr(module, "name", None), str):
                name = os.path.basename(module.name)
            requests = _upload_requests(_reader_chunks(module), name or "", _remaining(module))
        else:
            raise TypeError(f"moehost: upload_module takes a path, bytes or a binary file, not {type(module).__name__}")
        return self._call(self._modules.UploadModule, requests).module

    def modules(self) -> List[module_pb2.ModuleInfo]:
        """The caller's modules, sorted by digest, each with the uids of
        the experts that run it (ModuleService.ListModules)."""
        return list(self._call(self._modules.ListModules, module_pb2.ListModulesRequest()).modules)

    def delete_module(self, module: Union[str, module_pb2.ModuleInfo]) -> None:
        """Deletes one of the caller's modules, by digest or as
        ``upload_module`` returned it. A module that an expert still runs
        is kept: ``FailedPreconditionError``."""
        self._call(self._modules.DeleteModule, module_pb2.DeleteModuleRequest(digest=_digest(module)))

    def deploy(
        self,
        experts: str,
        module: Union[str, module_pb2.ModuleInfo],
        *,
        config: Optional[Mapping[str, int]] = None,
        optimizer: Optional[Union[Mapping[str, object], module_pb2.OptimizerConfig]] = None,
        batching: Optional[Mapping[str, object]] = None,
        limits: Optional[Mapping[str, object]] = None,
        forward_access: Optional[str] = None,
        backward_access: Optional[str] = None,
    ) -> List[str]:
        """Deploys one of the caller's modules as experts and returns their
        uids, sorted (ModuleService.DeployExpert).

        experts is one uid ("alice.ffn.0") or a pattern in hivemind's
        syntax ("alice.ffn.[0:4]"), under the caller's prefixes; module a
        digest, or what ``upload_module`` returned. ``config`` holds the
        module's integer settings (``{"hidden_dim": 1024}``), the keys its
        ``moe_init`` reads. ``optimizer`` takes OptimizerConfig's fields
        (``{"name": "sgd", "lr": 0.1}``: name, lr, momentum, weight_decay,
        clip_grad_norm, scheduler, num_warmup_steps, num_training_steps);
        ``batching`` max_batch_size, min_batch_size, max_wait (seconds or a
        timedelta) and queue_size; ``limits`` call_timeout (seconds or a
        timedelta), bytes_per_call, param_bytes and memory_pages. Left out,
        each takes the server's settings, within the tenant's caps.
        ``forward_access`` and ``backward_access`` say who may call:
        "public", "owner" or "tenants" (default: public and owner).
        """
        req = module_pb2.DeployExpertRequest(experts=experts, module_digest=_digest(module), config=dict(config or {}))
        if optimizer is not None:
            req.optimizer.CopyFrom(optimizer if isinstance(optimizer, module_pb2.OptimizerConfig)
                                   else module_pb2.OptimizerConfig(**optimizer))
        if batching is not None:
            req.batching.CopyFrom(_message(module_pb2.BatchLimits, batching, ("max_wait",)))
        if limits is not None:
            req.limits.CopyFrom(_message(module_pb2.ExpertLimits, limits, ("call_timeout",)))
        for field, access in (("forward_access", forward_access), ("backward_access", backward_access)):
            if access is not None:
                if access.lower() not in ACCESSES:
                    raise ValueError(f"moehost: {field} {access!r} is not public, owner or tenants")
                setattr(req, field, ACCESSES[access.lower()])
        return list(self._call(self._modules.DeployExpert, req).uids)

    def undeploy(self, experts: str) -> List[str]:
        """Stops serving some of the caller's experts (a uid or a pattern)
        and returns their uids, sorted. Their queued requests fail as
        UNAVAILABLE (ModuleService.UndeployExpert)."""
        return list(self._call(self._modules.UndeployExpert, module_pb2.UndeployExpertRequest(experts=experts)).uids)

    def _call(self, method, req):
        """Calls method, raising a typed moehost error with the server's
        message instead of grpcio's."""
        try:
            return method(req, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            err = from_rpc_error(e)
        if err.code() == grpc.StatusCode.UNIMPLEMENTED and method in self._module_methods:
            err = type(err)(err.code(), f"{err.message}: this server serves no ModuleService (it does when started with --tenants)")
        raise err from None


def _upload_requests(chunks: Iterator[bytes], name: str, size: Optional[int]) -> Iterator[module_pb2.UploadModuleRequest]:
    """The upload stream: the first message sets name and size_bytes (when
    known) and carries the first chunk, if any; the others one chunk each."""
    first = module_pb2.UploadModuleRequest(name=name)
    if size is not None:
        first.size_bytes = size
    for chunk in chunks:
        if first is not None:
            first.chunk = chunk
            yield first
            first = None
        else:
            yield module_pb2.UploadModuleRequest(chunk=chunk)
    if first is not None:
        yield first  # an empty module: the server says so


def _file_chunks(path: str) -> Iterator[bytes]:
    """path's bytes in chunks; the file is open only while they are read."""
    with open(path, "rb") as f:
        yield from _reader_chunks(f)


def _reader_chunks(f: IO[bytes]) -> Iterator[bytes]:
    while True:
        chunk = f.read(UPLOAD_CHUNK_BYTES)
        if not chunk:
            return
        yield bytes(chunk)


def _remaining(f: IO[bytes]) -> Optional[int]:
    """The bytes left in a seekable file, or None."""
    try:
        if not f.seekable():
            return None
        here = f.tell()
        end = f.seek(0, os.SEEK_END)
        f.seek(here)
        return end - here
    except (AttributeError, OSError):
        return None


def _digest(module: Union[str, module_pb2.ModuleInfo]) -> str:
    return module.digest if isinstance(module, module_pb2.ModuleInfo) else module


def _message(cls, fields: Mapping[str, object], durations):
    """cls built from fields, whose durations (seconds or timedeltas) go as
    google.protobuf.Duration."""
    msg = cls()
    for key, value in fields.items():
        if key in durations:
            if isinstance(value, datetime.timedelta):
                getattr(msg, key).FromTimedelta(value)
            else:
                getattr(msg, key).FromNanoseconds(round(value * 1e9))
        else:
            setattr(msg, key, value)
    return msg


__all__ = ["Client", "UPLOAD_CHUNK_BYTES", "ACCESSES"]
