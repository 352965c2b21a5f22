import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _linear_residual_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    res_ptr,
    h_ptr,
    ssq_ptr,
    M,
    N,
    K,
    n_col_blocks,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_rm,
    stride_rn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    """h = x @ W^T + b + residual for one (BM, BN) tile, plus each row's partial sum of h^2 over the tile."""
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
        b = tl.load(
            w_ptr + rn[None, :] * stride_wn + kk[:, None] * stride_wk,
            mask=(kk[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(a, b, acc, input_precision="ieee")
    m_mask = rm < M
    n_mask = rn < N
    tile_mask = m_mask[:, None] & n_mask[None, :]
    h = acc + tl.load(b_ptr + rn, mask=n_mask, other=0.0)[None, :]
    h += tl.load(res_ptr + rm[:, None] * stride_rm + rn[None, :] * stride_rn, mask=tile_mask, other=0.0)
    h = tl.where(tile_mask, h, 0.0)
    tl.store(h_ptr + rm[:, None] * N + rn[None, :], h, mask=tile_mask)
    tl.store(ssq_ptr + rm * n_col_blocks + pid_n, tl.sum(h * h, axis=1), mask=m_mask)


@triton.jit
def _rms_scale_kernel(h_ptr, ssq_ptr, w_ptr, out_ptr, N, n_col_blocks, eps, BLOCK: tl.constexpr):
    """One program per row: add up the row's partial sums of squares, then write h * rsqrt(mean + eps) * w."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for j0 in range(0, n_col_blocks, BLOCK):
        j = j0 + offs
        total += tl.load(ssq_ptr + row * n_col_blocks + j, mask=j < n_col_blocks, other=0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(total, axis=0) / N + eps)
    for c0 in range(0, N, BLOCK):
        c = c0 + offs
        mask = c < N
        h = tl.load(h_ptr + row * N + c, mask=mask, other=0.0)
        w = tl.load(w_ptr + c, mask=mask, other=0.0)
        tl.store(out_ptr + row * N + c, h * rstd * w, mask=mask)


def _block(n, cap):
    return max(16, min(cap, triton.next_power_of_2(n)))


class ModelNew(nn.Module):
    """Triton GEMM whose epilogue adds the bias and the residual and emits per-tile row sums of squares;
    a second Triton kernel finishes the RMS and applies the gain."""

    def __init__(self, in_features, out_features, eps):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features)
        self.weight = nn.Parameter(1.0 + 0.3 * torch.randn(out_features))
        self.eps = eps

    def forward(self, x, residual):
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        w = self.proj.weight.contiguous()
        m, k = x2.shape
        n = w.shape[0]
        res = residual.reshape(m, n).contiguous()
        bm, bn, bk = _block(m, 64), _block(n, 64), _block(k, 32)
        n_col_blocks = triton.cdiv(n, bn)
        h = torch.empty((m, n), device=x2.device, dtype=torch.float32)
        ssq = torch.empty((m, n_col_blocks), device=x2.device, dtype=torch.float32)
        _linear_residual_kernel[(triton.cdiv(m, bm), n_col_blocks)](
            x2,
            w,
            self.proj.bias.contiguous(),
            res,
            h,
            ssq,
            m,
            n,
            k,
            n_col_blocks,
            x2.stride(0),
            x2.stride(1),
            w.stride(0),
            w.stride(1),
            res.stride(0),
            res.stride(1),
            BM=bm,
            BN=bn,
            BK=bk,
        )
        out = torch.empty_like(h)
        block = min(1024, triton.next_power_of_2(n))
        _rms_scale_kernel[(m,)](h, ssq, self.weight.contiguous(), out, n, n_col_blocks, float(self.eps), BLOCK=block)
        return out.reshape(*lead, n)
