import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Stride-2 transposed 1D convolution to 2*C_out channels, GLU over channels, a per-channel scale.

    Input (N, C_in, L) -> (N, C_out, 2L): first half of the channels times sigmoid of the second half.
    """

    def __init__(self, c_in, c_out):
        super().__init__()
        self.deconv = nn.ConvTranspose1d(c_in, 2 * c_out, 4, stride=2, padding=1)
        self.channel_scale = nn.Parameter(1.0 + 0.3 * torch.randn(c_out, 1))

    def forward(self, seq):
        y = self.deconv(seq)
        y = F.glu(y, dim=1)
        return y * self.channel_scale


n_seqs = 4  # gpu: 64
c_in = 32  # gpu: 256
c_out = 24  # gpu: 128
length = 128  # gpu: 4096


def get_inputs():
    return [2.0 * torch.randn(n_seqs, c_in, length)]


def get_init_inputs():
    return [c_in, c_out]
