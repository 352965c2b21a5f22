import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Convolution (padding k // 2), GroupNorm (learned affine), 2x2 max pooling, then a learned per-channel scale.

    Input (N, C_in, H, W) -> (N, C_out, H / 2, W / 2); the scale has shape (C_out, 1, 1).
    """

    def __init__(self, c_in, c_out, kernel, groups):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2)
        self.norm = nn.GroupNorm(groups, c_out)
        with torch.no_grad():
            self.norm.weight.add_(0.3 * torch.randn(c_out))
            self.norm.bias.add_(0.3 * torch.randn(c_out))
        self.channel_scale = nn.Parameter(1.0 + 0.5 * torch.randn(c_out, 1, 1))

    def forward(self, img):
        y = self.norm(self.conv(img))
        y = F.max_pool2d(y, 2)
        return y * self.channel_scale


n_images = 4  # gpu: 32
c_in = 8  # gpu: 64
c_out = 16  # gpu: 128
side = 24  # gpu: 128
kernel = 3
groups = 4  # gpu: 16


def get_inputs():
    return [torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, c_out, kernel, groups]
