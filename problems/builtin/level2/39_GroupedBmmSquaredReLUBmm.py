import torch
import torch.nn as nn


class Model(nn.Module):
    """Grouped two-layer feed-forward: per-group bmm, bias, squared ReLU, second per-group bmm.

    x: (G, T, D), each of the G groups with its own weights -> (G, T, D).
    out[g] = relu(x[g] @ W1[g] + b1[g]) ** 2 @ W2[g]
    """

    def __init__(self, groups, d_model, d_hidden):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(groups, d_model, d_hidden) * d_model**-0.5)
        self.b1 = nn.Parameter(0.1 * torch.randn(groups, 1, d_hidden))
        self.w2 = nn.Parameter(torch.randn(groups, d_hidden, d_model) * d_hidden**-0.5)

    def forward(self, x):
        h = torch.bmm(x, self.w1) + self.b1
        h = torch.relu(h) ** 2
        return torch.bmm(h, self.w2)


groups = 4  # gpu: 16
tokens = 32  # gpu: 4096
d_model = 64  # gpu: 512
d_hidden = 128  # gpu: 2048


def get_inputs():
    return [torch.randn(groups, tokens, d_model)]


def get_init_inputs():
    return [groups, d_model, d_hidden]
