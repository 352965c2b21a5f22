import torch
import torch.nn as nn


class Model(nn.Module):
    """Dilated 1-D convolution, kernel 3, dilation d, padding d, with bias: (N, C_in, L) -> (N, C_out, L)."""

    def __init__(self, c_in, c_out, dilation):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel_size=3, dilation=dilation, padding=dilation, bias=True)

    def forward(self, seq):
        return self.conv(seq)


n_seqs = 2  # gpu: 16
c_in = 8  # gpu: 256
c_out = 12  # gpu: 256
length = 300  # gpu: 16384
dilation = 4


def get_inputs():
    return [torch.randn(n_seqs, c_in, length)]


def get_init_inputs():
    return [c_in, c_out, dilation]
