import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """CNN classifier: three conv3x3 + BatchNorm (batch statistics) + ReLU + 2x2 max-pool stages, flatten, linear.

    The BatchNorms keep no running statistics, so they normalise with the batch's own statistics in
    train and eval mode alike. Input (N, C_in, S, S) -> (N, n_classes) logits.
    """

    def __init__(self, c_in, width, side, n_classes):
        super().__init__()
        chans = [c_in, width, 2 * width, 4 * width]
        self.convs = nn.ModuleList([nn.Conv2d(chans[i], chans[i + 1], 3, padding=1) for i in range(3)])
        self.norms = nn.ModuleList([nn.BatchNorm2d(chans[i + 1], track_running_stats=False) for i in range(3)])
        self.head = nn.Linear(chans[3] * (side // 8) ** 2, n_classes)

    def forward(self, images):
        y = images
        for conv, norm in zip(self.convs, self.norms, strict=True):
            y = F.max_pool2d(F.relu(norm(conv(y))), 2)
        return self.head(y.flatten(1))


n_images = 8  # gpu: 256
c_in = 3
side = 32  # gpu: 64
width = 8  # gpu: 64
n_classes = 10


def get_inputs():
    return [torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, width, side, n_classes]
