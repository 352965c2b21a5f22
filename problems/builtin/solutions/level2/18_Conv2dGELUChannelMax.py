import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _gelu_channel_max_kernel(y_ptr, dst_ptr, n_pixels, n_channels, hw, BLOCK: tl.constexpr):
    # Each program takes BLOCK pixels and walks the channels: every load is a contiguous run of one
    # channel plane (NCHW). int64 offsets: images * channels * pixels may pass 2^31.
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = p < n_pixels
    base = (p // hw) * n_channels * hw + p % hw
    ptrs = y_ptr + base
    best = tl.full((BLOCK,), -float("inf"), dtype=tl.float32)
    for _ in range(0, n_channels):
        y = tl.load(ptrs, mask=mask, other=0.0)
        # GELU is not monotonic (dips below zero), so it goes on every channel before the max.
        best = tl.maximum(best, 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476)))
        ptrs += hw
    # Output (N, 1, H, W) contiguous: pixel p is its flat offset.
    tl.store(dst_ptr + p, best, mask=mask)


class ModelNew(nn.Module):
    """cuDNN convolution + bias as in eager; exact GELU + max over channels fused in one Triton pass."""

    def __init__(self, c_in, c_out, kernel):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2)

    def forward(self, img):
        # Same convolution as eager; eager then makes two full passes (gelu, amax), this file one.
        c = self.conv
        y = F.conv2d(img, c.weight, c.bias, c.stride, c.padding, c.dilation, c.groups).contiguous()
        nb, co, h, w = y.shape
        out = torch.empty((nb, 1, h, w), device=y.device, dtype=y.dtype)
        n_pixels = nb * h * w
        block = 512
        _gelu_channel_max_kernel[(triton.cdiv(n_pixels, block),)](y, out, n_pixels, co, h * w, BLOCK=block)
        return out
