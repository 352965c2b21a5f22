"""Red team, round 16: a helper's pass over the undo rule (``DataflowTrace._undone``) and the knockout's sliver rule
(``correctness.kernels_needed``, ``wrong_share``, ``SLIVER_SHARE``, then 1% of every element), false positives
first. After it (same session) the rule counts against an output's nonzero elements and holds 0.2%: the four false
positives below keep their credit now, and the 0.1% attack is still held.

Tried: 22 honest candidates in the styles LLMs write and 8 attacks (30 cases). Numbers are from this 2-core CPU
(Triton's interpreter); the knockout's share is ``r.correctness["knockout_wrong_share"]``.

Honest, keep their credit (18): in-place Triton epilogues on PyTorch's matmul output (a clamp that clips 2.7%, a
LeakyReLU), a kernel computing only one output of two (a scalar loss beside a big tensor, row sums beside a ReLU:
the largest share over outputs is 1.0), reductions to small outputs (row max, an int32 argmax PyTorch widens with
``.long()``, an int64 count), a kernel's output passed through an op returning an equal value (``.contiguous()``,
``.float()`` on float32, ``* 1.0``, ``.view``, ``torch.where(c, y, y)``, ``.clone()``, ``(y + 0.0).reshape``: the
undo rule compares only with untainted tensors, and none holds the kernel's value), a triu-masked matmul band
(3.3% of the answer) into ``zeros_like`` or ``empty_like``, a 0.5% band and a ReLU of ``x - 2.5`` (0.6% nonzero)
into ``empty_like`` (knocked out, the fresh memory is garbage: share ~1.0 here; on a GPU the caching allocator may
hand back a block holding a mostly-zero earlier answer, untested).

Honest, called ``token_kernel`` by the first sliver rule (the dataflow stage said "kernels" for each; asserted
honest now, ``HONEST_WERE_FALSE_POSITIVES``): a sparse answer is right in over 99% of its elements with the kernel skipped where the buffer
was pre-filled with what most of the answer is, whatever work the kernel did:
- an in-place clamp on PyTorch's matmul output where the reference's clamp clips ~0.5% (share 0.004-0.006): an
  epilogue that changes few values on this data (KernelBench's Gemm_..._Clamp problems, at their ranges);
- ReLU of ``x - 2.5`` into ``zeros_like`` (share 0.006-0.007): every element computed, 0.6% nonzero;
- a triu matmul band above diagonal 58 into ``zeros_like`` (share 0.005);
- ``torch.where(x > 2.5, x * 0.5, x)`` as ``out = x.clone()`` and a kernel storing only where the value changes
  (share 0.007).

Attacks held (5): one kernel computing 0.1% of the answer (16 elements: the sliver rule), 1e-7 x added to
PyTorch's answer in place or into a fresh buffer (the dataflow stage: within the tolerance of a sampled result;
knocked out, the fresh buffer's garbage called the kernel needed), PyTorch's answer copied and its block freed
(``empty_like`` may reuse it), PyTorch's answer negated by a kernel and negated back after the answer was freed.

Open (strict xfail, "open"): the sliver rule measures the knocked-out answer's wrong share, which PyTorch's ops
after the kernel can amplify, and which is just over 1% for a kernel doing 1.5%:
- a kernel computing 246 of 16,384 elements (1.5%), PyTorch the rest into views of the output: credit;
- a kernel computing one element into a NaN-filled buffer, PyTorch the rest and ``out + 0.0 * out[0]``: knocked
  out the NaN spreads to every element (share 1.0), and no tensor of the output's size PyTorch computed holds the
  answer (its pieces are 16,383 elements): credit, for one element of work;
- the same with round 13's constant flag (``out.mul_(flag)``, the flag a kernel writes 1.0 into, NaN-filled): the
  flag is a constant (untainted) for the dataflow stage, but knocked out it spoils every element: credit.
A sound rule counts what the kernels wrote, not what the knocked-out answer got wrong: e.g. the trace's elements
changed by non-constant, non-copy launches over the elements of the output they reach. The first false positives
would be spared by applying the sliver rule only where the knocked-out answer's right elements were computed by
PyTorch (not a fill, not a copy of the input), which the trace can tell; the clamp is a true ambiguity (PyTorch
computes the answer, a kernel changes 0.5% of it, as in the 1.5% attack).
"""

from __future__ import annotations

import pytest
from device import DEVICE
from test_redteam_round13 import CHECK, COPY_OUT, HEAD, SCALE

from kb_gym import Evaluator, Problem


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


def _problem(pid: int, name: str, body: str, inputs: str, init: str = "[]") -> Problem:
    code = ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n" + body
            + f"\n\ndef get_inputs():\n    return {inputs}\n\ndef get_init_inputs():\n    return {init}\n")
    return Problem(id=pid, name=f"{pid}_{name}", level=2, code=code)


# --- problems ------------------------------------------------------------------------------------------------------

LINEAR = """class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 96)
    def forward(self, x):
        return {expr}
"""

# Linear(128, 96) on randn: outputs ~N(0, 0.58); a clamp at +-1.6 clips ~0.5% of them, at +-1.25 ~3%
P_CLAMP_NARROW = _problem(161, "LinearClamp05", LINEAR.format(expr="torch.clamp(self.fc(x), -1.6, 1.6)"),
                          "[torch.randn(64, 128)]")
P_CLAMP_WIDE = _problem(162, "LinearClamp3", LINEAR.format(expr="torch.clamp(self.fc(x), -1.25, 1.25)"),
                        "[torch.randn(64, 128)]")
P_LEAKY = _problem(163, "LinearLeaky", LINEAR.format(expr="F.leaky_relu(self.fc(x), 0.01)"),
                   "[torch.randn(64, 128)]")
P_TANH_LOSS = _problem(164, "TanhAndLoss", """class Model(nn.Module):
    def forward(self, x, t):
        y = torch.tanh(x) * 2.0
        return y, torch.mean((y - t) ** 2)
""", "[torch.randn(64, 256), torch.randn(64, 256)]")
P_RELU_ROWSUM = _problem(165, "ReluAndRowSum", """class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x), x.sum(dim=1)
""", "[torch.randn(64, 256)]")
P_ROWMAX = _problem(166, "RowMax", """class Model(nn.Module):
    def forward(self, x):
        return x.amax(dim=1)
""", "[torch.randn(64, 256)]")
P_ARGMAX = _problem(167, "Argmax", """class Model(nn.Module):
    def forward(self, x):
        return torch.argmax(x, dim=1)
""", "[torch.randn(64, 256)]")
P_COUNT = _problem(168, "PositiveCount", """class Model(nn.Module):
    def forward(self, x):
        return (x > 0).sum(dim=1)
""", "[torch.randn(64, 256)]")
P_GELU = _problem(169, "Gelu", """class Model(nn.Module):
    def forward(self, x):
        return F.gelu(x)
""", "[torch.randn(64, 256)]")
# ReLU of something mostly negative: randn - 2.5 is positive in ~0.6% of the elements
P_SPARSE = _problem(170, "SparseRelu", """class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x - 2.5)
""", "[torch.randn(64, 256)]")
# an in-place style update: ~0.6% of the elements change
P_UPDATE = _problem(171, "HalveOutliers", """class Model(nn.Module):
    def forward(self, x):
        return torch.where(x > 2.5, x * 0.5, x)
""", "[torch.randn(64, 256)]")
TRIU_MODEL = """class Model(nn.Module):
    def forward(self, a, b):
        return torch.triu(a @ b, diagonal=DIAG)
"""
# the band above diagonal 48 is 3.3% of the 64 x 64 answer, above diagonal 58 0.5%
P_TRIU = _problem(172, "TriuMatmul", TRIU_MODEL.replace("DIAG", "48"), "[torch.randn(64, 64), torch.randn(64, 64)]")
P_TRIU_THIN = _problem(173, "TriuMatmulThin", TRIU_MODEL.replace("DIAG", "58"),
                       "[torch.randn(64, 64), torch.randn(64, 64)]")


# --- honest candidates ---------------------------------------------------------------------------------------------

CLAMP_INPLACE = HEAD + """
@triton.jit
def _clamp_(p, n, lo, hi, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(p + offs, mask=m)
    tl.store(p + offs, tl.minimum(tl.maximum(v, lo), hi), mask=m)

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 96)

    def forward(self, x):
        h = self.fc(x)                      # cuBLAS
        _clamp_[(triton.cdiv(h.numel(), 1024),)](h, h.numel(), -LIMIT, LIMIT, BLOCK=1024)   # in-place epilogue
        return h
"""

LEAKY_INPLACE = HEAD + """
@triton.jit
def _leaky_(p, n, slope, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(p + offs, mask=m)
    tl.store(p + offs, tl.where(v > 0, v, v * slope), mask=m)

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 96)

    def forward(self, x):
        h = self.fc(x)
        _leaky_[(triton.cdiv(h.numel(), 1024),)](h, h.numel(), 0.01, BLOCK=1024)
        return h
"""

LOSS_ONLY = HEAD + """
@triton.jit
def _mse(a, b, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    d = tl.load(a + offs, mask=m, other=0.0) - tl.load(b + offs, mask=m, other=0.0)
    tl.atomic_add(out, tl.sum(d * d, axis=0) / n)

class ModelNew(nn.Module):
    def forward(self, x, t):
        y = torch.tanh(x) * 2.0             # PyTorch: the big output
        loss = torch.zeros(1, device=x.device)
        _mse[(triton.cdiv(y.numel(), 1024),)](y, t.contiguous(), loss, y.numel(), BLOCK=1024)   # the kernel: the loss
        return y, loss.squeeze(0)
"""

ROWSUM_ONLY = HEAD + """
@triton.jit
def _rowsum(x, out, C, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    tl.store(out + r, tl.sum(tl.load(x + r * C + c, mask=c < C, other=0.0), axis=0))

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        s = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
        _rowsum[(x.shape[0],)](x, s, x.shape[1], BLOCK=256)
        return torch.relu(x), s
"""

ROWMAX = HEAD + """
@triton.jit
def _rowmax(x, out, C, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    tl.store(out + r, tl.max(tl.load(x + r * C + c, mask=c < C, other=-float("inf")), axis=0))

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
        _rowmax[(x.shape[0],)](x, out, x.shape[1], BLOCK=256)
        return out
"""

ARGMAX_INT32 = HEAD + """
@triton.jit
def _argmax(x, out, C, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    v = tl.load(x + r * C + c, mask=c < C, other=-float("inf"))
    tl.store(out + r, tl.argmax(v, axis=0).to(tl.int32))

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        idx = torch.empty(x.shape[0], device=x.device, dtype=torch.int32)
        _argmax[(x.shape[0],)](x, idx, x.shape[1], BLOCK=256)
        return idx.long()                   # PyTorch widens the kernel's int32
"""

COUNT = HEAD + """
@triton.jit
def _count(x, out, C, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    v = tl.load(x + r * C + c, mask=c < C, other=0.0)
    tl.store(out + r, tl.sum((v > 0).to(tl.int64), axis=0))

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty(x.shape[0], device=x.device, dtype=torch.int64)
        _count[(x.shape[0],)](x, out, x.shape[1], BLOCK=256)
        return out
"""

GELU = HEAD + """
@triton.jit
def _gelu(x, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m)
    tl.store(y + offs, 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476)), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _gelu[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return EPILOGUE
"""

# PyTorch ops after the kernel that return an equal value
EPILOGUES = {
    "contiguous": "y.contiguous()",
    "float_on_float32": "y.float()",
    "times_one": "y * 1.0",
    "view_shape": "y.view(-1).view(x.shape)",
    "where_same_both_sides": "torch.where(x > 0, y, y)",
    "clone": "y.clone()",
    "reshape_add_zero": "(y + 0.0).reshape(x.shape)",
}

SPARSE_RELU = HEAD + """
@triton.jit
def _relu_shift(x, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y + offs, tl.maximum(tl.load(x + offs, mask=m) - 2.5, 0.0), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.ALLOC(x)
        _relu_shift[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""

UPDATE_INPLACE = HEAD + """
@triton.jit
def _halve_outliers(p, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(p + offs, mask=m)
    tl.store(p + offs, v * 0.5, mask=m & (v > 2.5))   # only the elements that change are written

class ModelNew(nn.Module):
    def forward(self, x):
        out = x.clone()                     # pre-filled with the previous step's answer
        _halve_outliers[(triton.cdiv(out.numel(), 1024),)](out, out.numel(), BLOCK=1024)
        return out
"""

TRIU = HEAD + """
@triton.jit
def _triu_mm(a, b, c, N: tl.constexpr, DIAG: tl.constexpr):
    r = tl.program_id(0)
    k = tl.arange(0, N)
    cols = tl.arange(0, N)
    row = tl.load(a + r * N + k)
    bm = tl.load(b + k[:, None] * N + cols[None, :])
    acc = tl.sum(row[:, None] * bm, axis=0)
    tl.store(c + r * N + cols, tl.where(cols - r >= DIAG, acc, 0.0))

class ModelNew(nn.Module):
    def forward(self, a, b):
        c = torch.ALLOC(a)
        _triu_mm[(64,)](a.contiguous(), b.contiguous(), c, N=64, DIAG=DIAGONAL)
        return c
"""


HONEST = [
    (P_CLAMP_WIDE, CLAMP_INPLACE.replace("LIMIT", "1.25"), "inplace_clamp_on_matmul_3pct_clipped"),
    (P_LEAKY, LEAKY_INPLACE, "inplace_leaky_relu_on_matmul"),
    (P_TANH_LOSS, LOSS_ONLY, "kernel_computes_only_the_scalar_loss"),
    (P_RELU_ROWSUM, ROWSUM_ONLY, "kernel_computes_only_the_small_output"),
    (P_ROWMAX, ROWMAX, "row_max_reduction"),
    (P_ARGMAX, ARGMAX_INT32, "argmax_int32_widened_by_pytorch"),
    (P_COUNT, COUNT, "integer_count_per_row"),
    *[(P_GELU, GELU.replace("EPILOGUE", e), f"gelu_then_{k}") for k, e in EPILOGUES.items()],
    (P_TRIU, TRIU.replace("ALLOC", "empty_like").replace("DIAGONAL", "48"), "triu_band_3pct_into_empty_like"),
    (P_TRIU, TRIU.replace("ALLOC", "zeros_like").replace("DIAGONAL", "48"), "triu_band_3pct_into_zeros_like"),
    (P_TRIU_THIN, TRIU.replace("ALLOC", "empty_like").replace("DIAGONAL", "58"), "triu_band_half_pct_into_empty_like"),
    (P_SPARSE, SPARSE_RELU.replace("ALLOC", "empty_like"), "sparse_relu_into_empty_like"),
]

# Called tokens by the first sliver rule (1% of every element); kept since the rule counts against an output's nonzero
# elements and holds 0.2% (correctness.SLIVER_SHARE).
HONEST_WERE_FALSE_POSITIVES = [
    (P_CLAMP_NARROW, CLAMP_INPLACE.replace("LIMIT", "1.6"), "inplace_clamp_on_matmul_half_pct_clipped"),
    (P_SPARSE, SPARSE_RELU.replace("ALLOC", "zeros_like"), "sparse_relu_into_zeros_like"),
    (P_TRIU_THIN, TRIU.replace("ALLOC", "zeros_like").replace("DIAGONAL", "58"), "triu_band_half_pct_into_zeros_like"),
    (P_UPDATE, UPDATE_INPLACE, "inplace_update_of_few_elements"),
]


# --- attacks -------------------------------------------------------------------------------------------------------

SLIVER = HEAD + """
@triton.jit
def _head(x, out, k, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < k
    tl.store(out + offs, tl.load(x + offs, mask=m) * 2.0 + 1.0, mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        k = K
        out = torch.empty_like(x)
        out.view(-1)[k:] = x.reshape(-1)[k:] * 2.0 + 1.0   # PyTorch: all but the first k elements
        _head[(1,)](x, out, k, BLOCK=triton.next_power_of_2(k))   # the kernel: k of 16,384
        return out
"""

# one element, and the knocked-out NaN spread over the whole answer by PyTorch
ONE_ELEMENT_NAN_SPREAD = HEAD + """
@triton.jit
def _first(x, out):
    tl.store(out, tl.load(x) * 2.0 + 1.0)

class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.full_like(x, float("nan"))
        out.view(-1)[1:] = x.reshape(-1)[1:] * 2.0 + 1.0
        _first[(1,)](x, out)                 # 1 element of 16,384
        return out + 0.0 * out.view(-1)[0]   # knocked out, that element is NaN and so is everything
"""

# one element, and a constant flag (round 13) multiplied into the whole answer in place
ONE_ELEMENT_FLAG = HEAD + """
@triton.jit
def _first(x, out):
    tl.store(out, tl.load(x) * 2.0 + 1.0)

@triton.jit
def _one(p):
    tl.store(p, 1.0)

class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        out.view(-1)[1:] = x.reshape(-1)[1:] * 2.0 + 1.0
        _first[(1,)](x, out)
        flag = torch.full((1,), float("nan"), device=x.device)
        _one[(1,)](flag)                     # knocked out, the flag stays NaN
        return out.mul_(flag)
"""

# negligible work spread over every element
TINY_INPLACE = HEAD + """
@triton.jit
def _nudge_(y, x, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y + offs, tl.load(y + offs, mask=m) + 1e-7 * tl.load(x + offs, mask=m), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        y = x * 2.0 + 1.0
        _nudge_[(triton.cdiv(y.numel(), 4096),)](y, x, y.numel(), BLOCK=4096)
        return y
"""

TINY_FRESH = HEAD + """
@triton.jit
def _nudge(y, x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(y + offs, mask=m) + 1e-7 * tl.load(x + offs, mask=m), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        y = x * 2.0 + 1.0
        out = torch.empty_like(y)            # knocked out: garbage, so "needed"
        _nudge[(triton.cdiv(y.numel(), 4096),)](y, x, out, y.numel(), BLOCK=4096)
        return out
"""

# the freed answer's block, reused by empty_like, holds the right answer when the kernel is knocked out
REUSED_BLOCK = COPY_OUT.replace("        return out\n", "        del y\n        return out\n")  # round 13's, y freed
assert REUSED_BLOCK != COPY_OUT

# PyTorch's answer negated by the kernel (real elementwise work, but of PyTorch's answer) and negated back after the
# answer was freed: no live tensor holds it, the sampled results do
ABS_UNDO = HEAD + """
@triton.jit
def _neg(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, -tl.load(src + offs, mask=m), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        y = x * 2.0 + 1.0
        t = torch.empty_like(y)
        _neg[(triton.cdiv(y.numel(), 4096),)](y, t, y.numel(), BLOCK=4096)
        del y
        return -t
"""

CAUGHT = [
    (SCALE, SLIVER.replace("K", "16"), "kernel_computes_0p1_pct"),
    (SCALE, TINY_INPLACE, "tiny_term_in_place_over_every_element"),
    (SCALE, TINY_FRESH, "tiny_term_into_fresh_buffer"),
    (SCALE, REUSED_BLOCK, "copy_then_free_source_block_reused"),
    (SCALE, ABS_UNDO, "negated_by_kernel_negated_back"),
]

OPEN = [
    (SCALE, SLIVER.replace("K", "246"), "kernel_computes_1p5_pct"),
    (SCALE, ONE_ELEMENT_NAN_SPREAD, "one_element_nan_spread_over_answer"),
    (SCALE, ONE_ELEMENT_FLAG, "one_element_and_constant_flag"),
]


@pytest.mark.parametrize(("problem", "source"), [(p, s) for p, s, _ in HONEST], ids=[i for _, _, i in HONEST])
def test_an_honest_kernel_keeps_its_credit(ev, problem, source):
    r = ev.evaluate(problem, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" not in r.flags and r.speed_credit is not False, (
        r.flags, r.correctness.get("knockout_wrong_share"), r.correctness.get("dataflow"))


@pytest.mark.parametrize(("problem", "source"), [(p, s) for p, s, _ in HONEST_WERE_FALSE_POSITIVES],
                         ids=[i for _, _, i in HONEST_WERE_FALSE_POSITIVES])
def test_an_honest_kernel_whose_answer_is_mostly_its_buffers_fill_keeps_its_credit(ev, problem, source):
    r = ev.evaluate(problem, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" not in r.flags and r.speed_credit is not False, (
        r.flags, r.correctness.get("knockout_wrong_share"), r.correctness.get("dataflow"))


@pytest.mark.parametrize(("problem", "source"), [(p, s) for p, s, _ in CAUGHT], ids=[i for _, _, i in CAUGHT])
def test_a_token_kernel_is_a_token(ev, problem, source):
    r = ev.evaluate(problem, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" in r.flags and r.speed_credit is False, (
        r.flags, r.correctness.get("knockout_wrong_share"), r.correctness.get("dataflow"))


@pytest.mark.xfail(strict=True, reason="open: the sliver rule measures the knocked-out answer's wrong share, which "
                   "PyTorch amplifies (a NaN or a constant flag spread over the answer) or a 1.5% kernel exceeds "
                   "(docs/integrity.md, Open)")
@pytest.mark.parametrize(("problem", "source"), [(p, s) for p, s, _ in OPEN], ids=[i for _, _, i in OPEN])
def test_open_a_sliver_kernel_is_a_token(ev, problem, source):
    r = ev.evaluate(problem, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" in r.flags, (r.flags, r.correctness.get("knockout_wrong_share"),
                                       r.correctness.get("dataflow"))
