import torch
import torch.nn as nn


class Model(nn.Module):
    """Depthwise 2-D convolution: each channel convolved with its own 3x3 filter (groups = channels), padding 1."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1, groups=channels, bias=True)

    def forward(self, img):
        # img: (N, C, H, W) -> (N, C, H, W)
        return self.conv(img)


n_images = 2  # gpu: 64
channels = 12  # gpu: 512
side = 30  # gpu: 128


def get_inputs():
    return [torch.randn(n_images, channels, side, side)]


def get_init_inputs():
    return [channels]
