import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _silu_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n_elements
    v = tl.load(src_ptr + offs, mask=mask, other=0.0)
    # v * sigmoid(v) = v / (1 + exp(-v)); for v << 0 exp(-v) overflows to inf and the quotient is -0, as it should be.
    tl.store(dst_ptr + offs, v / (1.0 + tl.exp(-v)), mask=mask)


class ModelNew(nn.Module):
    """SiLU as one flat elementwise Triton kernel."""

    def __init__(self):
        super().__init__()

    def forward(self, v):
        src = v.contiguous()
        out = torch.empty_like(src)
        n = src.numel()
        block = 1024
        _silu_kernel[(triton.cdiv(n, block),)](src, out, n, BLOCK=block)
        return out
