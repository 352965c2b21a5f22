import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Depthwise 1D convolution (kernel 7), Mish, pointwise (1x1) convolution, plus the input.

    Input (N, C, L) -> (N, C, L).
    """

    def __init__(self, channels):
        super().__init__()
        self.depthwise = nn.Conv1d(channels, channels, 7, padding=3, groups=channels)
        self.pointwise = nn.Conv1d(channels, channels, 1)

    def forward(self, seq):
        y = self.depthwise(seq)
        y = F.mish(y)
        y = self.pointwise(y)
        return y + seq


n_seqs = 4  # gpu: 32
channels = 32  # gpu: 256
length = 256  # gpu: 8192


def get_inputs():
    return [torch.randn(n_seqs, channels, length)]


def get_init_inputs():
    return [channels]
