import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Deep MLP of pre-norm residual blocks: input projection, n_blocks of x + W2(gelu(W1(LN(x)))), LN, head.

    Input (batch, d_in) -> (batch, d_out).
    """

    def __init__(self, d_in, d_model, d_hidden, d_out, n_blocks):
        super().__init__()
        self.embed = nn.Linear(d_in, d_model)
        self.norms = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(n_blocks)])
        self.ups = nn.ModuleList([nn.Linear(d_model, d_hidden) for _ in range(n_blocks)])
        self.downs = nn.ModuleList([nn.Linear(d_hidden, d_model) for _ in range(n_blocks)])
        self.final_norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, d_out)

    def forward(self, feats):
        x = self.embed(feats)
        for norm, up, down in zip(self.norms, self.ups, self.downs, strict=True):
            x = x + down(F.gelu(up(norm(x))))
        return self.head(self.final_norm(x))


batch = 16  # gpu: 4096
d_in = 48  # gpu: 512
d_model = 96  # gpu: 1024
d_hidden = 160  # gpu: 4096
d_out = 40  # gpu: 1000
n_blocks = 2  # gpu: 3


def get_inputs():
    return [torch.randn(batch, d_in)]


def get_init_inputs():
    return [d_in, d_model, d_hidden, d_out, n_blocks]
