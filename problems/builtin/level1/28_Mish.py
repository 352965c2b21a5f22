import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Mish elementwise on a flat vector: out = v * tanh(softplus(v)), softplus(v) = log(1 + exp(v))."""

    def __init__(self):
        super().__init__()

    def forward(self, v):
        # v: (n_elements,) float32; same shape out.
        return F.mish(v)


n_elements = 150000  # gpu: 512 * 1024 * 1024


def get_inputs():
    return [3.0 * torch.randn(n_elements)]


def get_init_inputs():
    return []
