import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Small image classifier: two conv+ReLU+2x2-maxpool stages, global average pool, linear head.

    Input (N, C, S, S) images -> (N, n_classes) logits.
    """

    def __init__(self, c_in, width, n_classes):
        super().__init__()
        self.conv_a = nn.Conv2d(c_in, width, kernel_size=3, padding=1)
        self.conv_b = nn.Conv2d(width, 2 * width, kernel_size=3, padding=1)
        self.head = nn.Linear(2 * width, n_classes)

    def forward(self, images):
        y = F.max_pool2d(F.relu(self.conv_a(images)), 2)
        y = F.max_pool2d(F.relu(self.conv_b(y)), 2)
        y = y.mean(dim=(2, 3))
        return self.head(y)


n_images = 8  # gpu: 64
c_in = 3
img_side = 32  # gpu: 224
width = 16  # gpu: 64
n_classes = 10  # gpu: 100


def get_inputs():
    return [4.0 * torch.randn(n_images, c_in, img_side, img_side)]


def get_init_inputs():
    return [c_in, width, n_classes]
