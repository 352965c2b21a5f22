import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Length-preserving 1D convolution (kernel 5, padding 2), exact GELU, plus the input (residual).

    Input (N, C, L) -> (N, C, L).
    """

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, 5, padding=2)

    def forward(self, seq):
        y = self.conv(seq)
        y = F.gelu(y)
        return y + seq


n_seqs = 4  # gpu: 32
channels = 32  # gpu: 256
length = 256  # gpu: 4096


def get_inputs():
    return [torch.randn(n_seqs, channels, length)]


def get_init_inputs():
    return [channels]
