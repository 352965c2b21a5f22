import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _axpy_kernel(a_ptr, b_ptr, dst_ptr, alpha, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    a = tl.load(a_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)
    tl.store(dst_ptr + offs, alpha * a + b, mask=mask)


class ModelNew(nn.Module):
    """alpha * a + b in a single pass over both inputs."""

    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        a_c = a.contiguous()
        b_c = b.contiguous()
        out = torch.empty_like(a_c)
        n = a_c.numel()
        block = 1024
        _axpy_kernel[(triton.cdiv(n, block),)](a_c, b_c, out, float(self.alpha), n, BLOCK=block)
        return out
