import torch
import torch.nn as nn


class Model(nn.Module):
    """Rectangular product with the second operand stored transposed: (M, K) @ (N, K)^T -> (M, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, lhs, rhs_t):
        # lhs: (M, K); rhs_t: (N, K), row-major, so each output column is a dot product of two contiguous rows.
        return torch.matmul(lhs, rhs_t.t())


m_rows = 96  # gpu: 2048
n_cols = 136  # gpu: 6144
k_dim = 200  # gpu: 4096


def get_inputs():
    return [torch.randn(m_rows, k_dim), torch.randn(n_cols, k_dim)]


def get_init_inputs():
    return []
