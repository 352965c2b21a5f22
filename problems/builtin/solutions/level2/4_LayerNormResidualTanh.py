import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _ln_residual_tanh_kernel(x_ptr, w_ptr, b_ptr, dst_ptr, n_cols, row_stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * row_stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    u = x + d * tl.rsqrt(var + eps) * w + b
    a = tl.abs(u)
    t = 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0)
    t = tl.where(u < 0, -t, t)
    tl.store(dst_ptr + row * row_stride + cols, t, mask=mask)


class ModelNew(nn.Module):
    """LayerNorm, residual add and tanh fused: one Triton program per row."""

    def __init__(self, features):
        super().__init__()
        self.norm = nn.LayerNorm(features)
        with torch.no_grad():
            self.norm.weight.add_(0.3 * torch.randn(features))
            self.norm.bias.add_(0.3 * torch.randn(features))

    def forward(self, x):
        n_cols = x.shape[-1]
        flat = x.contiguous().reshape(-1, n_cols)
        out = torch.empty_like(flat)
        block = triton.next_power_of_2(n_cols)
        _ln_residual_tanh_kernel[(flat.shape[0],)](
            flat,
            self.norm.weight.contiguous(),
            self.norm.bias.contiguous(),
            out,
            n_cols,
            n_cols,
            float(self.norm.eps),
            BLOCK=block,
        )
        return out.reshape(x.shape)
