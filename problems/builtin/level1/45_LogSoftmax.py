import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Log-softmax along the last axis of a 2-D matrix: x - logsumexp(x) per row, computed stably."""

    def __init__(self):
        super().__init__()

    def forward(self, scores):
        return F.log_softmax(scores, dim=-1)


n_rows = 128  # gpu: 163840
n_cols = 1000  # gpu: 4096


def get_inputs():
    return [3.0 * torch.randn(n_rows, n_cols)]


def get_init_inputs():
    return []
