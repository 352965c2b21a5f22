import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _mish_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n_elements
    v = tl.load(src_ptr + offs, mask=mask, other=0.0)
    # tanh(log(1 + e)) with e = exp(v) is ((1 + e)^2 - 1) / ((1 + e)^2 + 1) = n / (n + 2), n = e * (e + 2):
    # no log or tanh needed, and no cancellation for v << 0 (n ~ 2e). Past v = 20 the factor is 1 in fp32;
    # clamping there keeps n finite.
    e = tl.exp(tl.minimum(v, 20.0))
    n = e * (e + 2.0)
    y = tl.where(v > 20.0, v, v * (n / (n + 2.0)))
    tl.store(dst_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    """Mish as one flat elementwise Triton kernel (an algebraic form of tanh(softplus(v)))."""

    def __init__(self):
        super().__init__()

    def forward(self, v):
        src = v.contiguous()
        out = torch.empty_like(src)
        n = src.numel()
        block = 1024
        _mish_kernel[(triton.cdiv(n, block),)](src, out, n, BLOCK=block)
        return out
