import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _bias_relu_scale_kernel(h_ptr, b1_ptr, b2_ptr, dst_ptr, n_elements, n_cols, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    col = offs % n_cols
    h = tl.load(h_ptr + offs, mask=mask, other=0.0)
    b1 = tl.load(b1_ptr + col, mask=mask, other=0.0)
    b2 = tl.load(b2_ptr + col, mask=mask, other=0.0)
    y = tl.maximum(h + b1 + b2, 0.0) * scale
    tl.store(dst_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    """torch matmul for the projection; both biases, ReLU and scale fused in one Triton kernel."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features)
        self.shift = nn.Parameter(0.1 * torch.randn(out_features))
        self.scale = scale

    def forward(self, inp):
        h = torch.matmul(inp.contiguous(), self.proj.weight.t()).contiguous()
        out = torch.empty_like(h)
        n = h.numel()
        block = 1024
        _bias_relu_scale_kernel[(triton.cdiv(n, block),)](
            h,
            self.proj.bias.contiguous(),
            self.shift.contiguous(),
            out,
            n,
            h.shape[-1],
            float(self.scale),
            BLOCK=block,
        )
        return out
