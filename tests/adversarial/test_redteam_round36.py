"""Red team, round 36: the last two sessions' changes, read from the candidate's side: the input-mutation read after
every timed call (``runner.Runner._inputs``/``last_inputs``/``_changed``, ``RunnerProcess.inputs_mutated``,
``timing.PairedTiming.mutated``, ``judge_timing.retime``), the zeros trivial output as a stride-0 view
(``correctness.trivial_outputs``, ``timed_checks.check_chunks``, ``checks.degenerate_bound``/``_compare_tensor``), the
float64 opinion's quick pass on this input's rounding alone (``float64._this_input_only``, ``spread_of``, ``_opinion``'s
``quick``, ``judge``, ``judge_chunks``), and the neighbour pause watch begun at the candidate's load rather than before
``runner.prepare`` (``worker/job.py``, ``worker/neighbours.py``).

Each test asserts what a sound judge does. Holes were ``xfail(strict=True)``; each failed its sound assertion on 3 of 3
runs of this file with ``--runxfail``. Both findings were fixed the same session (46), the xfails taken off. Numbers are from this 2-core CPU (``Evaluator("cpu")``, Triton under the
interpreter; ``float64.judge``/``judge_chunks`` called directly on the judge's own arithmetic).

GOT THROUGH (holes):

1. ``test_writing_over_the_input_and_putting_it_back_after_done_is_flagged``. The timed calls' check compares the
   inputs with the same inputs made again from their seed once the call's outputs are the judge's: after "done", in a
   separate "inputs" exchange (``Runner._inputs``). Between the two the runner drops the call's outputs at the end of
   ``_respond`` (``out``, ``flat``), and dropping them runs the candidate's code: a generator parked in an attribute of
   the returned tensor (``y.later = gen``, a plain tensor: no subclass, no dunder) runs its ``finally`` when the
   tensor's last reference goes, by reference count, with the garbage collector off or on. There it makes the input
   again from the call's seed (``torch.initial_seed()`` is the call's seed in ``forward``; ``torch.manual_seed`` and
   the problem's own ``get_inputs`` line) and copies it back over the input, outside the event time and the envelope.
   A Triton kernel that writes its answer over its input in every call after the trials (told apart by their seeds,
   round 31) and returns a view of it: ``correct``, no flag, ``speed_credit`` True under ``strict`` (no static finding:
   ``static_findings`` is empty), 3 of 3; the same kernel without the put-back (the generator never started) is
   ``input_mutation``, no credit (held below). The comparison is made after the candidate's last chance to run code, not
   before it: nothing of the call (its outputs, the collector's switch) is held until the "inputs" reply. What the write
   over the input buys is small on its own (an output allocation); the flag is what ``strict`` prices, and round 31
   made it a hole. Fix (``runner.Runner._call``/``_respond``/``_inputs``): keep the call's outputs (``out`` and
   ``flat``) referenced, and the collector off (a finaliser in a reference cycle runs at a collection, which the
   inputs' remaking may start), until the "inputs" reply is sent (``last_inputs`` can hold them); or compare in
   ``_respond`` once the events stop, before "done" (inside the envelope, calibrated on the spare the same way).
   FIXED (session 46): ``Runner._call`` keeps what the forward returned (``last_outputs``) and the collector off until
   the "inputs" reply is sent (or the judge's next command: ``_release_call``); the put-back runs after the
   comparison: ``input_mutation``, no credit.

FALSE POSITIVES (honest candidates judged wrong):

2. ``test_an_honest_kernel_on_inputs_holding_nan_is_not_flagged_input_mutation`` and
   ``test_the_mutation_check_reads_nan_inputs_as_unchanged``. ``runner._changed`` compares with ``torch.equal``, which
   is False wherever a tensor holds NaN (NaN != NaN, even a tensor against itself). On a problem whose inputs hold NaN
   (a ``nan_to_num``/``nansum``/masked-mean problem: ``x[x > 2] = nan``), an honest out-of-place Triton kernel is
   flagged ``input_mutation`` in its trials (the copy) and in every timed call (the inputs made again), and loses its
   speed credit under ``strict`` (``correct``, flags ``['input_mutation']``, 3 of 3). Fix (``runner._changed``): an
   exact comparison that counts NaN equal to NaN (``torch.equal`` on the bits, ``a.view(int dtype)``, or ``(a == b) |
   (a.isnan() & b.isnan())``). FIXED (session 46): ``runner._same``, NaN where NaN was counts as unchanged.

HELD (plain tests):

- Writing over the input in the warm-up call alone is ``input_mutation`` (the warm-up's inputs are read too), and so
  is hole 1's kernel without its put-back (the generator never started), 3 of 3 each.
- The stride-0 zeros are judged exactly as real zeros: ``compare_outputs`` (verdict, reason, degenerate, unverifiable,
  relative L2) and ``degenerate_bound`` gave the same answer with the view and with ``torch.zeros_like`` on 0-d, empty,
  size-1 dimensions, transposed, channels-last, expanded (a stride-0 reference), float16, bfloat16, float64 and
  complex64 outputs, near zero (degenerate) and plain, for honest, zero and halved answers (0 differences of 120);
  ``check_chunks`` (chunks at the start, the middle and a short tail, the inputs and the last answer beside them) the
  same with ``trivial_outputs`` giving real zeros (0 of 48); the float64 opinion's ``unverifiable`` test of the zeros
  too. All values are 0 and every comparison flattens by ``reshape(-1)`` in logical order, so no layout can tell them
  apart; the view only changes what the judge allocates. End to end, zeros after the trials on a degenerate problem
  with spot-checked timed outputs (1 MB output, 16 KB chunks) are ``incorrect`` (``timing_mismatch``), 3 of 3.
- The quick pass is a pass of the sampled opinion. Cancelling row sums (``1000 randn(4096, 64)``) moved on 1-6 rows
  by 0.8-1.5x the quick check's per-element bound (50x this input's error there plus the tolerance) or its
  whole-output bound (3x the largest error plus the tolerance), at the rows where the per-element bound is tightest,
  loosest and at random: whole outputs, 564 opinions over 6 inputs, 192 quick passes, 0 verdicts that differ from the
  forced sampled opinion (``_this_input_only`` returning None); drawn chunks, 200 opinions over 3 inputs, 30 quick
  passes, 0 differ (pinned on 2 inputs: 144/58 and 108/30). Every bound of the quick check is at most the sampled one
  (each element's scale is the first of the samples' maxima, the count and L2 allowances have no sampled share), and
  it must pass the unsampled whole-output bound too. Where the samples cannot be had (``state["spread_failed"]``:
  "memory" keeps the fp32 verdict, "reference" does where the reference is not inexact) the quick pass still runs,
  before the sampling, and can pass where the fallback would have failed; what it passes is what the samples would
  have passed (the implication above), and it does not lift round 33's ``WRONG_SMALL_ROWS`` (rows wrong by a fifth of
  their value) with the job's samples failed for memory (2 of 2 inputs ``incorrect``). A divergence from the
  fallback's verdict, not a forgiveness.
- The neighbour watch from the load on: with the device's ``measure`` file held (another judge measuring), the
  candidate's import begins only after the measurement ends (the runner's ``prepare`` meanwhile is the judge's code:
  the problem's reference and the memfd), and the load's deadline leaves the pause out (``paused_loading``). Nothing of
  the candidate runs before ``load``: the runner is a pristine fork, the spare never loads a candidate, and what the
  judge does before the watch (``prepare``, ``pch.verify``, ``triton_launchers.seed``, ``triton_cache.restore``; with
  ``KB_GYM_CPU_CLOCK=1`` the own runner's ``_own_harness``, 8 timed reference calls per input kind) is the judge's
  work on the problem. Read, not tested: ``triton_cache.restore`` copies up to ``ENTRY_MAX_BYTES`` of what an earlier
  runner of the same source left in its Triton cache (a ``.cubin`` needed), in the judge, before the watch; it was
  never inside the watch (the watch stops the runner's tree, not the judge) and is GPU-only.

Read, not made into tests: the burst (``Runner._burst``) and the probe passes' timed calls (``probe_check``) are never
asked "inputs"; writing over inputs there buys nothing (a burst and a probe only charge time, and the claim comes from
the loop's timed calls, which are asked). The report is the runner's (candidate territory): replacing
``Runner._inputs``/``_changed`` through the runner's module is the rounds 20-22 route, ``harness_patch`` or
``dynamic_code`` under ``strict``. ``_changed`` is value equality: a forward that flips the sign of a zero input is not
seen (it buys nothing). Older code met on the way: ``check_chunks``'s joint bound over the drawn chunks computes
``rel_l2`` of complex chunks through ``.double()``, which drops the imaginary parts (PyTorch warns); each chunk's own
comparison holds both parts, so only the joint estimate is blind to them.

Time: 33-37 s for the file on this 2-core machine (3 runs; the neighbour test ~15 s of it).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch
from device import DEVICE
from test_redteam_round12 import SCALE  # x * 2 + 1 on 64 x 256
from test_redteam_round31 import TIMED
from test_redteam_round33 import MIXED_ROW_SUM, WRONG_SMALL_ROWS
from test_redteam_round35 import _module

from kb_gym import EvalConfig, Evaluator, Problem, get_problem, load_problems
from kb_gym.integrity import static_findings
from kb_gym.worker import float64, neighbours, runner, timed_checks
from kb_gym.worker.checks import compare_outputs, degenerate_bound, judge_against_float64
from kb_gym.worker.correctness import trivial_outputs
from kb_gym.worker.inputs import make_inputs
from kb_gym.worker.spot_check import SampledOutputs

CPU = torch.device("cpu")
TOL = (1e-4, 1e-4)
HEAD = "import torch\nimport torch.nn as nn\n"
TRITON_HEAD = HEAD + "import triton\nimport triton.language as tl\n"


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


# --- 1. the input written over in the call and put back after "done" -------------------------------------------------

SCALE_KERNEL = TRITON_HEAD + """

@triton.jit
def _scale_shift(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)
"""
PUT_BACK = SCALE_KERNEL + """

def _put_back(x, seed):
    try:
        yield
    finally:  # the output's last reference gone: the runner has sent "done" and the bytes
        torch.manual_seed(seed)
        x.copy_(torch.randn(64, 256, device=x.device))  # the problem's own get_inputs, from the call's seed


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.job_seed = torch.initial_seed()  # init_model seeded the generator with the job's seed

    def forward(self, x):
        x = x.contiguous()
        n = x.numel()
        if 1 <= torch.initial_seed() - self.job_seed <= 5:  # a trial (the job's seed + 1 + k): out of place
            y = torch.empty_like(x)
            _scale_shift[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
            return y
        _scale_shift[(triton.cdiv(n, 1024),)](x, x, n, BLOCK=1024)  # the answer written over the input
        y = x.view(x.shape)
        later = _put_back(x, torch.initial_seed())
        next(later)
        y.later = later
        return y
"""
WARM_UP_ONLY = SCALE_KERNEL + """

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.job_seed = torch.initial_seed()
        self.after_trials = 0

    def forward(self, x):
        x = x.contiguous()
        n = x.numel()
        if not 1 <= torch.initial_seed() - self.job_seed <= 5:
            self.after_trials += 1
        # the first call after the trials and the rerun is the timing loop's warm-up
        y = x if self.after_trials == 1 else torch.empty_like(x)
        _scale_shift[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        return y
"""


def test_the_put_back_has_no_static_finding():
    assert static_findings(PUT_BACK) == []


def test_writing_over_the_input_and_putting_it_back_after_done_is_flagged(ev):
    r = ev.evaluate(SCALE, PUT_BACK, config=TIMED)
    # a sound judge: rejected, or incorrect, or flagged (no speed credit under strict)
    assert r.status != "correct" or "input_mutation" in r.flags, (r.status, r.flags, r.speed_credit)


def test_without_the_put_back_the_same_kernel_is_flagged(ev):
    """The control: the generator never started, the input stays written over."""
    r = ev.evaluate(SCALE, PUT_BACK.replace("        next(later)\n        y.later = later\n", ""), config=TIMED)
    assert r.status == "correct", (r.status, r.error)
    assert "input_mutation" in r.flags and r.speed_credit is False, (r.flags, r.speed_credit)


def test_writing_over_the_input_in_the_warm_up_alone_is_flagged(ev):
    r = ev.evaluate(SCALE, WARM_UP_ONLY, config=TIMED)
    assert r.status == "correct", (r.status, r.error)
    assert "input_mutation" in r.flags and r.speed_credit is False, (r.flags, r.speed_credit)


# --- 2. NaN in the inputs reads as a write --------------------------------------------------------------------------

NAN_INPUTS = Problem(id=36, name="36_NanToZeroTwice", level=1, code=HEAD + '''

class Model(nn.Module):
    """NaN read as 0, then doubled: the inputs hold NaN (about 2% of them)."""

    def forward(self, x):
        return torch.nan_to_num(x, nan=0.0) * 2.0


def get_inputs():
    x = torch.randn(64, 256)
    x[x > 2.0] = float("nan")
    return [x]


def get_init_inputs():
    return []
''')
NAN_KERNEL = TRITON_HEAD + """

@triton.jit
def _nan_to_zero_twice(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.where(x != x, 0.0, x) * 2.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)  # out of place: the input is only read
        _nan_to_zero_twice[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""


def test_the_mutation_check_reads_nan_inputs_as_unchanged():
    x = make_inputs(_module(NAN_INPUTS.code, "round36_nan"), 7, CPU, torch.float32)[0]
    assert bool(x.isnan().any())
    assert not runner._changed([x], [x.clone()])


def test_an_honest_kernel_on_inputs_holding_nan_is_not_flagged_input_mutation(ev):
    r = ev.evaluate(NAN_INPUTS, NAN_KERNEL, config=TIMED)
    assert r.status == "correct", (r.status, r.error)
    assert "input_mutation" not in r.flags, (r.flags, r.speed_credit)


# --- 3. the zeros as a stride-0 view -----------------------------------------------------------------------------------

def _layouts() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(36)

    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype)

    return {
        "0-d": randn(()), "empty": randn(0, 5), "size-1 dims": randn(1, 257, 1), "transposed": randn(64, 48).t(),
        "channels_last": randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last),
        "expanded": randn(64, 1).expand(64, 32), "float16": randn(40, 33).half(), "bfloat16": randn(40, 33).bfloat16(),
        "float64": randn(40, 33, dtype=torch.float64), "complex64": randn(40, 33, dtype=torch.complex64),
    }


def _scaled(base: torch.Tensor, scale: float) -> torch.Tensor:
    """``base * scale`` in ``base``'s layout (an elementwise product of an expanded tensor is dense: expanded again)."""
    if base.dim() and not all(base.stride()) and base.numel() > 1:
        return (base[:, :1] * scale).expand(base.shape)
    return base * scale


def _said(cmp) -> tuple:
    return cmp.ok, cmp.reason, cmp.degenerate, cmp.unverifiable, cmp.answers_coincide, round(cmp.rel_l2, 12)


def _answers(ref: torch.Tensor) -> dict[str, torch.Tensor]:
    noise = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=ref.dtype)
    return {"honest": ref + 1e-9 * noise if ref.numel() else ref.clone(), "zeros": torch.zeros_like(ref),
            "halved": ref * 0.5}


def test_the_zeros_view_is_judged_as_real_zeros_in_every_layout():
    differ, compared = [], 0
    for name, base in _layouts().items():
        for scale in (1e-6, 1.0):  # near zero (zeros pass the tolerance: degenerate), and plain
            ref = _scaled(base, scale)
            view = trivial_outputs(ref, [])[0]
            assert view.shape == ref.shape and (not any(view.stride()) or not ref.numel())
            full = torch.zeros_like(ref)
            for answer_name, answer in _answers(ref).items():
                compared += 2
                if _said(compare_outputs(answer, ref, *TOL, trivial=[view])) != _said(
                        compare_outputs(answer, ref, *TOL, trivial=[full])):
                    differ.append((name, scale, answer_name, "compare_outputs"))
                if degenerate_bound(ref, [view], [], *TOL) != degenerate_bound(ref, [full], [], *TOL):
                    differ.append((name, scale, answer_name, "degenerate_bound"))
    assert not differ, differ
    assert compared >= 100


@pytest.mark.filterwarnings("ignore:Casting complex values to real")  # check_chunks's joint rel_l2 (docstring)
def test_the_zeros_view_and_real_zeros_give_drawn_chunks_the_same_verdict(monkeypatch):
    """check_chunks makes the trivial outputs itself: once with the view, once with trivial_outputs giving real zeros."""
    differ, compared = [], 0
    for name, base in _layouts().items():
        if base.numel() < 64:
            continue
        x = torch.randn(base.shape, generator=torch.Generator().manual_seed(2)).to(base.dtype)
        for scale in (1e-6, 1.0):
            ref = _scaled(base, scale)
            last = [ref * 1.0001]  # the last call's answer beside them
            n, total = 16, ref.numel()
            firsts = [0, total // 2 - 7, total - 5]  # the start, the middle, a short tail
            meta = [{"shape": list(ref.shape), "dtype": str(ref.dtype).removeprefix("torch."),
                     "nbytes": total * ref.element_size()}]
            for answer_name, answer in _answers(ref).items():
                flat = answer.reshape(-1)
                sample = SampledOutputs(meta, [(0, f, flat[f:f + n].clone()) for f in firsts])
                with_view = timed_checks.check_chunks(sample, ref, *TOL, [x], last)
                with monkeypatch.context() as m:
                    real = timed_checks.trivial_outputs
                    m.setattr(timed_checks, "trivial_outputs", lambda out, inputs, real=real: [
                        torch.zeros_like(out), *real(out, inputs)[1:]])
                    with_full = timed_checks.check_chunks(sample, ref, *TOL, [x], last)
                compared += 1
                if with_view != with_full:
                    differ.append((name, scale, answer_name, with_view, with_full))
    assert not differ, differ
    assert compared >= 40


def test_zeros_as_trivial_outputs_of_the_float64_opinion_are_judged_as_real_zeros():
    g = torch.Generator().manual_seed(3)
    x = 1e-7 * torch.randn(512, 64, generator=g)
    ref = x.sum(1)
    exact = x.double().sum(1).float()
    for answer in (exact, torch.zeros_like(ref), exact * 0.9):
        view = trivial_outputs(ref, [])[0]
        said = judge_against_float64(answer, ref, [exact], *TOL, trivial=[view])
        full = judge_against_float64(answer, ref, [exact], *TOL, trivial=[torch.zeros_like(ref)])
        assert _said(said) == _said(full)


TINY = Problem(id=37, name="37_TinyTanh", level=1, code=HEAD + '''

class Model(nn.Module):
    """Values under the absolute tolerance everywhere: zeros pass it (a degenerate output)."""

    def forward(self, x):
        return 1e-6 * torch.tanh(x)


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []
''')
ZEROS_AFTER_THE_TRIALS = HEAD + """

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.job_seed = torch.initial_seed()

    def forward(self, x):
        if 1 <= torch.initial_seed() - self.job_seed <= 5:
            return 1e-6 * torch.tanh(x)
        return torch.zeros_like(x)
"""


def test_zeros_after_the_trials_fail_the_spot_checked_timed_calls_of_a_degenerate_problem(ev):
    config = TIMED.replace(integrity="off", timed_output_sample_bytes=64 << 10)  # 1 MB outputs: drawn chunks
    r = ev.evaluate(TINY, ZEROS_AFTER_THE_TRIALS, config=config)
    assert r.correctness.get("timed_output_check", {}).get("chunk_bytes"), r.correctness
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.flags, r.error)


# --- 4. the float64 opinion's quick pass ------------------------------------------------------------------------------

class RowSum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(1)


def _moved(x: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor) -> dict[str, torch.Tensor]:
    """Answers moved on a few rows by 0.8-1.5x the quick check's bounds: the per-element one (50x this input's error
    there plus the tolerance) and the whole-output one (3x the largest error plus the tolerance), where the per-element
    bound is tightest, loosest, and at random rows."""
    scale = (ref.double() - exact.double()).abs()
    tol = TOL[0] + TOL[1] * exact.double().abs()
    worst = float(scale.max())
    order = torch.argsort(scale / tol)
    places = {"tightest": order[:6], "loosest": order.flip(0)[:6],
              "random": torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(5))[:6]}
    out = {}
    for where, rows in places.items():
        for f in (0.8, 0.99, 1.01, 1.5):
            for m in (1, 4, 6):
                own, far = exact.double().clone(), exact.double().clone()
                own[rows[:m]] += f * (50 * scale[rows[:m]] + tol[rows[:m]])
                far[rows[:m]] -= f * (3 * worst + tol[rows[:m]])
                out[f"{where}_own_{f}_{m}"], out[f"{where}_far_{f}_{m}"] = own.float(), far.float()
    return out


def _quick_then_sampled(monkeypatch, judge) -> tuple[int, int, list[str]]:
    """(opinions, quick passes, where the verdicts differ) of ``judge(result)`` against the same with the quick pass
    off (the sampled opinion forced)."""
    opinions = quick = 0
    differ = []
    for key, run in judge():
        fast = {"flags": []}
        verdict = run(fast)
        if "judged_against_float64" not in fast.get("correctness", {}):
            continue  # not a narrow miss, or the reference exact here: no opinion
        with monkeypatch.context() as m:
            m.setattr(float64, "_this_input_only", lambda *a, **k: None)
            full = {"flags": []}
            again = run(full)
        assert full["correctness"].get("float64_sampled") == 1 and "float64_quick" not in full["correctness"]
        opinions += 1
        quick += fast["correctness"].get("float64_quick", 0)
        if verdict.ok != again.ok:
            differ.append(key)
    return opinions, quick, differ


def test_a_quick_pass_of_answers_moved_to_its_bounds_is_a_pass_of_the_sampled_opinion(monkeypatch):
    model = RowSum()

    def cases():
        for seed in range(2):
            x = 1000 * torch.randn(4096, 64, generator=torch.Generator().manual_seed(seed))
            ref, exact = model(x), x.double().sum(1).float()
            for name, cand in _moved(x, ref, exact).items():
                yield (seed, name), lambda result, x=x, ref=ref, cand=cand: float64.judge(
                    CPU, model, [x], cand, ref, *TOL, result, {})

    opinions, quick, differ = _quick_then_sampled(monkeypatch, cases)
    assert not differ, differ
    assert opinions >= 100 and quick >= 30, (opinions, quick)  # both paths taken, passes and failures


def test_a_quick_pass_of_drawn_chunks_is_a_pass_of_the_sampled_opinion(monkeypatch):
    model = RowSum()
    firsts = [0, 1024, 2048, 3072]

    def drawn(out: torch.Tensor) -> SampledOutputs:
        meta = [{"shape": list(out.shape), "dtype": "float32", "nbytes": out.numel() * 4}]
        return SampledOutputs(meta, [(0, f, out.reshape(-1)[f:f + 512].clone()) for f in firsts])

    def cases():
        for seed in range(2):
            x = 1000 * torch.randn(4096, 64, generator=torch.Generator().manual_seed(seed))
            ref, exact = model(x), x.double().sum(1).float()
            for name, cand in _moved(x, ref, exact).items():
                yield (seed, name), lambda result, x=x, ref=ref, cand=cand: float64.judge_chunks(
                    CPU, model, [x], ref, drawn(cand), *TOL, result, {})

    opinions, quick, differ = _quick_then_sampled(monkeypatch, cases)
    assert not differ, differ
    assert opinions >= 50 and quick >= 5, (opinions, quick)


def test_the_quick_pass_does_not_lift_wrong_small_rows_where_the_samples_failed_for_memory():
    """Round 33's rows wrong by a fifth of their value, with the job's samples already failed for memory (a candidate
    that keeps the device full): the quick pass runs before the sampling and holds each row to its own rounding."""
    model = _module(MIXED_ROW_SUM.code, "round36_mixed").Model()
    wrong = _module(WRONG_SMALL_ROWS, "round36_wrong").ModelNew()
    problem = _module(MIXED_ROW_SUM.code, "round36_mixed_inputs")
    for seed in range(2):
        x = make_inputs(problem, seed, CPU, torch.float32)[0]
        with torch.no_grad():
            ref, out = model(x), wrong(x)
        result = {"flags": []}
        verdict = float64.judge(CPU, model, [x], out, ref, *TOL, result, {"spread_failed": "memory"})
        assert not verdict.ok, (seed, result)


# --- 5. the neighbour watch from the load on ----------------------------------------------------------------------------

BEGAN = HEAD + """import time

raise RuntimeError("BEGAN " + repr(time.time()))  # the candidate's first line of code: when its import began


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
"""


def test_a_candidate_does_not_begin_to_load_beside_a_measurement_in_progress():
    relu = get_problem(load_problems("builtin"), name="level1/1_ReLU")
    config = EvalConfig(trials=1, timing=False, integrity="off", load_timeout=60)
    with Evaluator(DEVICE, config=config, results_path=False, baseline_cache=False, workers_per_device=2) as e:
        e.warm()
        lock = next(h.device_lock for h in e._workers if h.device_lock is not None)
        measuring = neighbours.Measuring((Path(lock.pause_files[0]), Path(lock.pause_files[1])))
        assert measuring.begin(wait=5.0)  # another judge's measurement of the device, under way
        try:
            pending = e.submit(relu, BEGAN)
            time.sleep(2.5)
        finally:
            released = time.time()
            measuring.end()
        r = pending.result()
    found = re.search(r"BEGAN ([0-9.]+)", r.error or "")
    assert found, (r.status, r.error)
    assert float(found.group(1)) >= released, (float(found.group(1)), released)
    assert r.stage_seconds.get("paused_loading", 0.0) > 1.0, r.stage_seconds
