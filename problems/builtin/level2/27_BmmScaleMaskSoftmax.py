import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched scores q @ k^T, scaled, plus an additive mask, then a softmax over the keys.

    q: (B, M, D), k: (B, N, D), mask: (M, N) added to every batch's scores -> (B, M, N) probabilities.
    """

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, q, k, mask):
        scores = torch.bmm(q, k.transpose(1, 2))
        scores = scores * self.scale
        scores = scores + mask
        return torch.softmax(scores, dim=-1)


batch = 4  # gpu: 64
n_queries = 48  # gpu: 2048
n_keys = 72  # gpu: 2048
head_dim = 32  # gpu: 64


def get_inputs():
    q = torch.randn(batch, n_queries, head_dim)
    k = torch.randn(batch, n_keys, head_dim)
    mask = torch.randn(n_queries, n_keys)
    return [q, k, mask]


def get_init_inputs():
    return [head_dim**-0.5]
