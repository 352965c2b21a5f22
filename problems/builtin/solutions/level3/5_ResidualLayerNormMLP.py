import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _gelu_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    # int64 offsets: batch * d_hidden may pass 2^31.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    h = tl.load(src_ptr + offs, mask=mask, other=0.0)
    tl.store(dst_ptr + offs, 0.5 * h * (1.0 + tl.erf(h * 0.7071067811865476)), mask=mask)


@triton.jit
def _row(x_ptr, d_ptr, cols, mask, ADD: tl.constexpr):
    v = tl.load(x_ptr + cols, mask=mask, other=0.0)
    if ADD:
        v += tl.load(d_ptr + cols, mask=mask, other=0.0)
    return v


@triton.jit
def _add_layer_norm_kernel(x_ptr, d_ptr, sum_ptr, w_ptr, b_ptr, y_ptr, n_cols, eps,
                           ADD: tl.constexpr, STORE_SUM: tl.constexpr, BLOCK: tl.constexpr):
    # One program per row, fp32: v = x (+ d), optionally written back as the new residual stream, and
    # y = LayerNorm(v). Mean, then variance about the mean (no E[v^2] - mean^2 cancellation), then the
    # affine write; the later passes reload x and d (cache hits) rather than read back their own store.
    row = tl.program_id(0).to(tl.int64) * n_cols
    x_ptr += row
    d_ptr += row
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        v = _row(x_ptr, d_ptr, cols, mask, ADD)
        if STORE_SUM:
            tl.store(sum_ptr + row + cols, v, mask=mask)
        acc += v
    mean = tl.sum(acc, axis=0) / n_cols
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        v = tl.where(mask, _row(x_ptr, d_ptr, cols, mask, ADD) - mean, 0.0)
        acc += v * v
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        v = _row(x_ptr, d_ptr, cols, mask, ADD)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row + cols, (v - mean) * rstd * w + b, mask=mask)


def _gelu(h):
    out = torch.empty_like(h)
    n = h.numel()
    _gelu_kernel[(triton.cdiv(n, 1024),)](h, out, n, BLOCK=1024)
    return out


def _add_layer_norm(x, d, norm, keep_sum):
    """LayerNorm(x + d) (or of x when d is None); also returns x + d when keep_sum, for the next residual."""
    m, n = x.shape
    y = torch.empty_like(x)
    s = torch.empty_like(x) if keep_sum else y  # y is only a placeholder pointer when nothing is stored
    block = min(4096, triton.next_power_of_2(n))
    _add_layer_norm_kernel[(m,)](
        x, x if d is None else d, s, norm.weight.contiguous(), norm.bias.contiguous(), y, n, float(norm.eps),
        ADD=d is not None, STORE_SUM=keep_sum, BLOCK=block, num_warps=8 if block >= 1024 else 4,
    )
    return s, y


class ModelNew(nn.Module):
    """cuBLAS GEMMs + bias as in eager; exact GELU in one Triton pass; each residual add fused into a LayerNorm."""

    def __init__(self, d_in, d_model, d_hidden, d_out, n_blocks):
        super().__init__()
        self.embed = nn.Linear(d_in, d_model)
        self.norms = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(n_blocks)])
        self.ups = nn.ModuleList([nn.Linear(d_model, d_hidden) for _ in range(n_blocks)])
        self.downs = nn.ModuleList([nn.Linear(d_hidden, d_model) for _ in range(n_blocks)])
        self.final_norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, d_out)

    def forward(self, feats):
        # The GEMMs are eager's own; what changes is the passes between them: eager's separate residual
        # add disappears into the LayerNorm that reads its result, and the last sum is never stored.
        lead = feats.shape[:-1]
        x = F.linear(feats.reshape(-1, feats.shape[-1]), self.embed.weight, self.embed.bias).contiguous()
        norms = [*self.norms, self.final_norm]
        _, y = _add_layer_norm(x, None, norms[0], keep_sum=False)
        for i, (up, down) in enumerate(zip(self.ups, self.downs, strict=True)):
            g = _gelu(F.linear(y, up.weight, up.bias).contiguous())
            d = F.linear(g, down.weight, down.bias).contiguous()
            x, y = _add_layer_norm(x, d, norms[i + 1], keep_sum=i + 1 < len(self.ups))
        out = F.linear(y, self.head.weight, self.head.bias)
        return out.reshape(*lead, out.shape[-1])
