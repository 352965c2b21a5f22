import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm (with learned gain and bias) of the input, added back onto the input, then tanh.

    out = tanh(x + LayerNorm(x))
    """

    def __init__(self, features):
        super().__init__()
        self.norm = nn.LayerNorm(features)
        with torch.no_grad():
            # Move the affine parameters off their trivial defaults (ones / zeros).
            self.norm.weight.add_(0.3 * torch.randn(features))
            self.norm.bias.add_(0.3 * torch.randn(features))

    def forward(self, x):
        return torch.tanh(x + self.norm(x))


n_tokens = 160  # gpu: 65536
features = 256  # gpu: 4096


def get_inputs():
    return [0.8 * torch.randn(n_tokens, features)]


def get_init_inputs():
    return [features]
