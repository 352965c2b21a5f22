import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Stride-2 4x4 convolution (padding 1), LeakyReLU(0.2), then pixel norm (divide by the RMS over channels).

    out = y / sqrt(mean_c y^2 + eps), y = leaky_relu(conv(img)); the spatial size halves.
    """

    def __init__(self, c_in, c_out, eps):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 4, stride=2, padding=1)
        self.eps = eps

    def forward(self, img):
        y = F.leaky_relu(self.conv(img), 0.2)
        return y * torch.rsqrt(y.pow(2).mean(dim=1, keepdim=True) + self.eps)


n_images = 4  # gpu: 32
c_in = 8  # gpu: 64
c_out = 16  # gpu: 128
side = 32  # gpu: 256
eps = 1e-8


def get_inputs():
    return [torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, c_out, eps]
