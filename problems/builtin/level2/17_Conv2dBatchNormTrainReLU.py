import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """3x3 convolution, batch normalisation with the batch's own statistics (training mode), then ReLU.

    Each channel is normalised over (N, H, W) (biased variance), scaled by gamma and shifted by beta.
    No running statistics are kept, so the result is the same in train and eval mode.
    """

    def __init__(self, c_in, c_out, kernel, eps):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2)
        self.gamma = nn.Parameter(1.0 + 0.3 * torch.randn(c_out))
        self.beta = nn.Parameter(0.5 * torch.randn(c_out))
        self.eps = eps

    def forward(self, img):
        y = self.conv(img)
        y = F.batch_norm(y, None, None, self.gamma, self.beta, training=True, eps=self.eps)
        return torch.relu(y)


n_images = 4  # gpu: 32
c_in = 8  # gpu: 64
c_out = 16  # gpu: 128
side = 24  # gpu: 128
kernel = 3
eps = 1e-5


def get_inputs():
    return [torch.randn(n_images, c_in, side, side)]


def get_init_inputs():
    return [c_in, c_out, kernel, eps]
