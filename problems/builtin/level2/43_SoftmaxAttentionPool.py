import torch
import torch.nn as nn


class Model(nn.Module):
    """Attention pooling: softmax of per-position scores over the sequence, then the weighted sum of values.

    scores: (B, L), values: (B, L, D) -> sum_l softmax(scores)[b, l] * values[b, l, :], (B, D).
    """

    def __init__(self):
        super().__init__()

    def forward(self, scores, values):
        weights = torch.softmax(scores, dim=1)
        return (weights.unsqueeze(-1) * values).sum(dim=1)


batch = 8  # gpu: 128
length = 256  # gpu: 4096
dim = 64  # gpu: 1024


def get_inputs():
    return [2.0 * torch.randn(batch, length), torch.randn(batch, length, dim)]


def get_init_inputs():
    return []
