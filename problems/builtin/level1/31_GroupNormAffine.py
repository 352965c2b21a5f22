import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Group normalisation of an NCHW batch: channels split into groups, each (sample, group) normalised.

    Statistics (mean, biased variance) are taken over the group's channels and all spatial positions;
    the result is scaled and shifted per channel by learned weight and bias of shape (channels,).
    """

    def __init__(self, channels, groups, eps):
        super().__init__()
        self.groups = groups
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.5 * torch.randn(channels))
        self.bias = nn.Parameter(0.5 * torch.randn(channels))

    def forward(self, img):
        # img: (batch, channels, height, width) -> same shape.
        return F.group_norm(img, self.groups, self.weight, self.bias, eps=self.eps)


batch = 4  # gpu: 64
channels = 32  # gpu: 256
groups = 8  # gpu: 32
side = 16  # gpu: 160
eps = 1e-5


def get_inputs():
    return [1.0 + 2.0 * torch.randn(batch, channels, side, side)]


def get_init_inputs():
    return [channels, groups, eps]
