"""PyTorch client of moehost, the hivemind-style expert server.

``RemoteExpert`` is an ``nn.Module`` whose forward calls the server's
``Forward`` and whose backward calls its ``Backward``, over gRPC; ``RemoteMixtureOfExperts``
gates each sample to the k best experts of a grid found through a
server's DiscoveryService. Every backward is an optimizer step on the
server, as in hivemind. ``Client`` describes a server and manages a
tenant's modules and experts: upload, deploy, undeploy.
"""

from moehost.errors import (
    FailedPreconditionError, InvalidArgumentError, MoehostError, NotFoundError, PermissionDeniedError,
    ResourceExhaustedError, UnauthenticatedError, UnavailableError,
)
from moehost.expert import DEFAULT_MAX_MESSAGE_BYTES, RemoteExpert, wire_dtypes
from moehost.moe import KMinNotMetError, RemoteMixtureOfExperts
from moehost.client import Client

__all__ = [
    "RemoteExpert", "RemoteMixtureOfExperts", "KMinNotMetError", "DEFAULT_MAX_MESSAGE_BYTES", "wire_dtypes",
    "Client",
    "MoehostError", "NotFoundError", "InvalidArgumentError", "UnavailableError", "UnauthenticatedError",
    "PermissionDeniedError", "ResourceExhaustedError", "FailedPreconditionError",
]
