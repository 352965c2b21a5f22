import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, maxout (the max over each group of `pieces` adjacent outputs), then softplus.

    Input (B, in_features) -> linear (B, out_features * pieces) -> max over pieces (B, out_features) -> softplus.
    """

    def __init__(self, in_features, out_features, pieces):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features * pieces)
        self.out_features = out_features
        self.pieces = pieces

    def forward(self, x):
        h = self.proj(x)
        h = h.view(x.shape[0], self.out_features, self.pieces).amax(dim=-1)
        return F.softplus(h)


batch = 64  # gpu: 4096
in_features = 128  # gpu: 2048
out_features = 96  # gpu: 2048
pieces = 4


def get_inputs():
    return [2.0 * torch.randn(batch, in_features)]


def get_init_inputs():
    return [in_features, out_features, pieces]
