"""PyTorch client of moehost, the hivemind-style expert server.

``RemoteExpert`` is an ``nn.Module`` whose forward calls the server's
``Forward`` and whose backward calls its ``Backward``, over gRPC. Every
backward is an optimizer step on the server, as in hivemind.
"""

from moehost.expert import DEFAULT_MAX_MESSAGE_BYTES, RemoteExpert, wire_dtypes

__all__ = ["RemoteExpert", "DEFAULT_MAX_MESSAGE_BYTES", "wire_dtypes"]
