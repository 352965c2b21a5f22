import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _bias_gelu_residual_kernel(h_ptr, bias_ptr, x_ptr, dst_ptr, n_elements, n_cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    h = tl.load(h_ptr + offs, mask=mask, other=0.0)
    h = h + tl.load(bias_ptr + offs % n_cols, mask=mask, other=0.0)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    g = 0.5 * h * (1.0 + tl.erf(h * 0.7071067811865476))
    tl.store(dst_ptr + offs, x + g, mask=mask)


class ModelNew(nn.Module):
    """torch matmul, then bias + exact GELU + residual add fused in one Triton kernel."""

    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        xc = x.contiguous()
        h = torch.matmul(xc, self.fc.weight.t()).contiguous()
        out = torch.empty_like(h)
        n = h.numel()
        block = 1024
        _bias_gelu_residual_kernel[(triton.cdiv(n, block),)](
            h, self.fc.bias.contiguous(), xc, out, n, h.shape[-1], BLOCK=block
        )
        return out
