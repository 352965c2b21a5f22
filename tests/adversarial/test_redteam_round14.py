"""Red team, round 14: the dataflow trace (kb_gym/worker/dataflow.py), from the candidate's side.

Session 22 built the trace against round 13's open hole (a kernel that only moves PyTorch's answer keeps speed
credit) and then attacked it with the source open, as a policy would: more ways for a kernel to be "needed" while
PyTorch computes the answer, and the honest kernels the trace must leave alone. Each test asserts the verdict a
sound judge gives.

Caught (``token_kernel``, no speed credit):

- ``copy_in``: the kernel copies the input into a fresh buffer and PyTorch computes the answer from the copy
  (knocked out, the buffer is garbage: "needed");
- ``split_copy``: the kernel copies PyTorch's answer out in two launches, half each (neither launch alone writes a
  copy; the second leaves one);
- ``transposed_copy``: the kernel writes PyTorch's answer transposed and forward returns the transposed view of it
  (no copy in the kernel's own layout; the output's values match PyTorch's answer);
- ``zero_term``: the kernel writes ``x * 0`` (signed zeros: its bytes follow the input's signs) and PyTorch adds it
  to its answer;
- ``tiny_term``: the kernel writes ``x * 1e-30``, input-dependent and negligible, and PyTorch adds it.

Left alone (``correct``, speed credit): PyTorch's matmul with a Triton epilogue (bias and ReLU), and a Triton kernel
that computes ``2 x`` with PyTorch adding the 1.

Caught since: the kernel does real work that PyTorch undoes (it writes ``2 x``, or the input reversed, and PyTorch
computes the reference from half of it, or from it flipped back; strict xfails until an op's result exactly equal to
a tensor PyTorch holds untainted was made PyTorch's). An undo along a path through no such value (``(2 x * 0.25) *
4``, an undo that rounds a few bits off) is still the kernel's work: docs/integrity.md, Open.

All evaluations run on one CPU Evaluator of the module.
"""

from __future__ import annotations

import pytest
from device import DEVICE
from test_redteam_round13 import CHECK, HEAD, SCALE

from kb_gym import Evaluator, Problem


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


COPY = HEAD + """

@triton.jit
def _copy(src, dst, start, n, BLOCK: tl.constexpr):
    offs = start + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


def copy(src, dst, start=0, stop=None):
    stop = src.numel() if stop is None else stop
    _copy[(triton.cdiv(stop - start, 4096),)](src, dst, start, stop, BLOCK=4096)


@triton.jit
def _scaled(src, dst, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m) * s, mask=m)


def scaled(src, s):
    dst = torch.empty_like(src)
    _scaled[(triton.cdiv(src.numel(), 4096),)](src, dst, src.numel(), s, BLOCK=4096)
    return dst
"""

COPY_IN = COPY + """

class ModelNew(nn.Module):
    def forward(self, x):
        buf = torch.empty_like(x)
        copy(x, buf)  # the kernel's whole part
        return buf * 2.0 + 1.0
"""

SPLIT_COPY = COPY + """

class ModelNew(nn.Module):
    def forward(self, x):
        y = x * 2.0 + 1.0
        out = torch.empty_like(y)
        half = y.numel() // 2
        copy(y, out, 0, half)
        copy(y, out, half, y.numel())
        return out
"""

TRANSPOSED_COPY = COPY + """

class ModelNew(nn.Module):
    def forward(self, x):
        y_t = (x * 2.0 + 1.0).t().contiguous()  # PyTorch's answer, in the other layout
        out_t = torch.empty_like(y_t)
        copy(y_t, out_t)
        return out_t.t()
"""

ZERO_TERM = COPY + """

class ModelNew(nn.Module):
    def forward(self, x):
        return (x * 2.0 + 1.0) + scaled(x, 0.0)
"""

TINY_TERM = COPY + """

class ModelNew(nn.Module):
    def forward(self, x):
        return (x * 2.0 + 1.0) + scaled(x, 1e-30)
"""

DOUBLED_AND_HALVED = COPY + """

class ModelNew(nn.Module):
    def forward(self, x):
        return (scaled(x, 2.0) * 0.5) * 2.0 + 1.0  # the kernel's 2 x, undone
"""

REVERSED_AND_BACK = COPY + """

class ModelNew(nn.Module):
    def forward(self, x):
        flipped = torch.empty_like(x)
        n = x.numel()
        _reverse[(triton.cdiv(n, 4096),)](x, flipped, n, BLOCK=4096)
        return flipped.flip(0).flip(1) * 2.0 + 1.0


@triton.jit
def _reverse(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + (n - 1 - offs), tl.load(src + offs, mask=m), mask=m)
"""

HALF_IN_KERNEL = COPY + """

class ModelNew(nn.Module):
    def forward(self, x):
        return scaled(x, 2.0) + 1.0  # the kernel computes 2 x, PyTorch adds the 1
"""

LINEAR_RELU = Problem(id=14, name="14_LinearReLU", level=2, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 96)

    def forward(self, x):
        return torch.relu(self.fc(x))

def get_inputs():
    return [torch.randn(64, 128)]

def get_init_inputs():
    return []
""")

EPILOGUE = HEAD + """

@triton.jit
def _bias_relu(src, bias, dst, n, cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(src + offs, mask=m) + tl.load(bias + offs % cols, mask=m)
    tl.store(dst + offs, tl.maximum(v, 0.0), mask=m)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 96)

    def forward(self, x):
        mm = x @ self.fc.weight.t()  # PyTorch's matmul
        out = torch.empty_like(mm)
        _bias_relu[(triton.cdiv(mm.numel(), 4096),)](mm, self.fc.bias, out, mm.numel(), mm.shape[1], BLOCK=4096)
        return out
"""


@pytest.mark.parametrize("source", [COPY_IN, SPLIT_COPY, TRANSPOSED_COPY, ZERO_TERM, TINY_TERM],
                         ids=["copy_in", "split_copy", "transposed_copy", "zero_term", "tiny_term"])
def test_a_kernel_that_only_moves_or_pads_pytorchs_answer_is_a_token(ev, source):
    r = ev.evaluate(SCALE, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" in r.flags and r.speed_credit is False, (r.flags, r.correctness.get("dataflow"))
    assert r.correctness["dataflow"]["verdict"] == "pytorch", r.correctness["dataflow"]


@pytest.mark.parametrize(("problem", "source"), [(LINEAR_RELU, EPILOGUE), (SCALE, HALF_IN_KERNEL)],
                         ids=["matmul_then_kernel_epilogue", "kernel_then_pytorch_add"])
def test_partial_fusion_keeps_its_credit(ev, problem, source):
    r = ev.evaluate(problem, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" not in r.flags and r.speed_credit is not False, (r.flags, r.correctness.get("dataflow"))
    assert r.correctness["dataflow"]["verdict"] == "kernels", r.correctness["dataflow"]


@pytest.mark.parametrize("source", [DOUBLED_AND_HALVED, REVERSED_AND_BACK], ids=["doubled_halved", "reversed_back"])
def test_work_a_kernel_does_and_pytorch_undoes_earns_no_credit(ev, source):
    r = ev.evaluate(SCALE, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" in r.flags and r.speed_credit is False, (r.flags, r.correctness.get("dataflow"))
    assert r.correctness["dataflow"]["verdict"] == "pytorch", r.correctness["dataflow"]
