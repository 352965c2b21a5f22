import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Pre-norm transformer decoder block: causal self-attention, cross-attention to a memory, GELU MLP.

    h = x + SelfAttn(LN1(x)) with a causal mask; h = h + CrossAttn(LN2(h), memory); out = h + MLP(LN3(h)).
    x: (B, T, D) decoder states, memory: (B, S, D) encoder states -> (B, T, D).
    """

    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.n_heads = n_heads
        self.ln_self = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.self_out = nn.Linear(d_model, d_model)
        self.ln_cross = nn.LayerNorm(d_model)
        self.cross_q = nn.Linear(d_model, d_model)
        self.cross_kv = nn.Linear(d_model, 2 * d_model)
        self.cross_out = nn.Linear(d_model, d_model)
        self.ln_mlp = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)

    def _heads(self, t):
        b, n, d = t.shape
        return t.reshape(b, n, self.n_heads, d // self.n_heads).transpose(1, 2)

    def _attend(self, q, k, v, causal):
        scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
        if causal:
            t, s = scores.shape[-2:]
            future = torch.ones(t, s, dtype=torch.bool, device=scores.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        ctx = torch.softmax(scores, dim=-1) @ v
        b, h, t, hd = ctx.shape
        return ctx.transpose(1, 2).reshape(b, t, h * hd)

    def forward(self, x, memory):
        q, k, v = self.qkv(self.ln_self(x)).chunk(3, dim=-1)
        h = x + self.self_out(self._attend(self._heads(q), self._heads(k), self._heads(v), causal=True))
        q = self.cross_q(self.ln_cross(h))
        k, v = self.cross_kv(memory).chunk(2, dim=-1)
        h = h + self.cross_out(self._attend(self._heads(q), self._heads(k), self._heads(v), causal=False))
        return h + self.down(F.gelu(self.up(self.ln_mlp(h))))


batch = 2  # gpu: 8
tgt_len = 32  # gpu: 1024
src_len = 40  # gpu: 1024
d_model = 64  # gpu: 1024
n_heads = 4  # gpu: 16
d_ff = 256  # gpu: 4096


def get_inputs():
    return [torch.randn(batch, tgt_len, d_model), torch.randn(batch, src_len, d_model)]


def get_init_inputs():
    return [d_model, n_heads, d_ff]
