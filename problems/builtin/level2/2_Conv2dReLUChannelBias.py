import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 convolution (padding 1), ReLU, then a learned per-output-channel offset.

    The offset has shape (C_out, 1, 1) and broadcasts over the spatial positions.
    """

    def __init__(self, c_in, c_out, kernel):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2)
        self.channel_offset = nn.Parameter(0.2 * torch.randn(c_out, 1, 1))

    def forward(self, img):
        y = self.conv(img)
        y = torch.relu(y)
        return y + self.channel_offset


n_images = 4  # gpu: 64
c_in = 8  # gpu: 64
c_out = 24  # gpu: 128
side = 28  # gpu: 128
kernel = 3


def get_inputs():
    return [torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, c_out, kernel]
