import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, GroupNorm over groups of output features (learned affine), then hardtanh to [lo, hi].

    The clamp range is asymmetric and wide enough that most values stay inside it.
    """

    def __init__(self, in_features, out_features, groups, lo, hi):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features)
        self.norm = nn.GroupNorm(groups, out_features)
        with torch.no_grad():
            self.norm.weight.add_(0.3 * torch.randn(out_features))
            self.norm.bias.add_(0.3 * torch.randn(out_features))
        self.lo = lo
        self.hi = hi

    def forward(self, x):
        h = self.norm(self.proj(x))
        return F.hardtanh(h, self.lo, self.hi)


batch = 64  # gpu: 4096
in_features = 128  # gpu: 2048
out_features = 256  # gpu: 8192
groups = 8  # gpu: 32
lo = -1.5
hi = 2.0


def get_inputs():
    return [torch.randn(batch, in_features)]


def get_init_inputs():
    return [in_features, out_features, groups, lo, hi]
