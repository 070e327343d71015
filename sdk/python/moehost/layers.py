"""The example experts' PyTorch modules, whose state_dicts are the
parameters moehost's experts declare: load a checkpoint or an export into
one and it computes the expert's Forward.

FeedforwardBlock is hivemind's (hivemind/moe/server/layers/common.py) and
the example expert ``ffn`` (and ``ffn-c``):
LayerNorm(x + Linear(4h→h)(gelu_tanh(Linear(h→4h)(x)))), LayerNorm eps 1e-12.

TransformerBlock is hivemind's ``transformer`` expert (its
TransformerEncoderLayer) and the example expert ``transformer``: a post-norm
encoder layer with exact (erf) GELU, dim_feedforward 4h, LayerNorm eps 1e-5
and no dropout, on batch-first x [batch, seq_len, h] with a key padding mask
[batch, seq_len] (true at padding).
"""

import torch
import torch.nn.functional as F
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


class TransformerBlock(nn.Module):
    """The ``transformer`` example expert, whose state_dict is the one the
    expert declares (self_attn.in_proj_weight, linear1.weight, norm1.weight,
    ...)::

        b = norm1(x + self_attn(x, key_padding_mask))
        y = norm2(b + linear2(gelu(linear1(b))))

    ``num_heads`` is the expert's config value (16 by default), and must
    divide ``hid_dim``.
    """

    def __init__(self, hid_dim: int, num_heads: int = 16):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(hid_dim, num_heads, dropout=0.0, batch_first=True)
        self.linear1 = nn.Linear(hid_dim, 4 * hid_dim)
        self.linear2 = nn.Linear(4 * hid_dim, hid_dim)
        self.norm1 = nn.LayerNorm(hid_dim, eps=1e-5)
        self.norm2 = nn.LayerNorm(hid_dim, eps=1e-5)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
        a, _ = self.self_attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)
        b = self.norm1(x + a)
        return self.norm2(b + self.linear2(F.gelu(self.linear1(b))))
