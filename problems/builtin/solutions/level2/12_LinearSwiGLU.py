import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    # int64 offsets: batch * d_hidden may pass 2^31.
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n_elements
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0)
    tl.store(dst_ptr + offs, g / (1.0 + tl.exp(-g)) * u, mask=mask)


class ModelNew(nn.Module):
    """The two cuBLAS GEMMs (+ bias) as in eager; SiLU(gate) * up fused in one Triton pass."""

    def __init__(self, d_in, d_hidden):
        super().__init__()
        self.gate = nn.Linear(d_in, d_hidden)
        self.up = nn.Linear(d_in, d_hidden)

    def forward(self, x):
        # Same GEMMs as eager (bias in the cuBLAS epilogue); eager then makes two passes (silu, mul), this file one.
        g = F.linear(x, self.gate.weight, self.gate.bias).contiguous()
        u = F.linear(x, self.up.weight, self.up.bias).contiguous()
        out = torch.empty_like(g)
        n = g.numel()
        block = 1024
        _silu_mul_kernel[(triton.cdiv(n, block),)](g, u, out, n, BLOCK=block)
        return out
