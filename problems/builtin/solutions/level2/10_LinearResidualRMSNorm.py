import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _residual_rms_norm_kernel(h_ptr, res_ptr, w_ptr, dst_ptr, n_cols, eps, BLOCK: tl.constexpr):
    # One program per row, fp32 throughout; int64 row offsets since rows * n_cols may pass 2^31.
    row = tl.program_id(0).to(tl.int64) * n_cols
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        v = tl.load(h_ptr + row + cols, mask=mask, other=0.0) + tl.load(res_ptr + row + cols, mask=mask, other=0.0)
        acc += v * v
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    # Re-adding the residual here beats storing h + residual: the row was just read, so these loads hit cache.
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        v = tl.load(h_ptr + row + cols, mask=mask, other=0.0) + tl.load(res_ptr + row + cols, mask=mask, other=0.0)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        tl.store(dst_ptr + row + cols, v * rstd * w, mask=mask)


class ModelNew(nn.Module):
    """cuBLAS GEMM + bias as in eager; residual add + RMSNorm + gain fused in one Triton program per row."""

    def __init__(self, in_features, out_features, eps):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features)
        self.weight = nn.Parameter(1.0 + 0.3 * torch.randn(out_features))
        self.eps = eps

    def forward(self, x, residual):
        # Same GEMM as eager; eager then makes five full passes (add, pow, mean, two multiplies), this file one.
        h = F.linear(x, self.proj.weight, self.proj.bias).contiguous()
        n = h.shape[-1]
        res = residual.expand_as(h).contiguous()
        out = torch.empty_like(h)
        block = min(4096, triton.next_power_of_2(n))
        _residual_rms_norm_kernel[(h.numel() // n,)](
            h, res, self.weight.contiguous(), out, n, float(self.eps), BLOCK=block, num_warps=8 if block >= 1024 else 4
        )
        return out
