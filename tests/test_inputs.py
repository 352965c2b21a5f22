"""The judge's inputs and its checks of whole outputs, built to hold one output's worth at a time (docs/evaluation.md,
"The judge's memory"): the same values as before, whatever a problem's layout or a reference's writes."""

from __future__ import annotations

import types
import weakref

import pytest
import torch

from kb_gym import Evaluator
from kb_gym.problems import Problem
from kb_gym.worker import checks
from kb_gym.worker.inputs import make_inputs, seed_all

LAYOUTS = {
    "contiguous": lambda: [torch.rand(64, 33)],
    "transposed": lambda: [torch.rand(33, 64).t()],
    "channels_last": lambda: [torch.rand(8, 3, 5, 7).to(memory_format=torch.channels_last)],
    "strided slice": lambda: [torch.rand(64, 66)[:, ::2]],
    "expanded": lambda: [torch.rand(5).expand(4, 5)],
    "two inputs and an integer": lambda: [torch.rand(16, 16), torch.randint(0, 9, (4,)), torch.rand(3)],
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_widened_inputs_are_three_times_randn_like_the_problems_own(layout, dtype):
    # the judge and every runner draw them with this one function, so a change of how is a change of what only if
    # the values move: they must stay randn_like(x) * 3 in x's layout, bit for bit, integers untouched
    module = types.SimpleNamespace(get_inputs=LAYOUTS[layout])
    got = make_inputs(module, 7, torch.device("cpu"), dtype, widen=True)
    seed_all(7)
    own = [x.to(dtype) if x.is_floating_point() else x for x in LAYOUTS[layout]()]
    want = [torch.randn_like(x) * 3 if x.is_floating_point() else x for x in own]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        assert torch.equal(g, w)


def test_the_widened_draw_comes_once_the_problems_own_input_is_gone(monkeypatch):
    """One input's worth at a time: the draw's buffer is taken only once nothing holds the problem's own input
    (an iterator's kept item did, and an H100 measured twice one input at the peak: tests/gpu/test_gpu_inputs.py)."""
    own: list[weakref.ref] = []

    def get_inputs():
        x, y = torch.rand(1000), torch.rand(10, 10)
        own.extend([weakref.ref(x), weakref.ref(y)])
        return [x, y]

    alive_at_draw: list[int] = []
    empty_strided = torch.empty_strided

    def watched(*args, **kwargs):
        alive_at_draw.append(sum(r() is not None for r in own))
        return empty_strided(*args, **kwargs)

    monkeypatch.setattr(torch, "empty_strided", watched)
    got = make_inputs(types.SimpleNamespace(get_inputs=get_inputs), 3, torch.device("cpu"), torch.float32, widen=True)
    assert [t.shape for t in got] == [(1000,), (10, 10)]
    # the first draw with the second input alive (its turn is next), the second with none
    assert alive_at_draw == [1, 0], alive_at_draw


def test_all_finite_reads_every_slice(monkeypatch):
    monkeypatch.setattr(checks, "CHUNK", 10)
    x = torch.randn(95)
    assert checks.all_finite(x)
    for bad in (float("inf"), float("-inf"), float("nan")):
        y = x.clone()
        y[93] = bad  # in the last, short slice
        assert not checks.all_finite(y)
    z = torch.randn(40, dtype=torch.complex64)
    assert checks.all_finite(z)
    z[37] = complex(0.0, float("nan"))  # the imaginary part counts
    assert not checks.all_finite(z)
    assert checks.all_finite(torch.empty(0))


def _problem(forward: str, inputs: str) -> Problem:
    code = f"""
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
{forward}

def get_inputs():
    return [{inputs}]

def get_init_inputs():
    return []
"""
    return Problem(id=1, name="1_InPlace", level=1, code=code, size="cpu")


def _candidate(forward: str) -> str:
    return f"""
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
{forward}
"""


def test_a_reference_writing_to_its_inputs_leaves_the_trials_theirs():
    # The reference's forward gets inputs of its own and the comparisons' are made again from the seed (no clone
    # held beside them). A reference that doubles its input in place must still be judged against the untouched
    # input: an honest candidate is correct, and returning the input (already doubled or not) is not.
    problem = _problem("        x.mul_(2)\n        return x", "torch.randn(64, 128)")
    with Evaluator("cpu", results_path=False) as ev:
        honest = ev.evaluate(problem, _candidate("        return x * 2"))
        in_place = ev.evaluate(problem, _candidate("        return x.mul_(2)"))
        the_input = ev.evaluate(problem, _candidate("        return x.clone()"))
    assert honest.status == "correct", honest.error
    assert in_place.status == "correct", in_place.error
    # judged against the doubled input, the answer itself would be a "trivial output": every honest kernel unverifiable
    for r in (honest, in_place):
        assert not {"degenerate_problem", "unverifiable_output"} & set(r.flags), r.flags
    assert the_input.status == "incorrect", the_input.status


def test_an_identity_problem_still_gets_its_widened_trial():
    # ReLU of torch.rand is its input: the widened trial (3 x randn, drawn as above) tells a kernel from a copy
    problem = _problem("        return torch.relu(x)", "torch.rand(64, 128)")
    with Evaluator("cpu", results_path=False) as ev:
        honest = ev.evaluate(problem, _candidate("        return torch.clamp_min(x, 0.0)"))
        copy = ev.evaluate(problem, _candidate("        return x.clone()"))
    assert honest.status == "correct", honest.error
    assert honest.correctness.get("widened_trial") is True
    assert copy.status == "incorrect" and "both signs" in (copy.error or ""), copy.error
