import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Square projection, exact (erf) GELU, then a skip connection back to the input.

    out = x + gelu(x @ W^T + b), with W of shape (width, width).
    """

    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + F.gelu(self.fc(x))


n_rows = 128  # gpu: 16384
width = 320  # gpu: 3072


def get_inputs():
    return [torch.randn(n_rows, width)]


def get_init_inputs():
    return [width]
