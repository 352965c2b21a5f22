import torch
import torch.nn as nn


class Model(nn.Module):
    """Dense product of two small rectangular matrices: (M, K) @ (K, N) -> (M, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, lhs, rhs):
        return lhs @ rhs


M_DIM = 160  # gpu: 16384
K_DIM = 96  # gpu: 1024
N_DIM = 224  # gpu: 8192


def get_inputs():
    lhs = torch.randn(M_DIM, K_DIM)
    rhs = torch.randn(K_DIM, N_DIM)
    return [lhs, rhs]


def get_init_inputs():
    return []
