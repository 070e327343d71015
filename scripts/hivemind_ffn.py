"""hivemind's ffn expert in PyTorch, shared by the scripts that compare
moehost with it (interop_ffn.py, bench_torch_ffn.py).

FeedforwardBlock is hivemind/moe/server/layers/common.py's:
LayerNorm(x + Linear(4h→h)(gelu_fast(Linear(h→4h)(x)))), LayerNorm eps 1e-12.
"""
import torch
from torch import nn


def gelu_fast(x):
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


class FeedforwardBlock(nn.Module):
    """hivemind/moe/server/layers/common.py's FeedforwardBlock."""

    def __init__(self, hid_dim):
        super().__init__()
        self.ffn = nn.Linear(hid_dim, 4 * hid_dim)
        self.ffn_output = nn.Linear(4 * hid_dim, hid_dim)
        self.layer_norm = nn.LayerNorm(hid_dim, eps=1e-12)

    def forward(self, x):
        ffn_output = self.ffn(x)
        ffn_output = gelu_fast(ffn_output)
        ffn_output = self.ffn_output(ffn_output)
        return self.layer_norm(x + ffn_output)
