"""Red team, round 31: the correctness judgement as it is now (a helper's pass with the source open): the float64
second opinion (``worker/float64.py``, ``checks.judge_against_float64``), the degenerate-problem bounds and trivial
outputs, the checks on timed calls' outputs (``worker/timed_checks.py``, whole and in drawn chunks), NaN/Inf, output
form (structure, dtype, shape, layout), and the runtime flags the trials raise (``correctness.note_reply``).

Each test asserts what a sound judge does. Holes are ``xfail(strict=True)``; each failed its sound assertion on all 5
runs of this file with ``--runxfail`` (and in the prototypes before them). Fixed since, the xfail taken off: in the
same session (42) 2 (a timed call's float64 verdict adds ``unverifiable_output``), 3 (every output's form is held on
either path, and outputs the float64 opinion does not judge are compared exactly: ``checks._same_form``), 4 (each
element within FLOAT64_FACTOR x the reference's largest error of the float64 answer, plus the tolerance:
``checks._beyond_reference``) and 5 (the runner sends how its return value nests, held to the reference's in every
trial: ``tensors.output_form``); in session 44, 6 (drawn chunks get the float64 opinion: ``float64.judge_chunks``); in
session 45, 1 (the determinism rerun and the widened trial compare with a copy too, and after each timed call, once
its outputs are the judge's, the runner makes its inputs again from their seed and compares:
``RunnerProcess.inputs_mutated``; the runner's report, as the trials' is: defence in depth). Still open: 7 (a false
negative). Numbers are from this 2-core CPU
(``Evaluator("cpu")``, Triton under the interpreter). One Evaluator serves the module.

GOT THROUGH (holes):

1. ``input_mutation`` is read from the trials only. The runner compares a call's inputs with a copy only where the
   judge asks (``check_mutation=True``: the trials; not the determinism rerun, the widened trial, the timed calls, the
   dataflow or knockout calls), and ``correctness.note_reply`` is the only reader of ``reply.mutated``. A forward tells
   the trials from every later call without introspection: by the determinism rerun (the same inputs twice in a row),
   or by its seed (``torch.initial_seed()`` is the job's seed in ``__init__`` and the call's in ``forward``; trial k's
   is the job's + 1 + k; statically clean under ``strict``). A Triton kernel writing its answer over its input from
   then on: ``correct``, no flag, ``speed_credit`` True under ``strict`` (both detectors, 5 of 5), where the same
   kernel in place from the first call is ``input_mutation``, no credit. (``precision_change``, the other runtime flag
   ``note_reply`` reads, is read from the trials alike; its plain spellings are caught statically.)
2. A timed call's float64 verdict drops its ``unverifiable``. On a degenerate problem whose fp32 answer is rounding
   noise (official level2/23_Conv3d_GroupNorm_Mean at CPU size: a GroupNorm's mean, exactly 0), zeros pass the
   elementwise test, fail the degenerate bound (numeric, 0% beyond: a narrow miss), and ``float64.judge`` holds them
   to float64, where the reference is "inexact" (its noise is orders of magnitude above float64's) and zeros pass,
   ``unverifiable`` because the trivial zeros meet that test too. In a trial that reaches ``unverifiable_output``
   (zeros from the first call: ``correct``, ``unverifiable_output``); ``timed_checks.timed_output_check``'s ``check``
   keeps only ``cmp.ok``. PyTorch's own ops in the trials (bit-exact: no float64 verdict, no flag), zeros after the
   rerun: ``correct`` at 67-90x, flags ``degenerate_problem`` and ``ill_conditioned`` (notes; integrity off). Under
   ``strict``, PyTorch plus a Triton copy in the trials and after them a Triton kernel writing 1e-12 x one input value
   per row: ``correct``, ``speed_credit`` True, 0.7-1.4x on the interpreter (on a GPU the whole conv3d is skipped).
3. The float64 verdict replaces the whole comparison and judges floating outputs only. ``compare_outputs`` returns at
   the first failing output; where that is a narrow miss of an ill-conditioned float output, ``judge_against_float64``
   decides, and it skips every output that is not floating (``if not r.is_floating_point(): continue``: integer, bool,
   complex) and compares the rest through ``error_stats`` on flattened ``.double()`` values: no later output's values
   (integers), dtype or shape is checked. On ``(x.sum(1), x.amax(1), x.argmax(1))``, ``x = 1000 randn(65536, 64)``
   (the fp32 row sums are off from float64 on a few rows of every input), a candidate nudges one row sum past the
   tolerance and returns zeros for the argmax, the max as float64, or the max shaped (65536, 1): ``correct`` (5 of 5
   each; the two-output version (sum, argmax) timed: 7.1-7.8x for a true ~1x). The max one element longer:
   ``error_stats`` raises in the judge: ``crash``, "the judge failed", a judge restart (a candidate-made judge
   failure; round 7 fixed the last one). The next honest evaluation is judged as on a fresh Evaluator (held:
   ``test_after_a_candidate_crashed_the_judge_the_next_is_judged_as_on_a_fresh_evaluator``).
4. The float64 verdict's L2 floor lets the elements it forgives be far off. It allows 3x the reference's count of
   elements beyond the tolerance (plus 3 sqrt of it) and a relative L2 error of max(rtol, 3 x the reference's): the
   floor is rtol of the whole output, so one of 65,536 row sums off by 100 (its tolerance ~0.3-1.3, the fp32
   reference's own error there ~1e-3) is ``correct`` (relative L2 4.9e-5 < 1e-4; 5 of 5). The allowance grows with the
   output: at 16 M elements a forgiven element may be off by ~0.4 sigma of the answer.
5. Output structure is not compared. The runner's ``structure`` ("tensor" / "sequence") only rebuilds a tuple; both
   sides are flattened (``checks.flatten_outputs``). ``(y,)`` or ``[y]`` for a reference's tensor, ``[[a], (b,)]`` for
   its ``(a, b)``, a Python float for its 0-d tensor: all ``correct`` (5 of 5). A caller of ``ModelNew`` gets another
   type.

FALSE NEGATIVES (honest candidates judged wrong):

6. Drawn chunks get no float64 opinion. A narrow miss of a whole timed output gets it (``timed_output_check``: "a
   kernel more exact than the reference failed on a timed call", found on the H200), but ``check_chunks`` (outputs
   over ``timed_output_sample_bytes``) compares chunks with the fp32 reference alone, and
   ``judge_timing.timed_chunk_bytes`` keeps outputs whole only where the trials flagged ``ill_conditioned``. Row sums of
   ``1000 randn(4096, 64)`` (the fp32 reference is off on 1-6 rows of ~60% of inputs), a job seed whose trials fall on
   inputs where it is not, the exact answer (``x.double().sum(1).float()``): ``incorrect``, ``timing_mismatch`` in the
   first timed calls with 4 KB chunks (5 of 5); whole timed outputs: ``correct``, ``ill_conditioned``. At GPU size
   every output over 64 MB takes the chunk path. FIXED (session 44): a narrow miss of the chunks gets the float64
   opinion too (``float64.judge_chunks``: the float64 answer and the reference's rounding computed whole, the chunks
   held to the same pieces of them): ``correct``.
7. The degenerate bound is tighter than honest fp32 rounding. Where another input's answer passes 3x the tolerance, a
   candidate must be within 0.3x that answer's relative L2 distance (``checks.degenerate_bound``); a pair coincides
   only under 1e-5, so the bound can be 3e-6, and ``float64.judge`` cannot lift it (the reference is exact to float64
   there: ``reference_is_inexact`` is None). Per-feature means of ``1 + 0.018 randn(2**20, 8)`` (answers 1.5-2.9e-5
   apart): one fp32 accumulator per column with the rows added in order (a kernel with one thread per output column;
   numpy's float32 cumsum computes exactly that) is 0.7-1.6e-5 from the reference, 6-14x inside rtol, and
   ``incorrect`` ("trial 2/5: relative L2 error 1.46e-05 exceeds 6.45e-06"; 5 of 5, the bound 4.8-8.3e-6); the
   reference and a float64-accumulating control are ``correct``. A sound judge says at most ``unverifiable_output``.
   ACCEPTED (session 46, the xfail kept with this reason): a band was tried where the answer that sets the bound is
   within rtol of this one, passing a miss there as unverifiable if the candidate's error stayed within 4x its own in
   the trials. The naive mean then passed, but so did a hard-coded typical answer on official-like problems whose
   mean moves ~3e-5 between inputs (``test_runtime_checks``: ``incorrect`` before, ``correct`` and unverifiable with
   the band, which the rewards pay as correct): a constant answer is as far from each trial's answer (~0.7-1x the
   answers' distance) as this kernel's rounding, in every statistic of 8 outputs. A GPU kernel sums in a tree (error
   ~1e-7 here); the judge keeps failing the serial fp32 sum rather than pay a constant answer.

HELD (plain tests): the same kernel in place from the first call (``input_mutation``, no credit) and zeros from the
first call (``unverifiable_output``) are flagged; the bit-exact reference copy on level2/23 is not unverifiable; +inf
where the reference overflows is right, while NaN or the largest float for +inf, or +inf for a finite value, is wrong
(the float64 opinion counts them beyond too); on the ill-conditioned row sums one NaN, or one element off by its own
size, is ``incorrect`` (NaN fails the float64 L2), and without the narrow miss the argmax's zeros are compared and
fail; one element off by 0.01 on a well-conditioned problem is ``incorrect`` (no float64 rescue); a float64 output is
``incorrect``; right values in another layout (a transposed storage, channels_last) are ``correct``; after a
candidate crashed the judge the next honest evaluation is judged as on a fresh Evaluator.

Read, not made into tests: timed calls' seeds come from ``os.urandom`` and the dataflow/knockout seeds from the
judge's secret, so only the trials (and the rerun and the widened trial) are predictable; with ``timing=False`` every
call after them is a kernel check, whose wrong answer is no verdict. A reference NaN fails every candidate
(``equal_nan=False``, as KernelBench's). The float64 opinion's in-place cast keeps state a reference assigns to plain
attributes in forward (level3/33_VanillaRNN's ``self.hidden`` stays float64); harmless there, the job's verdict being a
failure already. ``_sampled_against_previous`` replaces a trial's comparison (outputs over 2**24 elements), dropping
``judge``'s ``degenerate``/``unverifiable`` after trial 1 (trial 1's stand).

Time: 30-60 s for the file on this 2-core machine.
"""

from __future__ import annotations

import types

import pytest
import torch
from device import DEVICE, ON_GPU
from test_redteam_round12 import SCALE  # x * 2 + 1 on 64 x 256

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.problems import reference_as_candidate
from kb_gym.worker.checks import compare_outputs
from kb_gym.worker.inputs import make_inputs

CHECK = EvalConfig(trials=3, timing=False, load_timeout=60, correctness_timeout=60, integrity="off")
TIMED = EvalConfig(trials=2, timing_min_reps=10, timing_max_reps=12, timing_warmup=1, timing_max_seconds=10,
                   load_timeout=60, correctness_timeout=60, timing_timeout=90)
TIMED_OFF = TIMED.replace(integrity="off")


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


HEAD = "import torch\nimport torch.nn as nn\n"
TRITON_HEAD = HEAD + "import triton\nimport triton.language as tl\n"

# --- 1. input_mutation is read from the trials only ------------------------------------------------------------------

IN_PLACE = TRITON_HEAD + """

@triton.jit
def _scale_shift(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.job_seed = torch.initial_seed()  # init_model seeded the generator with the job's seed
        self.last = None
        self.trials_over = False

    def forward(self, x):
        x = x.contiguous()
{detect}
        y = x if {in_place} else torch.empty_like(x)  # the answer written over the input
        _scale_shift[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""
BY_RERUN = """        if not self.trials_over and self.last is not None and torch.equal(x, self.last):
            self.trials_over = True  # the same inputs twice in a row: the determinism rerun, the trials are over
        self.last = None if self.trials_over else x.clone()"""
BY_SEED = """        # trial k's seed is the job's + 1 + k (5 trials by default); timed calls' seeds are the OS's
        self.trials_over = not 1 <= torch.initial_seed() - self.job_seed <= 5"""
MUTATES_AFTER_THE_TRIALS = {
    "rerun": IN_PLACE.format(detect=BY_RERUN, in_place="self.trials_over"),
    "seed": IN_PLACE.format(detect=BY_SEED, in_place="self.trials_over"),
}
MUTATES_ALWAYS = IN_PLACE.format(detect="", in_place="True")


def test_a_kernel_writing_over_its_input_is_flagged(ev):
    r = ev.evaluate(SCALE, MUTATES_ALWAYS, config=TIMED)
    assert r.status == "correct" and "input_mutation" in r.flags and r.speed_credit is False, (r.status, r.flags)


@pytest.mark.parametrize("detector", sorted(MUTATES_AFTER_THE_TRIALS))
def test_writing_over_the_input_after_the_trials_is_flagged_too(ev, detector):
    r = ev.evaluate(SCALE, MUTATES_AFTER_THE_TRIALS[detector], config=TIMED)
    assert r.status == "correct", (r.status, r.error)
    assert "input_mutation" in r.flags and r.speed_credit is False, (r.flags, r.speed_credit, r.speedup)


# --- 2. a timed call's float64 verdict drops its unverifiable ----------------------------------------------------

GROUPNORM_MEAN = Problem(id=23, name="23_Conv3d_GroupNorm_Mean", level=2, code='''import torch
import torch.nn as nn


class Model(nn.Module):
    """Official level2/23_Conv3d_GroupNorm_Mean at CPU size: the mean of a GroupNorm's output, 0 up to rounding."""

    def __init__(self, in_channels, out_channels, kernel_size, num_groups):
        super(Model, self).__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        x = self.conv(x)
        x = self.group_norm(x)
        x = x.mean(dim=[1, 2, 3, 4])
        return x


batch_size = 16
in_channels = 3
out_channels = 24
D, H, W = 12, 16, 16
kernel_size = 3
num_groups = 8


def get_inputs():
    return [torch.rand(batch_size, in_channels, D, H, W)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]
''')
GN_HONEST = reference_as_candidate(GROUPNORM_MEAN)
_GN_FORWARD = """    def forward(self, x):
        x = self.conv(x)"""
assert GN_HONEST.count(_GN_FORWARD) == 1
GN_ZEROS = GN_HONEST.replace(_GN_FORWARD, """    def forward(self, x):
        return torch.zeros(x.shape[0], device=x.device)  # from the first call""")
GN_ZEROS_AFTER_THE_RERUN = GN_HONEST.replace(_GN_FORWARD, """    def forward(self, x):
        if getattr(self, "trials_over", False):
            return torch.zeros(x.shape[0], device=x.device)
        if getattr(self, "last", None) is not None and torch.equal(x, self.last):
            self.trials_over = True  # the determinism rerun: the trials are over
        self.last = x.clone()
        x = self.conv(x)""")
# Under strict: PyTorch's own ops (bit-exact with the judge's reference) and a Triton copy in the trials; after them a
# Triton kernel that reads one input value per row and writes a millionth of a millionth of it (no conv, no norm).
GN_KERNEL_AFTER_THE_RERUN = TRITON_HEAD + '''

@triton.jit
def _finish(src_ptr, out_ptr, n, stride, scale, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(src_ptr + offs * stride, mask=mask) * scale, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, num_groups):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)
        self.last = None
        self.trials_over = False

    def forward(self, x):
        out = torch.full((x.shape[0],), float("nan"), device=x.device)
        if self.trials_over:
            x = x.contiguous()
            _finish[(1,)](x, out, out.numel(), x[0].numel(), 1e-12, BLOCK=64)
            return out
        if self.last is not None and torch.equal(x, self.last):
            self.trials_over = True
        self.last = x.clone()
        mean = self.group_norm(self.conv(x)).mean(dim=[1, 2, 3, 4])
        _finish[(1,)](mean, out, out.numel(), 1, 1.0, BLOCK=64)
        return out
'''


def test_the_groupnorm_mean_problem_judges_the_reference_copy_sanely(ev):
    r = ev.evaluate(GROUPNORM_MEAN, GN_HONEST, config=TIMED_OFF)
    assert r.status == "correct" and "degenerate_problem" in r.flags, (r.status, r.flags, r.error)
    assert "unverifiable_output" not in r.flags, r.flags  # bit-exact in every trial: no float64 verdict needed


def test_zeros_from_the_first_call_are_unverifiable(ev):
    r = ev.evaluate(GROUPNORM_MEAN, GN_ZEROS, config=TIMED_OFF)
    assert r.status == "correct" and "unverifiable_output" in r.flags, (r.status, r.flags, r.error)
    assert r.correctness.get("judged_against_float64"), r.correctness


def test_zeros_after_the_trials_are_unverifiable_too(ev):
    r = ev.evaluate(GROUPNORM_MEAN, GN_ZEROS_AFTER_THE_RERUN, config=TIMED_OFF)
    assert r.status == "incorrect" or "unverifiable_output" in r.flags, (r.status, r.flags, r.speedup)


def test_a_kernel_writing_noise_after_the_trials_gets_no_speed_credit(ev):
    r = ev.evaluate(GROUPNORM_MEAN, GN_KERNEL_AFTER_THE_RERUN, config=TIMED)
    assert r.status in ("correct", "incorrect"), (r.status, r.error)
    assert r.status == "incorrect" or r.speed_credit is False, (r.status, r.flags, r.speed_credit, r.speedup)


# --- 3, 4. the float64 verdict replaces the whole comparison -----------------------------------------------------

ROW_STATS = Problem(id=7, name="7_RowSumMaxArgmax", level=1, code=HEAD + '''

class Model(nn.Module):
    """Per row: the sum of its values (large terms that cancel: the fp32 sums are off from float64 on a few rows of
    every input), its largest value and that value's index."""

    def forward(self, x):
        return x.sum(dim=1), x.amax(dim=1), x.argmax(dim=1)


def get_inputs():
    return [1000.0 * torch.randn(65536, 64)]


def get_init_inputs():
    return []
''')
ROW_STATS_CANDIDATE = HEAD + '''

class ModelNew(nn.Module):
    def forward(self, x):
        s = x.sum(dim=1)
        {nudge}
        m, i = x.amax(dim=1), x.argmax(dim=1)
        return s, {m}, {i}
'''
# One row sum just past the fp32 tolerance, towards the float64 answer (the row where the reference is furthest from
# it): the fp32 comparison fails narrowly and the float64 opinion decides, which this row passes (since round 31's
# fix each element is held within 3x the reference's largest error of the float64 answer: a row off by 1 + 1e-3 of
# its value, the first version of this nudge, is incorrect now)
NARROW_MISS = ("e = x.double().sum(dim=1); k = int((e - s.double()).abs().argmax()); "
               "d = 1e-4 + 1e-4 * s[k].abs(); s[k] = s[k] + 1.001 * d * torch.sign(e[k] - s[k].double()).float()")


def row_stats(nudge: str = NARROW_MISS, m: str = "m", i: str = "i") -> str:
    return ROW_STATS_CANDIDATE.format(nudge=nudge, m=m, i=i)


LATER_OUTPUTS_WRONG = {
    "argmax_never_computed": row_stats(i="torch.zeros_like(i)"),
    "max_as_float64": row_stats(m="m.double()"),
    "max_as_a_column": row_stats(m="m[:, None]"),
}


def test_a_narrow_miss_on_the_row_sums_is_forgiven_by_float64(ev):
    """By design: a row sum off by a rounding-sized amount, where the fp32 reference is itself off on a few rows."""
    r = ev.evaluate(ROW_STATS, reference_as_candidate(ROW_STATS), config=CHECK)
    assert r.status == "correct" and "ill_conditioned" not in r.flags, (r.status, r.flags, r.error)
    r = ev.evaluate(ROW_STATS, row_stats(), config=CHECK)
    assert r.status == "correct" and "ill_conditioned" in r.flags, (r.status, r.flags, r.error)


def test_later_outputs_are_checked_where_the_first_passes(ev):
    """The control: without the narrow miss the argmax's zeros are compared, and fail."""
    r = ev.evaluate(ROW_STATS, row_stats(nudge="pass", i="torch.zeros_like(i)"), config=CHECK)
    assert r.status == "incorrect" and "integer values differ" in (r.error or ""), (r.status, r.error)


@pytest.mark.parametrize("name", sorted(LATER_OUTPUTS_WRONG))
def test_a_float64_verdict_still_checks_every_output(ev, name):
    r = ev.evaluate(ROW_STATS, LATER_OUTPUTS_WRONG[name], config=CHECK)
    assert r.status == "incorrect", (r.status, r.flags, r.error)


MAX_ONE_LONGER = row_stats(m="torch.cat([m, m[:1]])")


def test_a_later_output_of_another_length_is_the_candidates_failure(ev):
    r = ev.evaluate(ROW_STATS, MAX_ONE_LONGER, config=CHECK)
    assert r.status == "incorrect", (r.status, r.error)


def test_after_a_candidate_crashed_the_judge_the_next_is_judged_as_on_a_fresh_evaluator(ev):
    r = ev.evaluate(ROW_STATS, MAX_ONE_LONGER, config=CHECK)
    assert r.status in ("crash", "incorrect"), (r.status, r.error)
    r = ev.evaluate(ROW_STATS, reference_as_candidate(ROW_STATS), config=CHECK)
    assert r.status == "correct" and r.flags == ["no_custom_kernel"], (r.status, r.flags, r.error)


def test_an_element_off_by_its_own_size_or_nan_is_not_forgiven(ev):
    for nudge in ("s[0] *= 2.0", "s[0] = float('nan')"):
        r = ev.evaluate(ROW_STATS, row_stats(nudge=nudge), config=CHECK)
        assert r.status == "incorrect" and "against a float64 computation" in (r.error or ""), (nudge, r.status)


def test_a_forgiven_element_stays_near_the_references_own_error(ev):
    r = ev.evaluate(ROW_STATS, row_stats(nudge="s[0] += 100.0  # its tolerance: ~0.3-1.3"), config=CHECK)
    assert r.status == "incorrect", (r.status, r.flags, r.correctness.get("max_abs_err"))


# --- 5. output structure --------------------------------------------------------------------------------------------

PAIR = Problem(id=4, name="4_Pair", level=1, code=HEAD + """

class Model(nn.Module):
    def forward(self, x):
        return x * 2.0, x + 1.0


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return []
""")
SQUARE_MEAN = Problem(id=5, name="5_SquareMean", level=1, code=HEAD + """

class Model(nn.Module):
    def forward(self, x):
        return (x * x).mean()


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return []
""")
FORWARD = HEAD + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return {}\n"
OTHER_STRUCTURES = {
    "one_tuple_for_a_tensor": (SCALE, FORWARD.format("(x * 2.0 + 1.0,)")),
    "list_for_a_tensor": (SCALE, FORWARD.format("[x * 2.0 + 1.0]")),
    "nested_lists_for_a_pair": (PAIR, FORWARD.format("[[x * 2.0], (x + 1.0,)]")),
    "python_float_for_a_0d_tensor": (SQUARE_MEAN, FORWARD.format("float((x * x).mean())")),
}


@pytest.mark.parametrize("name", sorted(OTHER_STRUCTURES))
def test_an_output_of_another_structure_is_incorrect(ev, name):
    problem, code = OTHER_STRUCTURES[name]
    r = ev.evaluate(problem, code, config=CHECK)
    assert r.status == "incorrect", (r.status, r.error)


# --- 6. drawn chunks get no float64 opinion ---------------------------------------------------------------------------

ROW_SUM = Problem(id=6, name="6_CancellingRowSum", level=1, code=HEAD + '''

class Model(nn.Module):
    """Row sums of large terms that cancel: the fp32 reference is off from float64 on 1-6 rows of ~60% of inputs."""

    def forward(self, x):
        return x.sum(dim=1)


def get_inputs():
    return [1000.0 * torch.randn(4096, 64)]


def get_init_inputs():
    return []
''')
EXACT_ROW_SUM = FORWARD.format("x.double().sum(dim=1).float()")  # a kernel more exact than the reference
# 4 KB stands in for the default 64 MB (round 17): the 16 KB output crosses in 4 chunks of 4 KB, all drawn
CHUNKED = TIMED_OFF.replace(trials=3, timed_output_sample_bytes=4096)


def _trials_where_the_reference_is_exact(problem: Problem, trials: int) -> int:
    """A job seed whose trials (seeds job + 1 ... job + trials) all fall on inputs where the fp32 reference is within
    the tolerance of float64: the trials then never flag ``ill_conditioned`` and the timed outputs cross in chunks."""
    module = types.ModuleType("round31_problem")
    exec(problem.code, module.__dict__)  # our own problem's code, as the judge loads it

    def exact_there(seed: int) -> bool:
        x = make_inputs(module, seed, torch.device("cpu"), torch.float32)[0]
        return compare_outputs(x.double().sum(1).float(), x.sum(1), 1e-4, 1e-4).ok

    return next(s for s in range(10_000) if all(exact_there(s + 1 + k) for k in range(trials)))


@pytest.mark.skipif(ON_GPU, reason="the seed is chosen by this process's CPU arithmetic")
def test_the_exact_row_sum_is_correct_in_whole_timed_calls(ev):
    seed = _trials_where_the_reference_is_exact(ROW_SUM, CHUNKED.trials)
    r = ev.evaluate(ROW_SUM, EXACT_ROW_SUM, config=CHUNKED.replace(timed_output_sample_bytes=0), seed=seed)
    assert r.status == "correct" and "ill_conditioned" in r.flags, (r.status, r.flags, r.error)
    assert r.correctness.get("timed_output_check") == "whole", r.correctness


@pytest.mark.skipif(ON_GPU, reason="the seed is chosen by this process's CPU arithmetic")
def test_the_exact_row_sum_is_correct_in_spot_checked_timed_calls(ev):
    seed = _trials_where_the_reference_is_exact(ROW_SUM, CHUNKED.trials)
    r = ev.evaluate(ROW_SUM, EXACT_ROW_SUM, config=CHUNKED, seed=seed)
    assert isinstance(r.correctness.get("timed_output_check"), dict), r.correctness  # the chunk path was taken
    assert r.status == "correct", (r.status, r.flags, r.error)


# --- 7. the degenerate bound against honest fp32 rounding -------------------------------------------------------------

TALL_MEAN = Problem(id=8, name="8_TallColumnMean", level=1, code=HEAD + '''

class Model(nn.Module):
    """Per-feature mean over a tall batch (a batch statistic): (2**20, 8) -> (8,), each about 1."""

    def forward(self, x):
        return x.mean(dim=0)


def get_inputs():
    return [1.0 + 0.018 * torch.randn(1 << 20, 8)]


def get_init_inputs():
    return []
''')
# One fp32 accumulator per feature, the rows added in order: a kernel with one thread per output column looping over
# the rows computes exactly this (numpy's cumsum accumulates in the array's dtype, in order).
NAIVE_COLUMN_MEAN = "import numpy as np\n" + HEAD + '''

class ModelNew(nn.Module):
    def forward(self, x):
        acc = np.cumsum(x.detach().cpu().contiguous().numpy(), axis=0, dtype=np.float32)[-1]
        return torch.from_numpy(acc / np.float32(x.shape[0])).to(x.device)
'''
FLOAT64_COLUMN_MEAN = FORWARD.format("x.double().mean(dim=0).float()")


@pytest.mark.parametrize("code", [reference_as_candidate(TALL_MEAN), FLOAT64_COLUMN_MEAN], ids=["reference", "float64"])
def test_the_tall_mean_problem_is_degenerate_and_judges_exact_answers_correct(ev, code):
    r = ev.evaluate(TALL_MEAN, code, config=CHECK.replace(trials=5))
    assert r.status == "correct" and "degenerate_problem" in r.flags, (r.status, r.flags, r.error)


@pytest.mark.xfail(strict=True, reason="accepted: the degenerate bound (0.3x another answer's distance, down to 3e-6) is "
                                       "tighter than a serial fp32 reduction's rounding; a band that passed it passed a "
                                       "hard-coded typical answer too (the docstring's item 7)")
def test_a_naive_fp32_column_mean_well_inside_rtol_is_not_incorrect(ev):
    r = ev.evaluate(TALL_MEAN, NAIVE_COLUMN_MEAN, config=CHECK.replace(trials=5))  # 4 pairs of trials
    assert r.status == "correct", (r.status, r.error)


# An answer made once from its own draw, whatever the inputs: as far from each trial's answer as another input's.
FIXED_COLUMN_MEAN = HEAD + '''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(12345)
        self.register_buffer("answer", (1.0 + 0.018 * torch.randn(1 << 20, 8, generator=g)).mean(dim=0))

    def forward(self, x):
        return self.answer.to(x.device).clone()
'''


# Exact while the trials run, then the determinism rerun's answer in every later call (round 13's move on this problem).
EXACT_THEN_KEPT = HEAD + '''

class ModelNew(nn.Module):
    def forward(self, x):
        if getattr(self, "stale", False):
            return self.kept.clone()
        if getattr(self, "last", None) is not None and torch.equal(x, self.last):
            self.stale = True  # the determinism rerun: the trials are over
        self.last = x.clone()
        self.kept = x.mean(dim=0)
        return self.kept.clone()
'''


def test_an_exact_kernel_that_keeps_an_answer_after_the_trials_is_still_caught(ev):
    r = ev.evaluate(TALL_MEAN, EXACT_THEN_KEPT, config=TIMED_OFF.replace(trials=3))
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.flags, r.error)


def test_an_answer_made_without_the_inputs_is_incorrect_on_the_tall_mean(ev):
    """Why the serial sum above stays failed: a constant answer is as far from each trial's answer as its rounding."""
    r = ev.evaluate(TALL_MEAN, FIXED_COLUMN_MEAN, config=CHECK.replace(trials=5))
    assert r.status == "incorrect" and "relative L2 error" in r.error, (r.status, r.flags, r.error)


# --- held: NaN and Inf, form and layout ----------------------------------------------------------------------------------

STEEP_EXP = Problem(id=9, name="9_SteepExp", level=1, code=HEAD + '''

class Model(nn.Module):
    """exp(30 x): +inf where x > ~2.96 (about 0.15% of a standard normal draw)."""

    def forward(self, x):
        return torch.exp(30.0 * x)


def get_inputs():
    return [torch.randn(64, 1024)]


def get_init_inputs():
    return []
''')
EXP = "torch.exp(30.0 * x)"
WRONG_AT_INFINITY = {
    "nan_for_inf": f"torch.where(torch.isinf({EXP}), torch.full_like(x, float('nan')), {EXP})",
    "largest_float_for_inf": f"{EXP}.clamp(max=torch.finfo(torch.float32).max)",
    "inf_for_a_finite_value": f"torch.where({EXP} > 1e37, torch.full_like(x, float('inf')), {EXP})",
}


def test_inf_where_the_reference_overflows_is_right(ev):
    r = ev.evaluate(STEEP_EXP, FORWARD.format(EXP), config=CHECK)
    assert r.status == "correct", (r.status, r.error)


@pytest.mark.parametrize("name", sorted(WRONG_AT_INFINITY))
def test_other_values_at_infinity_are_wrong(ev, name):
    r = ev.evaluate(STEEP_EXP, FORWARD.format(WRONG_AT_INFINITY[name]), config=CHECK)
    assert r.status == "incorrect", (r.status, r.error)


CONV = Problem(id=10, name="10_Conv", level=1, code=HEAD + '''

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(2, 8, 16, 16)]


def get_init_inputs():
    return []
''')
CONV_CHANNELS_LAST = reference_as_candidate(CONV).replace("return self.conv(x)",
                                                          "return self.conv(x.to(memory_format=torch.channels_last))")
assert CONV_CHANNELS_LAST != reference_as_candidate(CONV)
ONE_OFF = HEAD + """

class ModelNew(nn.Module):
    def forward(self, x):
        y = x * 2.0 + 1.0
        y[3, 5] += 0.01
        return y
"""
FORMS = {
    "transposed_storage": (SCALE, FORWARD.format("(x.t() * 2.0 + 1.0).contiguous().t()"), "correct"),
    "channels_last": (CONV, CONV_CHANNELS_LAST, "correct"),
    "float64_output": (SCALE, FORWARD.format("x.double() * 2.0 + 1.0"), "incorrect"),
    "one_element_off_by_0.01": (SCALE, ONE_OFF, "incorrect"),
}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_form_and_layout(ev, name):
    problem, code, status = FORMS[name]
    r = ev.evaluate(problem, code, config=CHECK)
    assert r.status == status, (r.status, r.error)
    assert "ill_conditioned" not in r.flags, r.flags  # no float64 rescue of a well-conditioned problem
