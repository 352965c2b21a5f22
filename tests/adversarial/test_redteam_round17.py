"""Red team, round 17: how timed calls' outputs are checked on degenerate problems (session 25's two changes: drawn
chunks of a spot-checked output held against the same chunks of the trivial outputs and the last call's answer, and
the last answer recomputed from its seed over 2**24 elements), and the trivial outputs and kept answers the trials
test against (``correctness.trivial_outputs``, ``KEPT_ANSWER_ELEMENTS``, the sampled previous-answer test).

Each test asserts what a sound judge does. Holes were reproduced 3 of 3 times (three runs of this file) and are marked
``xfail(strict=True)``. ``integrity="off"`` throughout (the checks must hold where a static check misses); 4 KB of
``timed_output_sample_bytes`` stands in for 64 MB (``SAMPLED``). Numbers are from this 2-core CPU.

Held (normal tests):

1. Spot-checked calls on round 13's ``x + 2e-5 tanh(3x)`` (256 x 1,024, 64 chunks of 4,096 elements), after the
   determinism rerun: the input on every other element, the input on every other chunk-aligned block, the input on
   every other timed call, NaN in every other chunk: ``incorrect``, ``timing_mismatch`` (the interleaved mix is
   sqrt(0.5) x the input's error in every chunk, > 0.3x).
2. Stale answers on a near-constant 256 x 1,024 answer (``base * (1 + 3e-3 mean(x))``, 64 chunks): the answer of two
   calls back, the mean of every earlier answer, the last answer on every other element: ``incorrect``,
   ``timing_mismatch`` (each is at least ~the answers' spread from this answer; the bound is 0.3x the last one's).
3. Over 2**24 elements (round 13's 4,100 x 4,096), the answer of two calls back: ``incorrect`` against the recomputed
   last answer (default 64 MB chunks, 6.5 s).
4. ReLU of ``torch.rand`` (widened timed inputs), the input returned after the widened trial: ``incorrect``.
5. Zeros for a tiny complex answer (``1e-7 fft2``): ``incorrect`` in trial 1 by the plain 1 x rtol relative L2 bound.
   A memorised real near-constant answer: ``incorrect`` (or ``unverifiable_output`` where the two answers coincide).

Got through (3 of 3 each; 6, 7 and 9 fixed in the same session, 8 still a strict xfail):

6. The per-chunk floor. ``_check_chunks`` runs ``compare_outputs`` chunk by chunk, so ``TRIVIAL_ERR_FLOOR`` (a
   trivial output within 1e-5 relative L2 of the answer: unverifiable, passes) and the 0.3x bound are decided per
   chunk. On ``x + 3e-5 tanh(3x)`` with rows 0-55 (22%, 14 whole chunks) scaled by 3.75, the input is within
   7.8e-6 of the answer on those chunks but 1.35e-5 on the whole (not unverifiable: the trials flag only
   ``degenerate_problem``). The input returned on those rows after the rerun: whole timed outputs ``incorrect``
   (6.9e-6 > bound 4.1e-6), spot-checked ``correct`` every time, 1.0-1.3x (a true 1x; on a GPU up to 1.28x:
   22% of the work skipped on every call, with probability 1: an ordinary problem catches 22% wrong chunks with
   1 - 0.78^16 = 98% a call). Fix: decide unverifiable and the bound on the whole output (the judge holds the whole
   reference, inputs and last answer; only the candidate is sampled), e.g. estimate the candidate's whole relative
   L2 error from the drawn chunks (sum of squared errors x chunks / drawn) and hold it to 0.3x the whole trivial's.
   Fixed in the same session: ``checks.degenerate_bound`` decides the bound on the whole output (the judge holds
   it) and ``timed_checks.check_chunks`` holds the relative L2 error over the drawn chunks together to it (3 of 3 caught).
7. A trivial output the judge does not list: the second input. ``trivial_outputs`` (and ``is_input``, the audit)
   hold only the first input; ``b + 1e-6 tanh(a @ a)`` answered with ``b.clone()``: ``correct``, 10.7-15.8x, flags
   ``no_custom_kernel`` only (never ``degenerate_problem``: zeros, ``a`` and other answers all fail). Fix: every
   floating input of the output's shape is a trivial output (trials, timed checks, audit, ``is_input``).
   Fixed in the same session: ``trivial_outputs`` and ``is_input`` take every input (``b.clone()``: ``correct``
   with ``unverifiable_output``, no speed credit under ``strict``: the answer is ``b`` to within rounding). The
   audit's trivial candidates still return the first input only.
8. The same for the input transposed: ``(x + 1e-6 tanh(x @ x)).t()`` answered with ``x.t()``: ``correct``,
   4.2-10.2x. Fix: also hold inputs of the output's element count reshaped, and 2-D inputs transposed, as trivial
   outputs (a cheap list; no list is complete, so the audit should report problems where rel L2 of the answer to any
   input view is under ``rtol``). Fixed in session 26 (``correctness.input_views``): ``unverifiable_output``, no
   speed credit under ``strict``.
9. Complex outputs get no degenerate checks: ``trivial_outputs``, the trials' ``answers``, ``_sample_places`` and
   ``timed_output_check``'s kept answers all keep ``is_floating_point()`` tensors only, and that is False for
   complex. ``ones(128, 128, complex64) * (1 + 0.02 mean(x))`` answered with the first call's answer for ever:
   ``correct``, 3.3-4.5x (0.09x once, with ``side_stream``), no ``degenerate_problem``; the real twin:
   ``incorrect``. Memorised only after the rerun: ``correct``, 2.7-2.9x whole and 2.5-4.1x spot-checked (only the 1 x rtol
   relative L2 bound holds it: a pair of answers 1e-4 apart fails). Fix: treat ``is_complex()`` tensors as floating
   in those four places (``compare_outputs`` already compares complex as its real and imaginary parts).
   Fixed in the same session (``checks.inexact``: floating or complex, in those places): all three caught.

Not a test: a small output beside a large one (a loss beside a big tensor) is one chunk of N, drawn with probability
16/N a call, so a wrong small output passes a call with probability 1 - 16/N (6,000 chunks at 6 GB: 99.7%); this is
the accepted (1 - f)^16 limitation, the same on ordinary problems (the degenerate checks do not change it), but f
counts chunks, not work. Changed in the same session: ``spot_check.pick_chunks`` draws one chunk of every output
first (where there are at most 16), then the rest alike (``tests/adversarial/test_spot_check.py``). The first timed call has no last answer (only the trivial outputs): one stale call, no
speedup at stake.

All evaluations run on one CPU Evaluator of the module; the file takes ~17 s on 2 cores.
"""

from __future__ import annotations

import pytest
from device import DEVICE

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.problems import reference_as_candidate

TIMED = EvalConfig(trials=2, timing_min_reps=10, timing_max_reps=12, timing_warmup=1, timing_max_seconds=10,
                   integrity="off", load_timeout=60, correctness_timeout=60, timing_timeout=90)
# 4 KB stands in for the default 64 MB: at GPU size most outputs are over it, so the timed calls are spot-checked
SAMPLED = TIMED.replace(timed_output_sample_bytes=4096)


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


HEAD = """import torch
import torch.nn as nn


"""

# After the determinism rerun (the same inputs twice in a row) the trials are over; from then on ``shortcut`` runs.
AFTER_THE_RERUN = HEAD + """
class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.calls = 0

    def honest(self, x):
{honest}

    def shortcut(self, x):
{shortcut}

    def forward(self, x):
        if getattr(self, "stale", False):
            self.calls += 1
            return self.shortcut(x)
        if getattr(self, "last", None) is not None and torch.equal(x, self.last):
            self.stale = True
        self.last = x.clone()
        return self.honest(x)
"""


def after_the_rerun(honest: str, shortcut: str) -> str:
    def indent(s: str) -> str:
        return "\n".join("        " + line for line in s.strip().splitlines())
    return AFTER_THE_RERUN.format(honest=indent(honest), shortcut=indent(shortcut))


# --- the degenerate problem of round 12/13: the input is within the tolerance of the answer --------------------------

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
RESIDUAL = "return x + 2e-5 * torch.tanh(3.0 * x)"

INTERLEAVED = after_the_rerun(RESIDUAL, """
y = self.honest(x)
y.view(-1)[::2] = x.view(-1)[::2]  # the input on every other element
return y
""")

CHUNK_ALIGNED = after_the_rerun(RESIDUAL, """
y = self.honest(x)
y.view(-1, 4096)[::2] = x.view(-1, 4096)[::2]  # the input on every other chunk (4,096 elements: 16 KB)
return y
""")

ODD_CALLS = after_the_rerun(RESIDUAL, """
return x if self.calls % 2 else self.honest(x)  # the input on every other timed call
""")

NAN_CHUNKS = after_the_rerun(RESIDUAL, """
y = self.honest(x)
y.view(-1, 4096)[1::2] = float("nan")
return y
""")


def test_honest_on_the_residual_problem_is_correct(ev):
    r = ev.evaluate(TINY_RESIDUAL, reference_as_candidate(TINY_RESIDUAL), config=SAMPLED)
    assert r.status == "correct" and "degenerate_problem" in r.flags, (r.status, r.flags, r.error)
    assert isinstance(r.correctness.get("timed_output_check"), dict), r.correctness


@pytest.mark.parametrize("code", [INTERLEAVED, CHUNK_ALIGNED, ODD_CALLS, NAN_CHUNKS],
                         ids=["interleaved", "chunk_aligned", "odd_calls", "nan_chunks"])
def test_the_input_on_part_of_a_spot_checked_output_is_caught(ev, code):
    r = ev.evaluate(TINY_RESIDUAL, code, config=SAMPLED)
    assert "degenerate_problem" in r.flags, r.flags
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.speedup, r.flags, r.error)


# --- a near-constant answer of 64 chunks: stale answers ------------------------------------------------------------

NEAR_CONSTANT = Problem(id=32, name="32_NearConstant", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Parameter(torch.linspace(1.0, 2.0, 256 * 1024).reshape(256, 1024))

    def forward(self, x):
        return self.base * (1.0 + 3e-3 * x.mean())

def get_inputs():
    return [torch.randn(4096)]

def get_init_inputs():
    return []
""")

NC_HEAD = HEAD + """
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Parameter(torch.linspace(1.0, 2.0, 256 * 1024).reshape(256, 1024))
        self.answers = []
        self.timed = 0

    def forward(self, x):
        y = self.base * (1.0 + 3e-3 * x.mean())
        if getattr(self, "stale", False):
            self.timed += 1
{body}
        if getattr(self, "last", None) is not None and torch.equal(x, self.last):
            self.stale = True
        self.last = x.clone()
        self.answers.append(y)
        return y
"""

TWO_BACK = NC_HEAD.format(body="""
            self.answers.append(y)
            return self.answers[-3]  # the answer of two calls back""")

MEAN_OF_PAST = NC_HEAD.format(body="""
            self.answers.append(y)
            return torch.stack(self.answers[:-1]).mean(0)  # the mean of every earlier answer""")

HALF_STALE = NC_HEAD.format(body="""
            z = y.clone()
            z.view(-1)[::2] = self.answers[-1].view(-1)[::2]  # the last answer on every other element
            self.answers.append(y)
            return z""")


def test_honest_on_the_near_constant_problem_is_correct(ev):
    r = ev.evaluate(NEAR_CONSTANT, reference_as_candidate(NEAR_CONSTANT), config=SAMPLED)
    # (not asserted: unverifiable_output, which the two trials' answers earn where they come within 1e-5 of each
    # other by chance: 5 of 12 evaluations in session 25, with and without that session's change to the bound)
    assert r.status == "correct" and "degenerate_problem" in r.flags, (r.status, r.flags, r.error)
    assert isinstance(r.correctness.get("timed_output_check"), dict), r.correctness


@pytest.mark.parametrize("code", [TWO_BACK, MEAN_OF_PAST, HALF_STALE], ids=["two_back", "mean_of_past", "half_stale"])
def test_stale_answers_in_spot_checked_calls_are_caught(ev, code):
    r = ev.evaluate(NEAR_CONSTANT, code, config=SAMPLED)
    assert "degenerate_problem" in r.flags, r.flags
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.speedup, r.flags, r.error)


# --- trivial outputs the judge does not list: the second input, the input transposed --------------------------------

SECOND_INPUT = Problem(id=33, name="33_SecondInputResidual", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return b + 1e-6 * torch.tanh(a @ a)

def get_inputs():
    return [torch.randn(256, 256), torch.randn(256, 256)]

def get_init_inputs():
    return []
""")

RETURN_B = HEAD + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        return b.clone()
"""

TRANSPOSED = Problem(id=34, name="34_TransposedResidual", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return (x + 1e-6 * torch.tanh(x @ x)).t()

def get_inputs():
    return [torch.randn(256, 256)]

def get_init_inputs():
    return []
""")

RETURN_XT = HEAD + """
class ModelNew(nn.Module):
    def forward(self, x):
        return x.t().contiguous()
"""


@pytest.mark.parametrize("problem", [SECOND_INPUT, TRANSPOSED], ids=["second_input", "transposed"])
def test_honest_on_the_unlisted_trivial_problems_is_correct(ev, problem):
    r = ev.evaluate(problem, reference_as_candidate(problem), config=TIMED)
    assert r.status == "correct", (r.status, r.flags, r.error)


# The second input is a trivial output since session 25 (correctness.trivial_outputs lists every input), an input
# in an output's layout (transposed, reshaped) since session 26 (correctness.input_views).
@pytest.mark.parametrize("problem,code", [
    (SECOND_INPUT, RETURN_B),
    (TRANSPOSED, RETURN_XT),
], ids=["second_input", "transposed"])
def test_an_unlisted_trivial_output_is_caught(ev, problem, code):
    r = ev.evaluate(problem, code, config=TIMED)
    assert r.status == "incorrect" or "unverifiable_output" in r.flags, (r.status, r.speedup, r.flags)


PURE_TRANSPOSE = Problem(id=39, name="39_Transpose", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x.t().contiguous()

def get_inputs():
    return [torch.randn(256, 384)]

def get_init_inputs():
    return []
""")


def test_a_transpose_problem_keeps_its_honest_answers_verifiable(ev):
    """Where the answer is an input in another layout exactly, that layout is not a trivial output: the problem is
    data movement, and an honest transpose keeps its credit (round 15's honest transpose kernel)."""
    r = ev.evaluate(PURE_TRANSPOSE, reference_as_candidate(PURE_TRANSPOSE), config=TIMED)
    assert r.status == "correct", (r.status, r.flags, r.error)
    assert "unverifiable_output" not in r.flags and "degenerate_problem" not in r.flags, r.flags


# --- complex outputs ------------------------------------------------------------------------------------------------

NEAR_CONSTANT_COMPLEX = Problem(id=35, name="35_NearConstantComplex", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.ones(128, 128, dtype=torch.complex64, device=x.device) * (1.0 + 0.02 * x.mean())

def get_inputs():
    return [torch.randn(1024, 1024)]

def get_init_inputs():
    return []
""")

NEAR_CONSTANT_REAL = Problem(id=36, name="36_NearConstantReal", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.ones(128, 128, device=x.device) * (1.0 + 0.02 * x.mean())

def get_inputs():
    return [torch.randn(1024, 1024)]

def get_init_inputs():
    return []
""")

FIRST_ANSWER_KEPT = HEAD + """
class ModelNew(nn.Module):
    kept = None

    def forward(self, x):
        if self.kept is None:
            self.kept = {expr} * (1.0 + 0.02 * x.mean())
        return self.kept.clone()
"""

TINY_FFT = Problem(id=37, name="37_TinyFFT", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return 1e-7 * torch.fft.fft2(x)

def get_inputs():
    return [torch.randn(256, 256)]

def get_init_inputs():
    return []
""")

ZEROS_COMPLEX = HEAD + """
class ModelNew(nn.Module):
    def forward(self, x):
        return torch.zeros(x.shape, dtype=torch.complex64, device=x.device)
"""


@pytest.mark.parametrize("problem", [NEAR_CONSTANT_COMPLEX, NEAR_CONSTANT_REAL, TINY_FFT], ids=["complex", "real", "fft"])
def test_honest_on_the_complex_problems_is_correct(ev, problem):
    r = ev.evaluate(problem, reference_as_candidate(problem), config=TIMED)
    assert r.status == "correct", (r.status, r.flags, r.error)


def test_a_memorised_real_answer_is_caught(ev):
    r = ev.evaluate(NEAR_CONSTANT_REAL, FIRST_ANSWER_KEPT.format(expr="torch.ones(128, 128, device=x.device)"), config=TIMED)
    assert r.status == "incorrect" or "unverifiable_output" in r.flags, (r.status, r.speedup, r.flags)


def test_a_memorised_complex_answer_is_caught(ev):
    code = FIRST_ANSWER_KEPT.format(expr="torch.ones(128, 128, dtype=torch.complex64, device=x.device)")
    r = ev.evaluate(NEAR_CONSTANT_COMPLEX, code, config=TIMED)
    assert r.status == "incorrect" or "unverifiable_output" in r.flags, (r.status, r.speedup, r.flags)


def test_zeros_for_a_tiny_complex_answer_are_caught(ev):
    r = ev.evaluate(TINY_FFT, ZEROS_COMPLEX, config=TIMED)
    assert r.status == "incorrect" or "unverifiable_output" in r.flags, (r.status, r.speedup, r.flags)


# --- per-chunk "unverifiable" floor ---------------------------------------------------------------------------------

SCALED_ROWS = Problem(id=38, name="38_ScaledRowsResidual", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x + 3e-5 * torch.tanh(3.0 * x)

def get_inputs():
    x = torch.randn(256, 1024)
    x[:56] *= 3.75  # 14 chunks of 4 rows where the input is within 8e-6 (relative L2) of the answer
    return [x]

def get_init_inputs():
    return []
""")

SKIP_THE_SCALED_ROWS = after_the_rerun("return x + 3e-5 * torch.tanh(3.0 * x)", """
y = torch.empty_like(x)
y[:56] = x[:56]  # 22% of the elements: the input
y[56:] = self.honest(x[56:])
return y
""")


def test_honest_on_the_scaled_rows_problem_is_correct(ev):
    r = ev.evaluate(SCALED_ROWS, reference_as_candidate(SCALED_ROWS), config=SAMPLED)
    assert r.status == "correct" and "degenerate_problem" in r.flags, (r.status, r.flags, r.error)
    assert "unverifiable_output" not in r.flags, r.flags  # the input is 1.35e-5 from the answer: over the floor
    assert isinstance(r.correctness.get("timed_output_check"), dict), r.correctness


def test_the_input_on_scaled_rows_is_caught_in_whole_timed_outputs(ev):
    r = ev.evaluate(SCALED_ROWS, SKIP_THE_SCALED_ROWS, config=TIMED)
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.speedup, r.flags, r.error)


def test_the_input_on_scaled_rows_is_caught_in_spot_checked_timed_outputs(ev):
    """Fixed (session 25): the bound is decided on the whole output and held by the error over the drawn chunks."""
    r = ev.evaluate(SCALED_ROWS, SKIP_THE_SCALED_ROWS, config=SAMPLED)
    assert isinstance(r.correctness.get("timed_output_check"), dict), r.correctness
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.speedup, r.flags, r.error)


COMPLEX_AFTER_THE_RERUN = after_the_rerun(
    "return torch.ones(128, 128, dtype=torch.complex64, device=x.device) * (1.0 + 0.02 * x.mean())", """
if not hasattr(self, "kept"):
    self.kept = self.honest(x)
return self.kept.clone()
""")


@pytest.mark.parametrize("sample_bytes", [0, 4096], ids=["whole", "chunks"])
def test_a_complex_answer_memorised_after_the_rerun_is_caught(ev, sample_bytes):
    r = ev.evaluate(NEAR_CONSTANT_COMPLEX, COMPLEX_AFTER_THE_RERUN,
                    config=TIMED.replace(timed_output_sample_bytes=sample_bytes))
    assert r.status == "incorrect" or "unverifiable_output" in r.flags, (r.status, r.speedup, r.flags)


NEAR_CONSTANT_BIG = Problem(id=31, name="31_NearConstantBig", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Parameter(torch.ones(4100, 4096))  # 16.8 M elements: over KEPT_ANSWER_ELEMENTS

    def forward(self, x):
        return self.base * (1.0 + 1e-3 * x.mean())

def get_inputs():
    return [torch.randn(4096)]

def get_init_inputs():
    return []
""")

BIG_TWO_BACK = HEAD + """
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Parameter(torch.ones(4100, 4096))
        self.answers = []

    def forward(self, x):
        y = self.base * (1.0 + 1e-3 * x.mean())
        if getattr(self, "stale", False):
            self.answers = (self.answers + [y])[-3:]
            return self.answers[0]  # the answer of two calls back
        if getattr(self, "last", None) is not None and torch.equal(x, self.last):
            self.stale = True
        self.last = x.clone()
        self.answers = (self.answers + [y])[-3:]
        return y
"""


def test_the_answer_of_two_calls_back_is_caught_over_2_24_elements(ev):
    r = ev.evaluate(NEAR_CONSTANT_BIG, BIG_TWO_BACK, config=TIMED.replace(timing_min_reps=5))
    assert "degenerate_problem" in r.flags, r.flags
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.speedup, r.flags, r.error)


RELU_OF_RAND = Problem(id=39, name="39_ReluOfRand", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.rand(256, 1024)]

def get_init_inputs():
    return []
""")

INPUT_ON_WIDENED = after_the_rerun("return torch.relu(x)", """
if self.calls == 1:  # the trial on widened inputs (3 * randn) follows the rerun
    return torch.relu(x)
return x  # the input: the answer on the problem's own inputs (rand), not on the widened ones
""")


def test_the_input_in_widened_timed_calls_is_caught(ev):
    r = ev.evaluate(RELU_OF_RAND, INPUT_ON_WIDENED, config=SAMPLED)
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.speedup, r.flags, r.error)
