import torch
import torch.nn as nn


class Model(nn.Module):
    """3-D convolution, 3x3x3 kernel, padding 1, with bias: (N, C_in, D, H, W) -> (N, C_out, D, H, W)."""

    def __init__(self, c_in, c_out):
        super().__init__()
        self.conv = nn.Conv3d(c_in, c_out, kernel_size=3, padding=1, bias=True)

    def forward(self, vol):
        return self.conv(vol)


n_vols = 1  # gpu: 4
c_in = 4  # gpu: 32
c_out = 6  # gpu: 64
depth = 10  # gpu: 64
side = 12  # gpu: 64


def get_inputs():
    return [torch.randn(n_vols, c_in, depth, side, side)]


def get_init_inputs():
    return [c_in, c_out]
