import torch
import torch.nn as nn


class Model(nn.Module):
    """Bias-free convolution, a learned per-channel bias, clamp to [lo, hi], then a softmax over the channels.

    The softmax is rescaled by the channel count (each pixel's mean value is 1). The clamp range is chosen so
    that most values stay inside it.
    """

    def __init__(self, c_in, c_out, kernel, lo, hi):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2, bias=False)
        self.bias = nn.Parameter(0.3 * torch.randn(c_out, 1, 1))
        self.lo = lo
        self.hi = hi

    def forward(self, img):
        y = self.conv(img) + self.bias
        y = torch.clamp(y, self.lo, self.hi)
        return torch.softmax(y, dim=1) * y.shape[1]


n_images = 4  # gpu: 32
c_in = 8  # gpu: 64
c_out = 16  # gpu: 128
side = 24  # gpu: 128
kernel = 3
lo = -1.0
hi = 1.5


def get_inputs():
    return [2.0 * torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, c_out, kernel, lo, hi]
