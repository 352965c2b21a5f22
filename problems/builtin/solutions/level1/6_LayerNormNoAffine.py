import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _layer_norm_kernel(src_ptr, dst_ptr, n_cols, row_stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(src_ptr + row * row_stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n_cols
    tl.store(dst_ptr + row * row_stride + cols, d * tl.rsqrt(var + eps), mask=mask)


class ModelNew(nn.Module):
    """LayerNorm without affine: one Triton program normalises one row held in registers."""

    def __init__(self, hidden, eps):
        super().__init__()
        self.hidden = hidden
        self.eps = eps

    def forward(self, acts):
        src = acts.contiguous()
        flat = src.reshape(-1, self.hidden)
        out = torch.empty_like(flat)
        block = triton.next_power_of_2(self.hidden)
        _layer_norm_kernel[(flat.shape[0],)](flat, out, self.hidden, self.hidden, self.eps, BLOCK=block)
        return out.reshape(src.shape)
