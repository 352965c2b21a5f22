import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """RMS normalisation over the last axis: x / sqrt(mean(x^2) + eps) times a learned per-feature scale.

    No mean is subtracted; weight has shape (hidden,) and is initialised away from 1.
    """

    def __init__(self, hidden, eps):
        super().__init__()
        self.hidden = hidden
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.5 * torch.randn(hidden))

    def forward(self, acts):
        # acts: (tokens, hidden) -> same shape.
        return F.rms_norm(acts, (self.hidden,), self.weight, eps=self.eps)


tokens = 96  # gpu: 262144
hidden = 768  # gpu: 2048
eps = 1e-6


def get_inputs():
    return [3.0 * torch.randn(tokens, hidden)]


def get_init_inputs():
    return [hidden, eps]
