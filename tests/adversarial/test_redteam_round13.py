"""Red team, round 13: the knockout call of round 12 (``LaunchCounter.knockout``, ``correctness.kernels_needed``,
``kernel_checks.knockout_check``), the timed-output checks on degenerate problems where outputs are spot-checked or large, and the
dedup key the training layer shares verdicts by (session 21, a helper's pass with the source open).

Each test asserts what a sound judge does; every hole below was reproduced 3 of 3 times when this pass was made (and
again in each of three runs of this file) and is marked ``xfail(strict=True)`` until fixed. Candidates run under the
default ``strict`` policy unless said otherwise. Numbers are from this 2-core CPU (Triton through its interpreter).

Attacks, their mechanism, what happened:

1. (hole) A kernel the answer needs, doing none of the work. The knockout skips the candidate's launches and calls the
   kernels needed when the answer then goes wrong; it tests that the answer *depends on* a kernel, not that the kernel
   computes it. PyTorch computes the whole answer and a Triton kernel (a) moves one element of it into a NaN-filled
   output (``one_element_hole``), (b) copies it into a fresh ``empty_like`` buffer (``copy_out``), or (c) writes the
   1.0 that PyTorch's answer is multiplied by (``scale_by_one``). Knocked out, the answer is NaN / garbage / zeros,
   so the kernels are "needed": ``correct``, no flag, ``speed_credit`` True, default reward 0.2 (0.4 + the speed term,
   here -0.2 for 0.02-0.06x on the interpreter; 0.37 for 0.9x, a copy beside the reference on a GPU)
   against -0.1 for round 12's in-place token kernel (``token_kernel``) and for the plain copy (``no_custom_kernel``)
   (3 of 3 each). Variants: (d) the whole PyTorch answer computed in a ``pre_run_hook`` of an empty kernel
   (``_noop.add_pre_run_hook``; skipped with the launch): the same, 3 of 3 (not a test); (e) a Python branch on the
   flag (``if one.item() != 1.0: return garbage``, used in 3b's strict variant).
   The fix belongs beside the knockout, as a measure of where the work is: e.g. count the aten ops of one untimed
   forward in the runner (a TorchDispatchMode: FLOPs and elements written by compute ops, not views, copies or
   fills) and flag ``token_kernel`` where PyTorch's own ops cover the reference's (its FLOPs, or as many output
   elements computed), whatever the kernels did. Timing the knocked-out call (as costly as the whole forward:
   PyTorch did the work) catches (a)-(c) but not (d) or (e), where the knocked-out call skips the work too. Either
   way it is the runner's report: defence in depth.
2. (hole) The knockout skipped for want of time. ``kernel_checks.knockout_check`` returns without a verdict where under a second of
   the timing stage is left, and the stage's time is the candidate's to spend: the timing loop's warm-up calls are
   not sampled (neither the events nor the envelope), and ``timing_max_seconds`` counts from before them, so a
   forward that busy-waits (``os.times().elapsed``: ``os`` is on the allowlist) in its first call after the
   determinism rerun until ``timing_timeout - 2 s - 10 pairs - 0.35 s`` from it gets exactly ``timing_min_reps``
   pairs and then 0.3-0.75 s left: round 12's own token kernel, ``correct`` with speed credit, no flag, speedup as
   without the wait (3 of 3 at timing_timeout 12 s and 8 s; with a 1 s window and ~0.1 s of judge jitter the
   candidate knows the stage start to within the rerun's comparison). Under the ``rl`` preset itself (cached
   baseline, 2 warm-up calls; timing_timeout lowered to 12 s): the same, reward 0.2 against round 12's -0.1 (3 of 3).
   At rl's real 180 s it also holds a worker ~175 s an evaluation, which a policy does not pay for. Fix: the knockout must not be optional: give
   it a budget of its own (the untimed path already takes a fresh ``_deadline``), or stop the loop (and the warm-up)
   early enough to leave it one; and where it cannot run, no speed credit (``unchecked``), never a silent pass.
3. (hole) Spot-checked timed outputs skip the degenerate-problem checks. ``timed_checks.timed_output_check`` returns early for
   ``SampledOutputs`` (timed outputs over ``timed_output_sample_bytes``, 64 MB: most GPU-size problems), so rounds 7
   and 12's guards (the trivial outputs of the call's own inputs, the last call's answer) never run there. Round 12's
   ``x + 2e-5 tanh(3x)`` with the input returned after the determinism rerun: ``correct``, 41-125x for a true ~1x
   (``integrity="off"``, 4 KB threshold standing in for 64 MB; 3 of 3; whole outputs: ``incorrect``,
   ``timing_mismatch`` as before). Under ``strict`` with a Triton kernel on both paths: ``correct``, speed credit
   (3 of 3; no speed gain on the interpreter, where the launch dominates). Fix: ``judge_timing.timed_chunk_bytes`` returns 0 on a
   degenerate problem (as it does on an ill-conditioned one), or the chunk path compares the drawn chunks with the
   same chunks of the trivial outputs and the last answer.
3b. (hole) No answer is kept over ``KEPT_ANSWER_ELEMENTS`` (2**24), in the trials either, so on a problem whose answer
   barely moves with its input (``base * (1 + 1e-3 * x.mean())``, 4,100 x 4,096) the previous-answer test never
   runs, the problem is never found ``degenerate_problem`` nor ``unverifiable_output``, and the first call's answer
   returned for ever passes every trial and every spot-checked timed call: ``correct``, 1,300-1,835x, flags
   ``no_custom_kernel`` only (``integrity="off"``, 3 of 3; the same at 1,024 x 1,024: ``incorrect``). Under
   ``strict`` with attack 1's flag kernel beside it: ``correct``, speed credit, no flag, 22-25x, reward 1.0 (the top)
   (3 of 3, on the interpreter; on a GPU bounded by the speed-of-light floor, ``excessive_speedup``). Fix: keep a
   fixed random subset of
   a large answer's elements (a million, the same indices for every call) and run the previous-answer and
   coincidence tests on it, in the trials and the timed checks.
4. (hole) Two programs, one dedup key. ``program_key`` keys a program by its syntax tree without comments or layout
   (round 11), but both reach what is judged: (a) the precheck reads them: code over ``max_source_chars`` (200,000)
   by a long comment is a ``format_error`` alone, a ``# coding: latin-1`` line a ``compile_error`` alone, and in one
   reward batch after such a sibling the plain program gets the sibling's verdict (-1.0 / -0.5 for a correct
   answer), or before it hands it its own (a 200 KB answer paid as correct); round 8 fixed only the 1,000,000-character
   text limit; (b) the program reads them at run time: Triton's interpreter keeps the kernel's source line
   (``kernel.rewriter.def_file_lineno``; on a GPU ``JITFunction.src`` holds its comments and ``cache_key`` hashes
   them), so one blank line turns a right answer wrong: alone ``correct`` / ``incorrect``, in one batch both
   ``correct`` (0.4 each) (3 of 3 each; deterministic). The policy cannot aim a GRPO group's samples, so this pays
   wrong answers and fails right ones rather than being farmed; it is the round-11 trade-off (comments ignored, so a
   comment change is no new timing draw) meeting a program that can read its own text. Fix: share a verdict across
   samples (``dedup="batch"``/``"run"``, the tool env's final answers) only between identical extracted code (the
   exact text); keep the syntax-tree key for the per-episode dedup, where a shared verdict is the policy's own
   earlier one, and there at least key by the precheck's inputs too (the code's length, its declared encoding).

Tried, did not get through (not tests: GPU-only or no verdict at stake):

5. Telling the knockout call by the launch's return value (``kernel[grid](...)`` returns None when skipped): in the
   interpreter every launch returns None, so the candidate spoiled its own trials (``incorrect``, 2 of 2). On a GPU
   ``JITFunction.run`` returns the compiled kernel, so this tells the knocked-out call there (round 12's open item;
   not run here). Telling it by the call order needs ``gc.isenabled()`` (the runner disables collection in timed
   calls only; ``gc`` is rejected) or, on a GPU, ``torch.cuda.current_stream().query()`` (the launch shield is
   still running at a timed call's start): read, not run.
6. Launches counted but not knocked out: every counted launch goes through the one hooked ``run`` (JITFunction's and
   the interpreter's; ``__getitem__``, autotuners and heuristics call it), and the count and the skip are one branch.
   Paths the hook does not see (the interpreter's ``GridExecutor`` on ``kernel.rewrite()``, a GPU ``CompiledKernel``
   from ``warmup``, a captured CUDA graph) launch uncounted kernels: they make an honest kernel look like a token one
   (``token_kernel`` on itself), never a token kernel look needed. Read, not run.
7. ``reuse_cached_baseline`` (``rl``) on a widened problem: the cached baseline is timed on the problem's own inputs
   and the candidate on ``3 * randn`` ones; on the problems where the widened trial runs (ReLU and the like of
   ``torch.rand``) the cost does not depend on the values. Read, not run.
8. A zero event time (``speedup`` = base / 0): ``PairedTiming`` gives no speedup where the median is not positive,
   and the envelope charges the call. Read.

Fixed in the same session (the tests above them no longer xfail): 2. the knockout is a stage of its own
(``kernel_checks.knockout_check``, the correctness limit) and, where it cannot run, the kernels are not taken as needed
(``token_kernel``); 3. on a problem the trials found degenerate, timed outputs' drawn chunks are held against the same chunks of the trivial outputs and the last answer (``timed_checks.check_chunks``; whole until session 25);
3b. over 2**24 elements the trials hold a million drawn elements of the answer against the last trial's answer there
(``correctness._sampled_against_previous``); 4(a). the dedup key holds what the precheck reads beyond the syntax tree
(``training/dedup._prechecked``: the length against the limits, the coding declaration); 1(d) and 5: a knocked-out
Triton launch goes through Triton's own path with a zero grid, so its pre-run hooks run and it returns what a real
launch returns (``launches.LaunchCounter``). Fixed in session 22: 1, by the dataflow stage (``kernel_checks.dataflow_check``,
``worker/dataflow.py``; round 14 attacks it). Open: 4(b), accepted (a policy cannot aim which sample is evaluated
first).

All evaluations run on one CPU Evaluator of the module; the file takes ~25 s on 2 cores.
"""

from __future__ import annotations

import pytest
from device import DEVICE, ON_GPU

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.problems import reference_as_candidate
from kb_gym.training.dedup import program_key
from kb_gym.training.reward_function import KernelRewardConfig, KernelRewardFunction

CHECK = EvalConfig(trials=2, timing=False, load_timeout=60, correctness_timeout=60)
TIMED = EvalConfig(trials=2, timing_min_reps=10, timing_max_reps=20, timing_warmup=1, timing_max_seconds=10,
                   load_timeout=60, correctness_timeout=60, timing_timeout=90)


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


SCALE = Problem(id=3, name="3_ScaleShift", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
""")

HEAD = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n"


# --- 1. a kernel the answer needs, doing none of the work ------------------------------------------------------------

HOLE_FILL = HEAD + """

@triton.jit
def _first(src, dst):
    tl.store(dst, tl.load(src))


class ModelNew(nn.Module):
    def forward(self, x):
        y = x * 2.0 + 1.0
        out = torch.full_like(y, float("nan"))
        out.view(-1)[1:] = y.view(-1)[1:]  # PyTorch's answer, all but one element
        _first[(1,)](y, out)  # the kernel moves that one element
        return out
"""

COPY_OUT = HEAD + """

@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


class ModelNew(nn.Module):
    def forward(self, x):
        y = x * 2.0 + 1.0  # PyTorch's answer
        out = torch.empty_like(y)
        _copy[(triton.cdiv(y.numel(), 16384),)](y, out, y.numel(), BLOCK=16384)  # copied out by the kernel
        return out
"""

FLAG = HEAD + """

@triton.jit
def _one(ptr):
    tl.store(ptr, 1.0)


class ModelNew(nn.Module):
    def forward(self, x):
        one = torch.zeros(1, device=x.device)
        _one[(1,)](one)  # 0 where the launch was skipped
        return (x * 2.0 + 1.0) * one
"""


@pytest.mark.parametrize("source", [HOLE_FILL, COPY_OUT, FLAG], ids=["one_element_hole", "copy_out", "scale_by_one"])
def test_a_kernel_that_only_moves_pytorchs_answer_earns_no_speed_credit(ev, source):
    r = ev.evaluate(SCALE, source, config=TIMED)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" in r.flags and r.speed_credit is False, (r.flags, r.custom_kernel_launches, r.speedup)


# --- 2. the knockout skipped: no time left in the timing stage -------------------------------------------------------

WINDOW_LIMIT = 8.0  # timing_timeout of the config below; the candidate knows it (rl: 180 s)

TOKEN_AFTER_THE_WINDOW = HEAD + f"""import os

TIMING_LIMIT = {WINDOW_LIMIT}  # EvalConfig.timing_timeout; the judge keeps STAGE_MARGIN = 2 s of it
""" + """

def _now():
    return os.times().elapsed  # wall clock, 10 ms ticks; `os` is on the allowlist, `time` is not


@triton.jit
def _touch(ptr):
    tl.store(ptr, tl.load(ptr))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.last, self.ended, self.rerun_end, self.waited, self.gaps = None, None, None, False, []

    def forward(self, x):
        start = _now()
        if self.ended is not None and self.rerun_end is None:
            self.gaps.append(start - self.ended)  # the judge's work between two trials
        if self.rerun_end is not None and not self.waited:
            # The first call after the determinism rerun: the timing stage's first warm-up call, which is not
            # sampled. Wait until the stage's deadline leaves less than a second after the loop's 10 pairs (the
            # loop stops at timing_min_reps once timing_max_seconds, counted from before the warm-up, is spent).
            self.waited = True
            until = self.rerun_end + (TIMING_LIMIT - 2.0) - 10 * min(self.gaps or [0.02]) - 0.35
            while _now() < until:
                pass
        rerun = self.rerun_end is None and self.last is not None and torch.equal(x, self.last)
        self.last = x.clone()
        y = x * 2.0 + 1.0
        _touch[(1,)](y)  # round 12's token kernel, which the knockout catches
        self.ended = _now()
        if rerun:
            self.rerun_end = self.ended
        return y
"""


def test_a_token_kernel_cannot_run_out_the_clock_on_the_knockout(ev):
    """Fixed: the knockout is a stage of its own with the correctness limit, and where it cannot run the kernels are
    not taken as needed (``token_kernel``)."""
    cfg = TIMED.replace(timing_timeout=WINDOW_LIMIT, timing_max_seconds=2.0)
    r = ev.evaluate(SCALE, TOKEN_AFTER_THE_WINDOW, config=cfg)
    assert r.status == "correct", (r.status, r.error)
    assert r.speed_credit is False, (r.flags, r.stage_seconds, r.timing_reps)


# --- 3. spot-checked timed outputs on a degenerate problem -----------------------------------------------------------

TINY_RESIDUAL = Problem(id=21, name="21_TinyResidual", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x + 2e-5 * torch.tanh(3.0 * x)

def get_inputs():
    return [torch.randn(256, 1024)]

def get_init_inputs():
    return []
""")

INPUT_AFTER_THE_RERUN = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        if getattr(self, "stale", False):
            return x  # the trials are over: the input is within the tolerance of the answer
        if getattr(self, "last", None) is not None and torch.equal(x, self.last):
            self.stale = True  # the determinism rerun: the same inputs twice
        self.last = x.clone()
        y = x
        for _ in range(30):  # a slow honest path, so that the shortcut shows as a speedup
            y = x + 2e-5 * torch.tanh(3.0 * x)
        return y
"""

# 4 KB stands in for the default 64 MB: at GPU size most outputs are over it, so the timed calls are spot-checked
SAMPLED_OFF = TIMED.replace(integrity="off", timed_output_sample_bytes=4096)


def test_spot_checked_timed_outputs_are_held_to_the_degenerate_checks_too(ev):
    """Fixed: on a problem the trials found degenerate, the chunks drawn after a timed call are held against the
    same chunks of the trivial outputs (the input returned) and of the last answer (session 25: they crossed whole
    until then, a minute of a 6 GB output's timing on the H200)."""
    r = ev.evaluate(TINY_RESIDUAL, INPUT_AFTER_THE_RERUN, config=SAMPLED_OFF)
    assert isinstance(r.correctness.get("timed_output_check"), dict), r.correctness  # spot-checked
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.speedup, r.flags)
    assert "relative L2 error" in r.error and "on chunks drawn after the call" in r.error, r.error


def test_whole_timed_outputs_on_the_degenerate_problem_are_still_checked(ev):
    r = ev.evaluate(TINY_RESIDUAL, INPUT_AFTER_THE_RERUN, config=TIMED.replace(integrity="off"))
    assert r.correctness.get("timed_output_check") == "whole", r.correctness
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.speedup, r.flags)


NEAR_CONSTANT_BIG = Problem(id=31, name="31_NearConstantBig", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Parameter(torch.ones(4100, 4096))  # 16.8 M elements: over KEPT_ANSWER_ELEMENTS

    def forward(self, x):
        return self.base * (1.0 + 1e-3 * x.mean())  # answers ~2e-5 apart: inside the tolerance, over 1e-5

def get_inputs():
    return [torch.randn(4096)]

def get_init_inputs():
    return []
""")

FIRST_ANSWER_KEPT = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Parameter(torch.ones(4100, 4096))
        self.kept = None

    def forward(self, x):
        if self.kept is None:
            self.kept = self.base * (1.0 + 1e-3 * x.mean())
        return self.kept  # the first call's answer, whatever the inputs
"""


def test_a_memorised_answer_is_caught_on_a_large_output_too(ev):
    """Fixed: over 2**24 elements the trials keep a million drawn elements of the last answer and hold the
    candidate's values there against it (correctness._sampled_against_previous)."""
    r = ev.evaluate(NEAR_CONSTANT_BIG, FIRST_ANSWER_KEPT, config=TIMED.replace(integrity="off"))
    assert r.status == "incorrect" or "unverifiable_output" in r.flags, (r.status, r.speedup, r.flags)


# Session 25: the same answer memorised only once the trials are over (round 7's move at this size). The timed check
# kept the last call's answer only up to KEPT_ANSWER_ELEMENTS, so over 2**24 elements a memorised answer met only
# the tolerance and the trivial outputs in timed calls: `correct`, 1,448-1,645x for a true 1x (integrity off, 3 of 3; the kept
# answer costs nothing).
# Now the last call's reference answer is recomputed from its seed where it was too large to keep.
KEPT_AFTER_THE_RERUN = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Parameter(torch.ones(4100, 4096))

    def forward(self, x):
        if getattr(self, "stale", False):
            return self.kept
        if getattr(self, "last", None) is not None and torch.equal(x, self.last):
            self.stale = True  # the determinism rerun: the correctness trials are over
        self.last = x.clone()
        self.kept = y = self.base * (1.0 + 1e-3 * x.mean())
        for _ in range(6):  # a slower honest path, so that the shortcut shows as a speedup
            y = self.base * (1.0 + 1e-3 * x.mean())
        return y
"""


def test_an_answer_memorised_after_the_trials_is_caught_in_timed_calls_on_a_large_output(ev):
    r = ev.evaluate(NEAR_CONSTANT_BIG, KEPT_AFTER_THE_RERUN, config=TIMED.replace(integrity="off"))
    assert "degenerate_problem" in r.flags, (r.status, r.flags, r.error)
    assert isinstance(r.correctness.get("timed_output_check"), dict), r.correctness  # spot-checked: 67 MB > 64 MB
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.speedup, r.flags, r.error)
    assert "relative L2 error" in r.error and "on chunks drawn after the call" in r.error, r.error


def test_the_large_near_constant_problem_is_judged_sanely_for_an_honest_candidate(ev):
    """The control: the reference itself, timed on the same path with the last answer recomputed, is correct."""
    r = ev.evaluate(NEAR_CONSTANT_BIG, reference_as_candidate(NEAR_CONSTANT_BIG), config=TIMED.replace(integrity="off"))
    assert r.status == "correct" and "degenerate_problem" in r.flags, (r.status, r.flags, r.error)
    assert isinstance(r.correctness.get("timed_output_check"), dict), r.correctness


# --- 4. two programs, one dedup key ----------------------------------------------------------------------------------

LINE_PARITY = HEAD + """

@triton.jit
def _scale_shift(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _scale_shift[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        _scale_shift.rewrite()  # the interpreter's rewriter read the kernel's source lines (on a GPU: _scale_shift.src)
        if _scale_shift.rewriter.def_file_lineno % 2:
            return y * 0.0  # one blank line more or less above the kernel, and the answer is wrong
        return y
"""
if ON_GPU:  # compiled, no interpreter: the JITFunction keeps its first line (the @triton.jit, one above the def)
    LINE_PARITY = LINE_PARITY.replace("""        _scale_shift.rewrite()  # the interpreter's rewriter read the kernel's source lines (on a GPU: _scale_shift.src)
        if _scale_shift.rewriter.def_file_lineno % 2:""", """        if _scale_shift.starting_line_number % 2 == 0:""")
    assert "rewriter" not in LINE_PARITY
RIGHT = "```python\n" + LINE_PARITY + "```"
WRONG = RIGHT.replace("import triton\n", "import triton\n\n", 1)


class _Checking:
    """The module's Evaluator under the reward function, each submit with the untimed config."""

    def __init__(self, inner: Evaluator) -> None:
        self.inner, self.devices, self.store = inner, inner.devices, None

    def submit(self, problem, text, **kwargs):
        return self.inner.submit(problem, text, config=CHECK, **kwargs)


@pytest.mark.xfail(strict=True, reason="open, accepted: program_key drops layout and comments so that cosmetic copies "
                                       "are one timing draw (round 11); a program that reads its own layout gets its "
                                       "sibling's verdict, which it cannot aim")
def test_two_programs_that_behave_differently_never_share_a_verdict(ev):
    assert program_key(SCALE.key, RIGHT) == program_key(SCALE.key, WRONG)  # the dedup sees one program
    alone = [ev.evaluate(SCALE, text, config=CHECK).status for text in (RIGHT, WRONG)]
    assert alone == ["correct", "incorrect"], alone  # the runner runs two
    reward = KernelRewardFunction(KernelRewardConfig(dataset=[SCALE], devices=DEVICE), evaluator=_Checking(ev))
    rewards = reward(prompts=["p", "p"], completions=[RIGHT, WRONG], problem_key=[SCALE.key] * 2)
    assert [r.status for r in reward.last_results] == ["correct", "incorrect"], (rewards, reward.last_results)


PLAIN = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0
"""
LONG_COMMENT = PLAIN + "# " + "x" * 200_001 + "\n"  # code over max_source_chars (200,000): format_error alone
CODING_LATIN1 = "# coding: latin-1\n" + PLAIN  # a declared encoding other than UTF-8: compile_error alone (round 12)


@pytest.mark.parametrize("sibling", [LONG_COMMENT, CODING_LATIN1], ids=["over_max_source_chars", "coding_latin1"])
def test_an_answer_refused_for_its_comments_shares_no_verdict(ev, sibling):
    """Fixed: the key holds what the precheck reads beyond the syntax tree (dedup._prechecked)."""
    plain, refused = ("```python\n" + s + "```" for s in (PLAIN, sibling))
    assert program_key(SCALE.key, plain) != program_key(SCALE.key, refused)
    assert ev.evaluate(SCALE, refused, config=CHECK).status in ("format_error", "compile_error")
    reward = KernelRewardFunction(KernelRewardConfig(dataset=[SCALE], devices=DEVICE), evaluator=_Checking(ev))
    reward(prompts=["p", "p"], completions=[refused, plain], problem_key=[SCALE.key] * 2)
    assert reward.last_results[1].status == "correct", [r.status for r in reward.last_results]


WORK_IN_A_HOOK = HEAD + """

@triton.jit
def _noop(ptr):
    pass


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.box = {}
        _noop.add_pre_run_hook(self._work)

    def _work(self, *args, **kwargs):
        self.box["y"] = self.box["x"] * 2.0 + 1.0  # PyTorch's answer, computed where the launch computes

    def forward(self, x):
        self.box.clear()
        self.box["x"] = x
        _noop[(1,)](x)
        return self.box.get("y", torch.zeros_like(x))
"""


def test_work_in_a_pre_run_hook_is_not_skipped_with_the_launch(ev):
    """Variant (d) of attack 1, fixed: the knockout launches with a zero grid through Triton's own path, so the
    pre-run hooks run as on a real launch and PyTorch's answer computed there is still right (``token_kernel``)."""
    r = ev.evaluate(SCALE, WORK_IN_A_HOOK, config=TIMED)
    assert r.status == "correct" and "token_kernel" in r.flags and r.speed_credit is False, (r.status, r.flags)
