import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Standardise each column over the rows (mean 0, variance 1, biased variance), then ELU.

    A batch-norm-style normalisation over dim 0 of an (N, D) tensor, with no affine -> (N, D).
    """

    def __init__(self, eps):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        mean = x.mean(dim=0, keepdim=True)
        var = x.var(dim=0, unbiased=False, keepdim=True)
        y = (x - mean) / torch.sqrt(var + self.eps)
        return F.elu(y)


rows = 256  # gpu: 32768
cols = 192  # gpu: 8192
eps = 1e-5


def get_inputs():
    return [torch.randn(rows, cols) * 2.0 + 0.5]


def get_init_inputs():
    return [eps]
