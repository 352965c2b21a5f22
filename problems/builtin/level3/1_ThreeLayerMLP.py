import torch
import torch.nn as nn


class Model(nn.Module):
    """Feed-forward classifier head: three Linear layers with ReLU between them (logits out)."""

    def __init__(self, d_in, d_hidden1, d_hidden2, n_classes):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(d_in, d_hidden1),
            nn.ReLU(),
            nn.Linear(d_hidden1, d_hidden2),
            nn.ReLU(),
            nn.Linear(d_hidden2, n_classes),
        )

    def forward(self, feats):
        # feats: (batch, d_in) -> logits (batch, n_classes)
        return self.layers(feats)


batch = 64  # gpu: 8192
d_in = 300  # gpu: 2048
d_hidden1 = 512  # gpu: 4096
d_hidden2 = 256  # gpu: 2048
n_classes = 40  # gpu: 1000


def get_inputs():
    # Standardised features with a wide spread, so the logits are not all close to zero.
    return [5.0 * torch.randn(batch, d_in)]


def get_init_inputs():
    return [d_in, d_hidden1, d_hidden2, n_classes]
