import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(src_ptr, w_ptr, dst_ptr, n_cols, row_stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    src = src_ptr + row * row_stride
    dst = dst_ptr + row * row_stride
    # Pass 1: sum of squares over the row, block by block, in fp32.
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        x = tl.load(src + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        acc += x * x
    inv_rms = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    # Pass 2: scale every element by 1/rms and the per-feature weight.
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dst + cols, x * inv_rms * w, mask=mask)


class ModelNew(nn.Module):
    """RMSNorm: one Triton program per row, two passes over the row in blocks (sum of squares, then scale)."""

    def __init__(self, hidden, eps):
        super().__init__()
        self.hidden = hidden
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.5 * torch.randn(hidden))

    def forward(self, acts):
        src = acts.contiguous()
        flat = src.reshape(-1, self.hidden)
        out = torch.empty_like(flat)
        block = min(2048, triton.next_power_of_2(self.hidden))
        _rms_norm_kernel[(flat.shape[0],)](flat, self.weight.contiguous(), out, self.hidden, flat.stride(0),
                                           self.eps, BLOCK=block, num_warps=8 if block >= 1024 else 4)
        return out.reshape(src.shape)
