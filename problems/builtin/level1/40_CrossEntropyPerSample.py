import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Per-sample cross-entropy of (batch, classes) logits against int64 class targets, no reduction -> (batch,).

    loss[i] = logsumexp(logits[i]) - logits[i, target[i]].
    """

    def __init__(self):
        super().__init__()

    def forward(self, logits, targets):
        return F.cross_entropy(logits, targets, reduction="none")


batch = 256  # gpu: 65536
classes = 1000  # gpu: 8192


def get_inputs():
    logits = 2.0 * torch.randn(batch, classes)
    targets = torch.randint(0, classes, (batch,), dtype=torch.long)
    return [logits, targets]


def get_init_inputs():
    return []
