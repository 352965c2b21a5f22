import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Transposed convolution (kernel 4, stride 2: 2x upsampling), instance norm, then leaky ReLU.

    The instance norm has a learned affine per channel and no running statistics, so it always normalises
    each (image, channel) plane by its own mean and variance. (N, C_in, H, W) -> (N, C_out, 2H, 2W).
    """

    def __init__(self, c_in, c_out, negative_slope):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(c_in, c_out, 4, stride=2, padding=1)
        self.norm = nn.InstanceNorm2d(c_out, affine=True)
        self.negative_slope = negative_slope

    def forward(self, img):
        y = self.deconv(img)
        y = self.norm(y)
        return F.leaky_relu(y, self.negative_slope)


n_images = 2  # gpu: 64
c_in = 8  # gpu: 128
c_out = 16  # gpu: 64
side = 16  # gpu: 64
negative_slope = 0.2


def get_inputs():
    return [torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, c_out, negative_slope]
