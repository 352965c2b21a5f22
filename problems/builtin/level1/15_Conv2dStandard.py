import torch
import torch.nn as nn


class Model(nn.Module):
    """2-D convolution, square kernel, stride 1, 'same' zero padding, with bias: (N, C_in, H, W) -> (N, C_out, H, W)."""

    def __init__(self, c_in, c_out, kernel):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2, bias=True)

    def forward(self, img):
        return self.conv(img)


n_images = 2  # gpu: 16
c_in = 8  # gpu: 128
c_out = 16  # gpu: 256
side = 24  # gpu: 128
kernel = 3


def get_inputs():
    return [torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, c_out, kernel]
