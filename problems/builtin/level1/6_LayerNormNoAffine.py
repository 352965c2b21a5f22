import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Layer normalisation over the last axis with no learned scale or shift.

    Each row is shifted to zero mean and divided by sqrt(biased variance + eps).
    """

    def __init__(self, hidden, eps):
        super().__init__()
        self.hidden = hidden
        self.eps = eps

    def forward(self, acts):
        # acts: (tokens, hidden) -> same shape.
        return F.layer_norm(acts, (self.hidden,), eps=self.eps)


tokens = 120  # gpu: 131072
hidden = 512  # gpu: 4096
eps = 1e-5


def get_inputs():
    # A non-zero offset and scale, so the normalisation actually does something.
    return [1.5 + 4.0 * torch.randn(tokens, hidden)]


def get_init_inputs():
    return [hidden, eps]
