import torch
import torch.nn as nn


class Model(nn.Module):
    """Grouped-query attention layer with rotary position embeddings (RoPE) and an output projection.

    n_heads query heads share n_kv_heads key/value heads (n_heads // n_kv_heads queries per kv head); queries
    and keys are rotated by position (rotate-half RoPE, base 10000); no mask. x: (B, T, D) -> (B, T, D).
    """

    def __init__(self, d_model, n_heads, n_kv_heads, max_len):
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.kv_proj = nn.Linear(d_model, 2 * n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        half = self.head_dim // 2
        inv_freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
        angles = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", torch.cat([angles.cos(), angles.cos()], dim=-1))
        self.register_buffer("sin", torch.cat([angles.sin(), angles.sin()], dim=-1))

    def _rope(self, t):
        n = t.shape[-2]
        half = t.shape[-1] // 2
        rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
        return t * self.cos[:n] + rotated * self.sin[:n]

    def forward(self, x):
        b, n, d = x.shape
        hd = self.head_dim
        q = self.q_proj(x).reshape(b, n, self.n_heads, hd).transpose(1, 2)
        k, v = self.kv_proj(x).reshape(b, n, 2, self.n_kv_heads, hd).permute(2, 0, 3, 1, 4)
        q = self._rope(q)
        k = self._rope(k)
        group = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        att = torch.softmax((q @ k.transpose(-2, -1)) * hd**-0.5, dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, n, d)
        return self.o_proj(ctx)


batch = 2  # gpu: 16
seq = 48  # gpu: 1024
d_model = 64  # gpu: 1024
n_heads = 8  # gpu: 16
n_kv_heads = 2  # gpu: 4


def get_inputs():
    return [3.0 * torch.randn(batch, seq, d_model)]


def get_init_inputs():
    return [d_model, n_heads, n_kv_heads, seq]
