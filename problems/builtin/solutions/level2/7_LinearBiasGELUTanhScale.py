import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _shift_gelu_tanh_scale_kernel(h_ptr, shift_ptr, dst_ptr, n_elements, n_cols, scale, BLOCK: tl.constexpr):
    # int64 offsets: batch * out_features may pass 2^31.
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n_elements
    h = tl.load(h_ptr + offs, mask=mask, other=0.0)
    h = h + tl.load(shift_ptr + offs % n_cols, mask=mask, other=0.0)
    u = 0.7978845608028654 * (h + 0.044715 * h * h * h)
    t = 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)  # tanh(u); saturates cleanly to +-1 where exp overflows
    tl.store(dst_ptr + offs, 0.5 * h * (1.0 + t) * scale, mask=mask)


class ModelNew(nn.Module):
    """cuBLAS GEMM as in eager; shift + tanh-GELU + scale fused in one Triton pass over its output."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features, bias=False)
        self.shift = nn.Parameter(0.5 * torch.randn(out_features))
        self.scale = scale

    def forward(self, x):
        # Same GEMM as eager (fp32, no bias); eager then makes three passes over h (add, gelu, mul), this file one.
        h = F.linear(x, self.proj.weight).contiguous()
        out = torch.empty_like(h)
        n = h.numel()
        block = 1024
        _shift_gelu_tanh_scale_kernel[(triton.cdiv(n, block),)](
            h, self.shift.contiguous(), out, n, h.shape[-1], float(self.scale), BLOCK=block
        )
        return out
