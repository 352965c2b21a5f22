import torch
import torch.nn as nn


class Model(nn.Module):
    """Grouped 2-D convolution, 3x3, padding 1: channels split into groups, each output group sees one input group."""

    def __init__(self, c_in, c_out, groups):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, groups=groups, bias=True)

    def forward(self, img):
        # img: (N, C_in, H, W) -> (N, C_out, H, W); weight (C_out, C_in / groups, 3, 3)
        return self.conv(img)


n_images = 2  # gpu: 64
c_in = 16  # gpu: 256
c_out = 24  # gpu: 256
groups = 4  # gpu: 8
side = 20  # gpu: 112


def get_inputs():
    return [torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, c_out, groups]
