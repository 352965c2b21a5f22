import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear layer, plus a second learned bias, then ReLU, then a constant scale.

    out = scale * relu(inp @ W^T + b_linear + shift)
    """

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features)
        self.shift = nn.Parameter(0.1 * torch.randn(out_features))
        self.scale = scale

    def forward(self, inp):
        h = self.proj(inp)
        h = h + self.shift
        h = torch.relu(h)
        return h * self.scale


n_samples = 64  # gpu: 16384
in_features = 256  # gpu: 2048
out_features = 384  # gpu: 4096
scale = 2.5


def get_inputs():
    return [torch.randn(n_samples, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
