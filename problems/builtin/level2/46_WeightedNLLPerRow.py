import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Per-row class-weighted negative log-likelihood: log-softmax, gather the target, times its class weight.

    logits: (R, C), target: (R,) integer classes -> -log_softmax(logits)[r, target[r]] * weight[target[r]], (R,).
    """

    def __init__(self, n_classes):
        super().__init__()
        self.class_weight = nn.Parameter(0.5 + torch.rand(n_classes))

    def forward(self, logits, target):
        logp = F.log_softmax(logits, dim=1)
        picked = torch.gather(logp, 1, target.unsqueeze(1)).squeeze(1)
        return -picked * self.class_weight[target]


rows = 256  # gpu: 65536
n_classes = 300  # gpu: 8192


def get_inputs():
    return [torch.randn(rows, n_classes), torch.randint(0, n_classes, (rows,))]


def get_init_inputs():
    return [n_classes]
