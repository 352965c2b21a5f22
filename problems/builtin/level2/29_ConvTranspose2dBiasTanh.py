import torch
import torch.nn as nn


class Model(nn.Module):
    """Stride-2 transposed convolution (2x upsampling), a learned per-channel bias, tanh, then a scale.

    Input (N, C_in, H, W) -> (N, C_out, 2H, 2W).
    """

    def __init__(self, c_in, c_out, scale):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(c_in, c_out, 3, stride=2, padding=1, output_padding=1)
        self.channel_bias = nn.Parameter(0.5 * torch.randn(c_out, 1, 1))
        self.scale = scale

    def forward(self, img):
        y = self.deconv(img)
        y = y + self.channel_bias
        return torch.tanh(y) * self.scale


n_images = 2  # gpu: 64
c_in = 8  # gpu: 64
c_out = 12  # gpu: 64
side = 16  # gpu: 128
scale = 1.5


def get_inputs():
    return [2.0 * torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, c_out, scale]
