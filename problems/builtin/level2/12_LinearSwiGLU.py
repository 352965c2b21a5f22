import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Two linear layers of the same input, one through SiLU gating the other (SwiGLU).

    out = silu(x @ Wg^T + bg) * (x @ Wu^T + bu)
    """

    def __init__(self, d_in, d_hidden):
        super().__init__()
        self.gate = nn.Linear(d_in, d_hidden)
        self.up = nn.Linear(d_in, d_hidden)

    def forward(self, x):
        return F.silu(self.gate(x)) * self.up(x)


batch = 64  # gpu: 4096
d_in = 96  # gpu: 4096
d_hidden = 160  # gpu: 4096


def get_inputs():
    return [2.0 * torch.randn(batch, d_in)]


def get_init_inputs():
    return [d_in, d_hidden]
