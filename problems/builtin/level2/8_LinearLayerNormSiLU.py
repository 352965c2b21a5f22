import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, LayerNorm over the output features (learned gain and bias), then SiLU.

    out = silu(LayerNorm(x @ W^T + b))
    """

    def __init__(self, in_features, out_features):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features)
        with torch.no_grad():
            # Move the affine parameters off their trivial defaults (ones / zeros).
            self.norm.weight.add_(0.3 * torch.randn(out_features))
            self.norm.bias.add_(0.3 * torch.randn(out_features))

    def forward(self, x):
        return F.silu(self.norm(self.proj(x)))


batch = 96  # gpu: 8192
in_features = 128  # gpu: 2048
out_features = 192  # gpu: 4096


def get_inputs():
    return [torch.randn(batch, in_features)]


def get_init_inputs():
    return [in_features, out_features]
