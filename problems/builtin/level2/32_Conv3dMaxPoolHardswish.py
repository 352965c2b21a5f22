import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """3D convolution (kernel 3, padding 1), 2x2x2 max pooling, then hardswish.

    Input (N, C_in, D, H, W) -> (N, C_out, D/2, H/2, W/2).
    """

    def __init__(self, c_in, c_out):
        super().__init__()
        self.conv = nn.Conv3d(c_in, c_out, 3, padding=1)

    def forward(self, vol):
        y = self.conv(vol)
        y = F.max_pool3d(y, 2)
        return F.hardswish(y)


n_vols = 2  # gpu: 16
c_in = 4  # gpu: 8
c_out = 8  # gpu: 32
depth = 8  # gpu: 32
side = 16  # gpu: 96


def get_inputs():
    return [2.0 * torch.randn(n_vols, c_in, depth, side, side)]


def get_init_inputs():
    return [c_in, c_out]
