import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, batch normalisation with the batch's own statistics (training mode), then hardswish.

    Each output feature is normalised over the batch rows (biased variance), scaled by gamma, shifted by beta.
    No running statistics are kept, so the result is the same in train and eval mode.
    """

    def __init__(self, in_features, out_features, eps):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features)
        self.gamma = nn.Parameter(1.0 + 0.3 * torch.randn(out_features))
        self.beta = nn.Parameter(0.3 * torch.randn(out_features))
        self.eps = eps

    def forward(self, x):
        h = self.proj(x)
        h = F.batch_norm(h, None, None, self.gamma, self.beta, training=True, eps=self.eps)
        return F.hardswish(h)


batch = 128  # gpu: 8192
in_features = 96  # gpu: 4096
out_features = 160  # gpu: 2048
eps = 1e-5


def get_inputs():
    return [torch.randn(batch, in_features)]


def get_init_inputs():
    return [in_features, out_features, eps]
