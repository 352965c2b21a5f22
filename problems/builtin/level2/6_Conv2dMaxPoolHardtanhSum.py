import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Convolution, 2x2 max pooling, clamp to [lo, hi] (hardtanh), then a sum over channels.

    Input (N, C_in, H, W) -> output (N, 1, H', W') where H', W' are the pooled spatial sizes.
    """

    def __init__(self, c_in, c_out, kernel, lo, hi):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel)
        self.lo = lo
        self.hi = hi

    def forward(self, img):
        z = self.conv(img)
        z = F.max_pool2d(z, 2)
        z = F.hardtanh(z, self.lo, self.hi)
        return z.sum(dim=1, keepdim=True)


n_images = 8  # gpu: 64
c_in = 3  # gpu: 16
c_out = 16  # gpu: 64
height = 34  # gpu: 258
width = 30  # gpu: 250
kernel = 3
lo = -0.25
hi = 1.0


def get_inputs():
    return [torch.randn(n_images, c_in, height, width)]


def get_init_inputs():
    return [c_in, c_out, kernel, lo, hi]
