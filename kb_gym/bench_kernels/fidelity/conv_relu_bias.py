# relu(conv(x)) + bias[c]: the convolution from cuDNN, then ReLU and the channel bias fused in one pass.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_bias_kernel(y_ptr, b_ptr, out_ptr, n, hw, channels, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    c = (offs // hw) % channels
    y = tl.load(y_ptr + offs, mask=mask)
    b = tl.load(b_ptr + c, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(y, 0.0) + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(out_channels))

    def forward(self, x):
        y = self.conv(x).contiguous()
        out = torch.empty_like(y)
        n = y.numel()
        hw = y.shape[2] * y.shape[3]
        relu_bias_kernel[(triton.cdiv(n, 4096),)](y, self.bias, out, n, hw, y.shape[1], BLOCK=4096)
        return out
