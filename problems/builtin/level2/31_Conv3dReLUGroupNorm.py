import torch
import torch.nn as nn


class Model(nn.Module):
    """3D convolution (kernel 3, padding 1), ReLU, then group normalisation with a learned affine.

    Input (N, C_in, D, H, W) -> (N, C_out, D, H, W).
    """

    def __init__(self, c_in, c_out, groups):
        super().__init__()
        self.conv = nn.Conv3d(c_in, c_out, 3, padding=1)
        self.norm = nn.GroupNorm(groups, c_out)

    def forward(self, vol):
        y = self.conv(vol)
        y = torch.relu(y)
        return self.norm(y)


n_vols = 2  # gpu: 16
c_in = 4  # gpu: 16
c_out = 8  # gpu: 32
depth = 8  # gpu: 32
side = 12  # gpu: 64
groups = 4  # gpu: 8


def get_inputs():
    return [torch.randn(n_vols, c_in, depth, side, side)]


def get_init_inputs():
    return [c_in, c_out, groups]
