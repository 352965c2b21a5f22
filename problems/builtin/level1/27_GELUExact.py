import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Exact (erf) GELU elementwise: out = 0.5 * v * (1 + erf(v / sqrt(2)))."""

    def __init__(self):
        super().__init__()

    def forward(self, v):
        # v: (n_tokens, width) float32; same shape out.
        return F.gelu(v)


n_tokens = 96  # gpu: 8192
width = 1024  # gpu: 65536


def get_inputs():
    return [2.0 * torch.randn(n_tokens, width)]


def get_init_inputs():
    return []
