import torch
import torch.nn as nn


class Model(nn.Module):
    """Transposed 2-D convolution, kernel 4, stride 2, padding 1 (2x upsampling), with bias: H, W -> 2H, 2W."""

    def __init__(self, c_in, c_out):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(c_in, c_out, kernel_size=4, stride=2, padding=1, bias=True)

    def forward(self, img):
        # img: (N, C_in, H, W) -> (N, C_out, 2H, 2W); weight (C_in, C_out, 4, 4)
        return self.deconv(img)


n_images = 2  # gpu: 16
c_in = 8  # gpu: 128
c_out = 6  # gpu: 128
side = 12  # gpu: 128


def get_inputs():
    return [torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, c_out]
