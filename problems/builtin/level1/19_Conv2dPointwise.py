import torch
import torch.nn as nn


class Model(nn.Module):
    """Pointwise (1x1) 2-D convolution with bias: a per-pixel channel mix, (N, C_in, H, W) -> (N, C_out, H, W)."""

    def __init__(self, c_in, c_out):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size=1, bias=True)

    def forward(self, img):
        return self.conv(img)


n_images = 2  # gpu: 64
c_in = 16  # gpu: 256
c_out = 24  # gpu: 512
side = 18  # gpu: 64


def get_inputs():
    return [torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, c_out]
