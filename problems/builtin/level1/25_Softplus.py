import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Softplus with beta and a linear cutoff, elementwise: out = log(1 + exp(beta * v)) / beta.

    Where beta * v > threshold the output is v itself (there the two differ by under 3e-5).
    """

    def __init__(self, beta, threshold):
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, img):
        # img: (N, C, H, W) float32; same shape out.
        return F.softplus(img, beta=self.beta, threshold=self.threshold)


n_images = 4  # gpu: 64
channels = 8  # gpu: 128
side = 32  # gpu: 256
beta = 2.0
threshold = 10.0


def get_inputs():
    return [3.0 * torch.randn(n_images, channels, side, side)]


def get_init_inputs():
    return [beta, threshold]
