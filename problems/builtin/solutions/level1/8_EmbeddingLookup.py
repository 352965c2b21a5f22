import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _gather_rows_kernel(ids_ptr, table_ptr, dst_ptr, dim, BLOCK: tl.constexpr):
    pos = tl.program_id(0)
    row = tl.load(ids_ptr + pos)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    vals = tl.load(table_ptr + row * dim + cols, mask=mask, other=0.0)
    tl.store(dst_ptr + pos * dim + cols, vals, mask=mask)


class ModelNew(nn.Module):
    """Embedding lookup: one Triton program copies one table row per index."""

    def __init__(self, vocab, dim):
        super().__init__()
        self.table = nn.Embedding(vocab, dim)

    def forward(self, ids):
        idx = ids.contiguous().reshape(-1)
        weight = self.table.weight.contiguous()
        dim = weight.shape[1]
        out = torch.empty((idx.numel(), dim), device=weight.device, dtype=weight.dtype)
        block = triton.next_power_of_2(dim)
        _gather_rows_kernel[(idx.numel(),)](idx, weight, out, dim, BLOCK=block)
        return out.reshape(*ids.shape, dim)
