import torch
import torch.nn as nn


class Model(nn.Module):
    """Table lookup: row ids[b, t] of a learned (vocab, dim) table, for every position.

    ids is an int64 tensor of shape (batch, seq); the output has shape (batch, seq, dim).
    """

    def __init__(self, vocab, dim):
        super().__init__()
        self.table = nn.Embedding(vocab, dim)

    def forward(self, ids):
        return self.table(ids)


vocab = 1000  # gpu: 32000
dim = 128  # gpu: 1024
batch = 6  # gpu: 128
seq = 50  # gpu: 4096


def get_inputs():
    return [torch.randint(0, vocab, (batch, seq), dtype=torch.long)]


def get_init_inputs():
    return [vocab, dim]
