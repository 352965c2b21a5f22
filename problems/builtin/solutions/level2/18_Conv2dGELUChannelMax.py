import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _conv_gelu_chanmax_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    n_pixels,
    C,
    H,
    W,
    CO,
    OH,
    OW,
    stride_xn,
    stride_xc,
    stride_xh,
    stride_xw,
    SH: tl.constexpr,
    SW: tl.constexpr,
    PH: tl.constexpr,
    PW: tl.constexpr,
    KH: tl.constexpr,
    KW: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    """Implicit-GEMM convolution for BM output pixels, all output channels in blocks of BN, with bias,
    exact GELU and a running max over the channels in the epilogue: the conv output never reaches memory."""
    rp = tl.program_id(0) * BM + tl.arange(0, BM)
    p_mask = rp < n_pixels
    n = rp // (OH * OW)
    rem = rp % (OH * OW)
    oh = rem // OW
    ow = rem % OW
    k_total = C * KH * KW
    rk = tl.arange(0, BK)
    rc = tl.arange(0, BN)
    best = tl.full((BM,), -float("inf"), dtype=tl.float32)
    for co0 in range(0, CO, BN):
        co = co0 + rc
        co_mask = co < CO
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, k_total, BK):
            kk = k0 + rk
            k_mask = kk < k_total
            ci = kk // (KH * KW)
            r = kk % (KH * KW)
            ih = oh[:, None] * SH - PH + (r // KW)[None, :]
            iw = ow[:, None] * SW - PW + (r % KW)[None, :]
            a_mask = p_mask[:, None] & k_mask[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a = tl.load(
                x_ptr + n[:, None] * stride_xn + ci[None, :] * stride_xc + ih * stride_xh + iw * stride_xw,
                mask=a_mask,
                other=0.0,
            )
            # The weight (CO, C, KH, KW) is contiguous: row co of the (CO, k_total) matrix.
            b = tl.load(w_ptr + co[None, :] * k_total + kk[:, None], mask=k_mask[:, None] & co_mask[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        y = acc + tl.load(b_ptr + co, mask=co_mask, other=0.0)[None, :]
        g = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))
        g = tl.where(co_mask[None, :], g, -float("inf"))
        best = tl.maximum(best, tl.max(g, axis=1))
    # Output (N, 1, OH, OW) contiguous: pixel index rp is its flat offset.
    tl.store(out_ptr + rp, best, mask=p_mask)


class ModelNew(nn.Module):
    """One Triton kernel: convolution as an implicit GEMM, bias + GELU + max over channels fused after it."""

    def __init__(self, c_in, c_out, kernel):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2)

    def forward(self, img):
        x = img.contiguous()
        w = self.conv.weight.contiguous()
        nb, c, h, wd = x.shape
        co, _, kh, kw = w.shape
        sh, sw = self.conv.stride
        ph, pw = self.conv.padding
        oh = (h + 2 * ph - kh) // sh + 1
        ow = (wd + 2 * pw - kw) // sw + 1
        out = torch.empty((nb, 1, oh, ow), device=x.device, dtype=torch.float32)
        n_pixels = nb * oh * ow
        bm = 32
        bn = max(16, min(64, triton.next_power_of_2(co)))
        bk = max(16, min(32, triton.next_power_of_2(c * kh * kw)))
        _conv_gelu_chanmax_kernel[(triton.cdiv(n_pixels, bm),)](
            x,
            w,
            self.conv.bias.contiguous(),
            out,
            n_pixels,
            c,
            h,
            wd,
            co,
            oh,
            ow,
            x.stride(0),
            x.stride(1),
            x.stride(2),
            x.stride(3),
            SH=sh,
            SW=sw,
            PH=ph,
            PW=pw,
            KH=kh,
            KW=kw,
            BM=bm,
            BN=bn,
            BK=bk,
        )
        return out
