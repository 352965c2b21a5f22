import torch
import torch.nn as nn


class Model(nn.Module):
    """A 3-D activation times a weight matrix: (B, S, K) @ (K, N) -> (B, S, N), the matrix shared by every row."""

    def __init__(self):
        super().__init__()

    def forward(self, acts, weight):
        return torch.matmul(acts, weight)


batch = 3  # gpu: 8
seq_len = 40  # gpu: 1024
k_dim = 64  # gpu: 4096
n_cols = 96  # gpu: 4096


def get_inputs():
    return [torch.randn(batch, seq_len, k_dim), torch.randn(k_dim, n_cols)]


def get_init_inputs():
    return []
