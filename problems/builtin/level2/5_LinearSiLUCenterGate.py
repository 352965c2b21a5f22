import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear projection, SiLU, subtract each row's mean, then multiply by a learned gate.

    out = (s - mean_j s) * sigmoid(g), where s = silu(x @ W^T + b) and g is a learned vector.
    """

    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)
        self.gate_logits = nn.Parameter(torch.randn(d_out))

    def forward(self, x):
        s = F.silu(self.lin(x))
        s = s - s.mean(dim=-1, keepdim=True)
        return s * torch.sigmoid(self.gate_logits)


batch = 96  # gpu: 12288
d_in = 200  # gpu: 2048
d_out = 300  # gpu: 4096


def get_inputs():
    return [2.0 * torch.randn(batch, d_in)]


def get_init_inputs():
    return [d_in, d_out]
