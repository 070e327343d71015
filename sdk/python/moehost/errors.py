"""Typed errors of the moehost client, carrying the server's message.

grpcio raises ``grpc.RpcError`` (an ``_InactiveRpcError``) whose text is a
dump of the call; these say what the server said, and callers branch on
the class: ``except moehost.NotFoundError``.
"""

import grpc


class MoehostError(grpc.RpcError, RuntimeError):
    """A call to a moehost server failed. ``code()`` is the gRPC status
    code (``grpc.StatusCode``) and ``message`` (also ``details()``) the
    server's message; it is still a ``grpc.RpcError``, so older
    ``except grpc.RpcError`` code keeps working."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name.lower()}: {message}")
        self._code, self.message = code, message

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self.message


class NotFoundError(MoehostError):
    """No such expert (or checkpoint) on the server."""


class InvalidArgumentError(MoehostError):
    """The request does not fit: a tensor's shape or dtype, a config key."""


class UnavailableError(MoehostError):
    """The server cannot be reached, or is shutting down."""


class UnauthenticatedError(MoehostError):
    """The call needs a token, or the token given is unknown."""


class PermissionDeniedError(MoehostError):
    """The token is valid but may not do this: another tenant's module or
    expert, a uid outside the tenant's prefixes."""


class ResourceExhaustedError(MoehostError):
    """A cap is reached: the upload cap, a tenant's quota, a full queue."""


class FailedPreconditionError(MoehostError):
    """The server's state forbids the call: deleting a module that an
    expert still runs."""


_BY_CODE = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
}


def from_rpc_error(e: grpc.RpcError) -> MoehostError:
    """The typed error for a failed gRPC call."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    details = details or ""
    if code == grpc.StatusCode.UNAVAILABLE and "certificate verify failed" in details:
        details += ("; the server's certificate is signed by a CA this client does not trust: "
                    "give the CA's certificate with ca_file= or $MOEHOST_CA_FILE")
    return _BY_CODE.get(code, MoehostError)(code, details)


def grpc_target(endpoint: str) -> str:
    """An endpoint as a gRPC target: "host:port" as it is, and the
    "http://host:port" URLs that the CLI and discovery print without the
    scheme."""
    for scheme in ("http://", "https://"):
        if endpoint.startswith(scheme):
            return endpoint[len(scheme):].rstrip("/")
    return endpoint
