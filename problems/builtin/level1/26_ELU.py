import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ELU elementwise with a fixed alpha: out = v where v > 0, else alpha * (exp(v) - 1)."""

    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, hidden):
        # hidden: (batch, seq_len, width) float32; same shape out.
        return F.elu(hidden, alpha=self.alpha)


batch = 4  # gpu: 32
seq_len = 64  # gpu: 4096
width = 384  # gpu: 4096
alpha = 1.3


def get_inputs():
    return [2.0 * torch.randn(batch, seq_len, width)]


def get_init_inputs():
    return [alpha]
