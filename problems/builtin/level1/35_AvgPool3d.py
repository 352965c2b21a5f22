import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """3-D average pooling of an NCDHW volume: 3x3x3 windows, stride 2, padding 1 (zero padding counted).

    Every window is divided by 27, including those that overlap the zero padding at the borders.
    """

    def __init__(self, kernel, stride, padding):
        super().__init__()
        self.kernel = kernel
        self.stride = stride
        self.padding = padding

    def forward(self, vol):
        # vol: (batch, channels, depth, side, side) -> each spatial extent halved (even sizes).
        return F.avg_pool3d(vol, self.kernel, self.stride, self.padding)


batch = 2  # gpu: 16
channels = 8  # gpu: 64
depth = 12  # gpu: 64
side = 16  # gpu: 128
kernel = 3
stride = 2
padding = 1


def get_inputs():
    return [torch.randn(batch, channels, depth, side, side)]


def get_init_inputs():
    return [kernel, stride, padding]
