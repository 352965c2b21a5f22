import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _linear_gelu_scale_kernel(
    x_ptr,
    w_ptr,
    shift_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_om,
    stride_on,
    scale,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(
            x_ptr + rm[:, None] * stride_xm + kk[None, :] * stride_xk,
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        # W is (N, K) as nn.Linear stores it; read the (BK, BN) tile of W^T.
        b = tl.load(
            w_ptr + rn[None, :] * stride_wn + kk[:, None] * stride_wk,
            mask=(kk[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(a, b, acc, input_precision="ieee")
    # Epilogue: learned bias, tanh-approximate GELU, constant scale.
    h = acc + tl.load(shift_ptr + rn, mask=rn < N, other=0.0)[None, :]
    u = 0.7978845608028654 * (h + 0.044715 * h * h * h)
    t = 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)  # tanh(u), saturating cleanly to +-1
    y = 0.5 * h * (1.0 + t) * scale
    tl.store(
        out_ptr + rm[:, None] * stride_om + rn[None, :] * stride_on,
        y,
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


def _block(n, cap):
    return max(16, min(cap, triton.next_power_of_2(n)))


class ModelNew(nn.Module):
    """One Triton kernel: tiled fp32 GEMM with the bias + tanh-GELU + scale epilogue applied to the tile."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features, bias=False)
        self.shift = nn.Parameter(0.5 * torch.randn(out_features))
        self.scale = scale

    def forward(self, x):
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        w = self.proj.weight.contiguous()
        m, k = x2.shape
        n = w.shape[0]
        out = torch.empty((m, n), device=x2.device, dtype=torch.float32)
        bm, bn, bk = _block(m, 64), _block(n, 64), _block(k, 32)
        grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
        _linear_gelu_scale_kernel[grid](
            x2,
            w,
            self.shift.contiguous(),
            out,
            m,
            n,
            k,
            x2.stride(0),
            x2.stride(1),
            w.stride(0),
            w.stride(1),
            out.stride(0),
            out.stride(1),
            float(self.scale),
            BM=bm,
            BN=bn,
            BK=bk,
        )
        return out.reshape(*lead, n)
