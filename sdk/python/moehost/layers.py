"""The example experts' PyTorch modules, whose state_dicts are the
parameters moehost's experts declare: load a checkpoint or an export into
one and it computes the expert's Forward.

FeedforwardBlock is hivemind's (hivemind/moe/server/layers/common.py) and
the example expert ``ffn`` (and ``ffn-c``):
LayerNorm(x + Linear(4h→h)(gelu_tanh(Linear(h→4h)(x)))), LayerNorm eps 1e-12.
"""

import torch
from torch import nn


def gelu_fast(x: torch.Tensor) -> torch.Tensor:
    """hivemind's gelu_fast: the tanh approximation of GELU."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


class FeedforwardBlock(nn.Module):
    """hivemind's FeedforwardBlock: the ``ffn`` example expert."""

    def __init__(self, hid_dim: int):
        super().__init__()
        self.ffn = nn.Linear(hid_dim, 4 * hid_dim)
        self.ffn_output = nn.Linear(4 * hid_dim, hid_dim)
        self.layer_norm = nn.LayerNorm(hid_dim, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(x + self.ffn_output(gelu_fast(self.ffn(x))))
