import torch
import torch.nn as nn


class Model(nn.Module):
    """Tall-skinny matrix times a short wide one: (M, K) @ (K, N) -> (M, N) with M >> N >> K (a low-rank product)."""

    def __init__(self):
        super().__init__()

    def forward(self, tall, wide):
        return torch.matmul(tall, wide)


m_rows = 4096  # gpu: 131072
k_dim = 16  # gpu: 128
n_cols = 48  # gpu: 2048


def get_inputs():
    return [torch.randn(m_rows, k_dim), torch.randn(k_dim, n_cols)]


def get_init_inputs():
    return []
