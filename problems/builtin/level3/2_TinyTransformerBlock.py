import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """One pre-norm transformer encoder block, written out by hand.

    h = x + W_o(MultiHeadSelfAttention(LN1(x)))   (no mask, scaled dot-product, n_heads heads)
    out = h + W_2(gelu(W_1(LN2(h))))
    Input and output have shape (batch, seq, d_model).
    """

    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.ln_attn = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.attn_out = nn.Linear(d_model, d_model)
        self.ln_mlp = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln_attn(x)).chunk(3, dim=-1)
        # (b, t, d) -> (b, heads, t, head_dim)
        q = q.reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / (self.head_dim**0.5)
        att = torch.softmax(att, dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, t, d)
        h = x + self.attn_out(ctx)
        return h + self.down(F.gelu(self.up(self.ln_mlp(h))))


batch = 4  # gpu: 8
seq = 64  # gpu: 1024
d_model = 128  # gpu: 1024
n_heads = 4  # gpu: 16
d_ff = 512  # gpu: 4096


def get_inputs():
    return [torch.randn(batch, seq, d_model)]


def get_init_inputs():
    return [d_model, n_heads, d_ff]
