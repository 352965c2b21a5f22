import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix-vector product: (M, K) @ (K, 1) -> (M, 1); memory-bound, every matrix element read once."""

    def __init__(self):
        super().__init__()

    def forward(self, mat, vec):
        return torch.matmul(mat, vec)


m_rows = 256  # gpu: 16384
k_dim = 1000  # gpu: 65536


def get_inputs():
    return [torch.randn(m_rows, k_dim), torch.randn(k_dim, 1)]


def get_init_inputs():
    return []
