import torch
import torch.nn as nn


class Model(nn.Module):
    """Transposed 3-D convolution, kernel 3, stride 2, padding 1, output_padding 1 (2x upsampling of D, H, W)."""

    def __init__(self, c_in, c_out):
        super().__init__()
        self.deconv = nn.ConvTranspose3d(c_in, c_out, kernel_size=3, stride=2, padding=1, output_padding=1, bias=True)

    def forward(self, vol):
        # vol: (N, C_in, D, H, W) -> (N, C_out, 2D, 2H, 2W); weight (C_in, C_out, 3, 3, 3)
        return self.deconv(vol)


n_vols = 1  # gpu: 4
c_in = 4  # gpu: 64
c_out = 3  # gpu: 64
side = 6  # gpu: 48


def get_inputs():
    return [torch.randn(n_vols, c_in, side, side, side)]


def get_init_inputs():
    return [c_in, c_out]
