import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _matvec_kernel(mat_ptr, vec_ptr, out_ptr, M, K, stride_mm, stride_mk, stride_v, stride_o,
                   BM: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    row_mask = rows < M
    row_base = rows.to(tl.int64) * stride_mm
    # float64 partial sums: each lane adds K / BK products one after another, which in fp32 drifts by ~1e-4 on
    # a 65536-long row, outside the 1e-4 tolerance where the result is near zero (cuBLAS's reduction is more
    # accurate). The kernel is bound by reading the matrix, so the wider adds cost nothing measurable.
    acc = tl.zeros((BM, BK), dtype=tl.float64)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        col_mask = cols < K
        a = tl.load(mat_ptr + row_base[:, None] + cols[None, :] * stride_mk,
                    mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        x = tl.load(vec_ptr + cols * stride_v, mask=col_mask, other=0.0)
        acc += a.to(tl.float64) * x.to(tl.float64)[None, :]
    # One lane per column block position, summed once at the end: the row is streamed exactly once.
    tl.store(out_ptr + rows * stride_o, tl.sum(acc, axis=1).to(tl.float32), mask=row_mask)


class ModelNew(nn.Module):
    """Matrix-vector product: each Triton program streams a band of BM rows through K in BK-wide chunks."""

    def __init__(self):
        super().__init__()

    def forward(self, mat, vec):
        m, k = mat.shape
        out = torch.empty((m, 1), dtype=mat.dtype, device=mat.device)
        bm, bk = 8, 256
        _matvec_kernel[(triton.cdiv(m, bm),)](
            mat, vec, out, m, k, mat.stride(0), mat.stride(1), vec.stride(0), out.stride(0), BM=bm, BK=bk
        )
        return out
