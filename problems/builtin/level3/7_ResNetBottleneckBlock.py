import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ResNet bottleneck block: 1x1 reduce, 3x3, 1x1 expand convs each with BatchNorm, identity add, ReLU.

    relu(x + BN3(conv3(relu(BN2(conv2(relu(BN1(conv1(x)))))))); the BatchNorms keep no running statistics
    (batch statistics in train and eval mode). Shape kept: (N, C, H, W) -> (N, C, H, W), C = 4 * width.
    """

    def __init__(self, channels, width):
        super().__init__()
        self.reduce = nn.Conv2d(channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width, track_running_stats=False)
        self.spatial = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width, track_running_stats=False)
        self.expand = nn.Conv2d(width, channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(channels, track_running_stats=False)

    def forward(self, x):
        y = F.relu(self.bn1(self.reduce(x)))
        y = F.relu(self.bn2(self.spatial(y)))
        y = self.bn3(self.expand(y))
        return F.relu(x + y)


n_images = 4  # gpu: 128
width = 8  # gpu: 64
channels = 32  # gpu: 256
side = 14  # gpu: 56


def get_inputs():
    return [torch.randn(n_images, channels, side, side)]


def get_init_inputs():
    return [channels, width]
