import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A stem convolution followed by two residual blocks (conv-ReLU-conv plus identity, then ReLU).

    Normalisation-free, so the result does not depend on train/eval mode. Shape is kept:
    (N, c_in, S, S) -> (N, channels, S, S).
    """

    def __init__(self, c_in, channels, n_blocks):
        super().__init__()
        self.stem = nn.Conv2d(c_in, channels, 3, padding=1)
        self.blocks = nn.ModuleList()
        for _ in range(n_blocks):
            self.blocks.append(
                nn.ModuleList(
                    [
                        nn.Conv2d(channels, channels, 3, padding=1),
                        nn.Conv2d(channels, channels, 3, padding=1),
                    ]
                )
            )

    def forward(self, x):
        x = F.relu(self.stem(x))
        for first, second in self.blocks:
            x = F.relu(x + second(F.relu(first(x))))
        return x


n_images = 2  # gpu: 32
c_in = 3
side = 24  # gpu: 128
channels = 16  # gpu: 64
n_blocks = 2


def get_inputs():
    return [2.0 * torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, channels, n_blocks]
