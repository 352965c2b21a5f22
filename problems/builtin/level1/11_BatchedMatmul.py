import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched matrix product: (B, M, K) @ (B, K, N) -> (B, M, N), an independent product per batch entry."""

    def __init__(self):
        super().__init__()

    def forward(self, lhs, rhs):
        return torch.bmm(lhs, rhs)


batch = 4  # gpu: 32
m_rows = 64  # gpu: 1024
k_dim = 96  # gpu: 2048
n_cols = 80  # gpu: 1024


def get_inputs():
    return [torch.randn(batch, m_rows, k_dim), torch.randn(batch, k_dim, n_cols)]


def get_init_inputs():
    return []
