import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """2-D max pooling of an NCHW batch: 3x3 windows, stride 2, padding 1 (padding never wins the max)."""

    def __init__(self, kernel, stride, padding):
        super().__init__()
        self.kernel = kernel
        self.stride = stride
        self.padding = padding

    def forward(self, img):
        # img: (batch, channels, side, side) -> (batch, channels, side // 2, side // 2) for even side.
        return F.max_pool2d(img, self.kernel, self.stride, self.padding)


batch = 4  # gpu: 112
channels = 16  # gpu: 128
side = 32  # gpu: 256
kernel = 3
stride = 2
padding = 1


def get_inputs():
    return [torch.randn(batch, channels, side, side)]


def get_init_inputs():
    return [kernel, stride, padding]
