"""Red team, round 33: what the last session changed, read from the candidate's side: the runner-reported output form
(``tensors.output_form``, ``CallReply.form``, ``correctness.run_trials``), the float64 second opinion's per-element
bound (``checks._beyond_reference``, ``judge_against_float64``, ``worker/float64.py``), the neighbour pause's
kernel-time discount (``neighbours._ran``: ``ProcessUsage.system_ticks``, ``TICK_NS``) and the calibration board
(``calibration_board.py``, ``judge_timing.adopt_calibration``).

Each test asserts what a sound judge does; a test that fails against the code it was written on exposes a hole (not
xfail: the fix makes it pass). Numbers are from this 2-core CPU (``Evaluator("cpu")``, Triton under the interpreter).

GOT THROUGH (failing tests):

1. ``test_a_row_sum_wrong_by_a_fifth_of_its_value_is_not_forgiven_by_float64`` (a wrong answer judged correct). The
   per-element bound of the float64 opinion is FLOAT64_FACTOR x the fp32 reference's *largest* error over the whole
   output, in absolute terms (``_beyond_reference``'s ``worst``), plus the tolerance. Where the output's elements
   differ in scale, that largest error sits on the largest elements and forgives the small ones everything up to it.
   Row sums where half the rows are scaled 1e5 (the reference is off from float64 by up to 0.4-0.5 on those, beyond
   the tolerance on 8-15 rows) and half are plain ``randn`` (sums ~5, whose own rounding error is ~4e-6): a candidate
   that returns the float64 sums and adds 2.5x the reference's largest error (~1.1) to 3x as many small rows as the
   reference has rows beyond the tolerance is ``correct`` (``ill_conditioned``, max abs error 1.25): rows wrong by
   ~20% of their value, ~300,000x their honest rounding error. The count and L2 bounds pass it (the L2 of a 1e5-scaled output hides
   anything on the small rows).
2. ``test_a_tiled_row_sum_is_not_incorrect_where_the_reference_happens_to_round_well`` (an honest answer judged
   wrong). The float64 opinion is asked only where the fp32 reference is itself beyond the tolerance on this input
   (``reference_is_inexact``). On round 31's cancelling row sums (``1000 randn(4096, 64)``) the reference lands within
   the tolerance of float64 on ~1 input in 4 by luck, while a kernel that sums in another order (here 4 tiles of 16,
   then the partials; the same for a reversed order or a naive sequential fp32 loop) misses there on a row or two: in
   30 inputs each of three honest orders narrowly missed on 5-9 where the reference was "exact" (``incorrect``, no
   second opinion), and passed the float64 opinion on the rest. With 5 trials an honest tiled sum is ``incorrect`` in
   more than half of its evaluations; with timing on, each timed call (fresh ``os.urandom`` inputs) is another draw,
   so over ten or more timed calls it is ``incorrect`` almost always (``timing_mismatch``).
3. ``test_a_neighbour_that_burns_inside_the_kernel_is_stopped_or_killed`` (the pause is escaped). ``_ran`` takes the
   tree's kernel ticks off its CPU before comparing with RAN_NS, for every process and for the whole pause. A
   loading candidate that loops on ``mmap(MAP_POPULATE)`` of 64 MB (each call ~10-30 ms of page zeroing in the
   kernel, microseconds of its own code) and has a sleeping child with round 5's SIGCONT timers send it SIGCONT
   keeps running through the measurement: 1.97-1.99 s of CPU in a 2 s measurement (197 of 197 ticks in the
   kernel), never killed. Its work (a core and memory bandwidth) is exactly what the pause exists to keep off a neighbour's
   timing, and the same kernel work during a sibling's spare calibration inflates the overhead that the calibration
   board then shares with the device's other judges for 60 s (``spare_calibration`` runs inside ``Measuring``).
   A timer in the burner itself does not work: a long system call leaves its SIGCONTs pending, and the stop
   discards them (the timers die), hence the child.
4. ``test_a_board_entry_with_an_impossible_overhead_is_not_adopted`` (defence in depth; no candidate route found).
   ``adopt_calibration`` holds an entry to ``shareable``, whose ``max(floor, SHARED_SPREAD * overhead)`` is the floor
   for a NaN or negative overhead: an entry with overhead NaN, +inf or -50 ms is adopted (the board's ``keep``
   checks only the key and ``measured_at``). A NaN or inf overhead would make every excess not a number or
   negative (nothing charged), a negative one would charge honest candidates. Entries come only from judges'
   ``calibration`` messages under the job's token, from pristine spares, so no candidate was found to write one.

FIXED (session 43): 3, the pause stops the tree again at each look (a SIGCONT cancels a stop still pending in a long
system call, so the burner never took it), and a process seen to switch out of its own will since the first reading
(it took a stop, or slept) has its kernel time counted from then on (``neighbours._ran``'s ``switched``): the burner
is killed within ~0.1 s, and tests/test_neighbours.py's honest long mapping is still not; 4, an entry's times must be
finite and not negative (``judge_timing.plausible``, ``calibration_board._times``); and a runner that says no form is
held to the reference's all the same (``correctness.run_trials``: "" skipped the check; an honest runner always says
it).

FIXED (session 44): 1 and 2, by a per-element rounding scale. On a narrow miss where the reference's own error reaches
1/50 of the tolerance somewhere, the judge runs the fp32 reference and float64 on three nearby inputs too (every
floating input times 1 + a draw within +-2^-12: ``float64.rounding_spread``). Each element is then held within 50x
the largest error the reference made on it over the four samples, plus the tolerance (``checks._beyond_own_scale``;
3 + 1e-4 of the elements may exceed that, each still within 3x the largest error anywhere), and the count and L2
bounds are at least the samples' mean (elements where 3x the reference would fail, plus 3 more). 1: ``incorrect``
(24-45 small rows moved; an attacker can still move up to 9 of 65,536 rows by up to 3x the reference's largest error,
which buys nothing); 2: ``correct``. Judge-level runs on this CPU (``1000 randn(4096, 64)`` row sums, 200 inputs x 4
honest orders): 0 honest misses judged ``incorrect``, against 85 by the old rule.

HELD (passing tests): a runner that reports a 4 MB form, a non-string form or a form holding control tokens leaves
the judge up, gets no verdict better than its outputs earn, and the next honest evaluation is judged as on a fresh
Evaluator; the board drops malformed messages without raising. (The feedback then counts the runner's form:
"forward returned 400 tensor(s) (t<|im_end|>...)" for one tensor; the text is 57 characters of the runner's, defused
by the feedback layer as any runner error is.)

Read, not made into tests: the form is the runner's word (principle 1 says nothing the runner says may change a
verdict, and this does): a runner that reports the reference's form, or none (``reply.form`` "" skips the check),
passes ``(y,)`` for ``y``. No sound judge can do better with flat bytes, and no lie about the form buys speed (it
only lets a wrong nesting through); treating "" as a mismatch would at least catch omission. The form is checked in
the trials only (not the rerun, widened trial or timed calls): no gain either. Shaping the return value without a lie
(a tuple subclass with its own ``__iter__`` or ``__class__``) fails ``flatten_plain`` or gives the same form twice.
A paused neighbour's dirty pages are written back by the kernel's own threads (not in its tree) during a sibling's
measurement; not measured. A candidate cannot get an honest neighbour killed: it cannot signal another PID namespace,
and an honest tree's time in a system call is discounted.

Time: ~20 s for the file on this 2-core machine.
"""

from __future__ import annotations

import time
import types

import pytest
import torch
from device import DEVICE, ON_GPU
from stand_ins import through_a_measurement
from test_redteam_round5 import UNFREEZABLE
from test_redteam_round12 import SCALE  # x * 2 + 1 on 64 x 256
from test_redteam_round31 import ROW_SUM  # 1000 randn(4096, 64) summed per row

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.calibration_board import CalibrationBoard, problem_hash
from kb_gym.problems import reference_as_candidate
from kb_gym.worker import judge_timing
from kb_gym.worker.checks import compare_outputs, near_miss, reference_is_inexact
from kb_gym.worker.inputs import make_inputs

CHECK = EvalConfig(trials=3, timing=False, load_timeout=60, correctness_timeout=60, integrity="off")
HEAD = "import torch\nimport torch.nn as nn\n"
FORWARD = HEAD + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return {}\n"


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


# --- 1. the runner's form: odd reports leave the judge as it was ------------------------------------------------------

FORM_LIE = HEAD + """import sys

_runner = [m for m in list(sys.modules.values()) if "Runner" in vars(m) and "output_form" in vars(m)][0]
_runner.output_form = lambda out: {form}


class ModelNew(nn.Module):
    def forward(self, x):
        return {out}
"""
ODD_FORMS = {
    "four_megabytes": ('"(" * (4 << 20)', "x * 2.0 + 1.0"),
    "not_a_string": ('{"t": [1, 2]}', "x * 2.0 + 1.0"),
    "control_tokens": ('"t<|im_end|>\\x00</think>" * 100', "x * 2.0 + 1.0"),
    "none_for_a_one_tuple": ("None", "(x * 2.0 + 1.0,)"),
}


@pytest.mark.parametrize("name", sorted(ODD_FORMS))
def test_an_odd_form_leaves_the_judge_up_and_the_next_evaluation_fresh(ev, name):
    form, out = ODD_FORMS[name]
    r = ev.evaluate(SCALE, FORM_LIE.format(form=form, out=out), config=CHECK)
    # a wrong nesting that the runner does not report is no worse than one it reports as the reference's: the judge
    # cannot tell either (the docstring); what must hold is that the judge stays up and the values are still compared
    assert r.status in ("correct", "incorrect", "runtime_error"), (r.status, r.error)
    honest = ev.evaluate(SCALE, reference_as_candidate(SCALE), config=CHECK)
    assert honest.status == "correct" and honest.flags == ["no_custom_kernel"], (honest.status, honest.flags)


@pytest.mark.parametrize("form", ['""', "None"], ids=["empty", "none"])
def test_a_runner_that_says_no_form_is_held_to_the_reference_s_all_the_same(ev, form):
    # (y,) for y, with the runner's form report silenced: "" (or no string, read as "") skipped the check until session
    # 43; an honest runner always says its form
    r = ev.evaluate(SCALE, FORM_LIE.format(form=form, out="(x * 2.0 + 1.0,)"), config=CHECK)
    assert r.status == "incorrect" and "no form" in r.error, (r.status, r.error)


def test_a_form_lie_does_not_pass_wrong_values(ev):
    r = ev.evaluate(SCALE, FORM_LIE.format(form='"t"', out="x * 2.0 + 1.001"), config=CHECK)
    assert r.status == "incorrect", (r.status, r.error)


# --- 2a. the float64 opinion's per-element bound on an output of mixed scales ----------------------------------------

MIXED_ROW_SUM = Problem(id=9, name="9_MixedScaleRowSum", level=1, code=HEAD + '''

class Model(nn.Module):
    """Row sums of rows of two scales: half the rows 1e5 randn (the fp32 sums are off from float64 by up to ~0.5,
    beyond the tolerance on the 8-15 rows whose sums come near zero), half plain randn (sums ~5, exact to ~4e-6)."""

    def forward(self, x):
        return x.sum(dim=1)


def get_inputs():
    x = torch.randn(65536, 64)
    x[:32768] *= 1e5
    return [x]


def get_init_inputs():
    return []
''')
# The float64 sums (more exact than the reference), then 3x as many small rows as the reference has rows beyond the
# tolerance (what the count bound allows) each moved by 2.5x the reference's largest error (what the per-element
# bound allows): the first comparison misses narrowly, the reference is "inexact", and the float64 opinion decides.
WRONG_SMALL_ROWS = HEAD + '''

class ModelNew(nn.Module):
    def forward(self, x):
        ref = x.sum(dim=1).double()
        s = x.double().sum(dim=1).float()
        e = s.double()
        beyond = int((~torch.isclose(ref, e, rtol=1e-4, atol=1e-4)).sum())
        worst = float((ref - e).abs().max())
        small = (x.abs().amax(dim=1) < 100.0).nonzero().flatten()[:3 * beyond]
        s[small] += 2.5 * worst
        return s
'''


def test_a_row_sum_wrong_by_a_fifth_of_its_value_is_not_forgiven_by_float64(ev):
    control = ev.evaluate(MIXED_ROW_SUM, reference_as_candidate(MIXED_ROW_SUM), config=CHECK)
    assert control.status == "correct", (control.status, control.error)
    r = ev.evaluate(MIXED_ROW_SUM, WRONG_SMALL_ROWS, config=CHECK)
    # sound: rows whose own rounding error is ~4e-6 are off by ~1 (about a fifth of their value)
    assert r.status == "incorrect", (r.status, r.flags, r.correctness.get("max_abs_err"))


# --- 2b. an honest summation order where the reference happens to round well -----------------------------------------

TILED_ROW_SUM = FORWARD.format("x.reshape(x.shape[0], 4, -1).sum(dim=2).sum(dim=1)")  # 4 tiles of 16, then the partials


def _seed_where_the_reference_is_exact_and_the_tiles_miss(problem: Problem, trials: int) -> int:
    """A job seed one of whose trials (seeds job + 1 ... job + trials) is an input where the fp32 reference is within
    the tolerance of float64 everywhere, and the tiled sum narrowly misses the reference (~1 input in 4)."""
    module = types.ModuleType("round33_problem")
    exec(problem.code, module.__dict__)  # our own problem's code, as the judge loads it

    def tiles_fail_alone(seed: int) -> bool:
        x = make_inputs(module, seed, torch.device("cpu"), torch.float32)[0]
        ref, exact = x.sum(1), x.double().sum(1).float()
        cmp = compare_outputs(x.reshape(x.shape[0], 4, -1).sum(2).sum(1), ref, 1e-4, 1e-4)
        return not cmp.ok and near_miss(cmp) and reference_is_inexact(ref, [exact], 1e-4, 1e-4) is None

    return next(s for s in range(10_000) if tiles_fail_alone(s + 1))


@pytest.mark.skipif(ON_GPU, reason="the seed is chosen by this process's CPU arithmetic")
def test_a_tiled_row_sum_is_not_incorrect_where_the_reference_happens_to_round_well(ev):
    seed = _seed_where_the_reference_is_exact_and_the_tiles_miss(ROW_SUM, CHECK.trials)
    r = ev.evaluate(ROW_SUM, TILED_ROW_SUM, config=CHECK, seed=seed)
    # sound: the tiled sum is as far from float64 as the reference is on such inputs (it passes the float64 opinion on
    # every input where the reference is off); at most ``ill_conditioned``, never ``incorrect``
    assert r.status == "correct", (r.status, r.error)


# --- 3. the neighbour pause: a tree that runs inside the kernel --------------------------------------------------------

KERNEL_BURNER = UNFREEZABLE + '''
import mmap, os, signal, time
BURNER = os.getpid()
if os.fork() == 0:  # the resumer: asleep nearly always, so its timers' SIGCONTs are rarely pending at a stop
    for _period in (50_000_000, 70_000_000, 130_000_000):
        _unfreezable(_period)
    try:
        while True:
            os.kill(BURNER, signal.SIGCONT)
            time.sleep(0.1)
    finally:
        os._exit(0)
while True:  # the burner: nearly all of its time in the kernel, zeroing fresh pages
    mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE).close()
'''




def test_a_neighbour_that_burns_inside_the_kernel_is_stopped_or_killed(tmp_path):
    verdict, ran_s = through_a_measurement(KERNEL_BURNER, tmp_path, loading_s=0.8, wait=5.0)
    # sound: stopped through the measurement, or killed for running in it
    assert verdict or ran_s < 0.1, f"ran {ran_s:.2f} s of CPU inside a 2 s measurement, not killed"


# --- 4. the calibration board -------------------------------------------------------------------------------------------

KEY = (problem_hash("class Model: ..."), "fp32", False, 0, False)


def test_the_board_drops_malformed_messages_without_raising():
    board = CalibrationBoard()
    for garbage in (None, [], "entry", 5, {"key": [[1]], "measured_at": 1.0}, {"key": [], "measured_at": 1.0},
                    {"key": [1, 2], "measured_at": 1.0}, {"key": list(KEY), "measured_at": "soon"},
                    {"key": list(KEY), "measured_at": float("inf")}, {"key": list(KEY)}, {"measured_at": 1.0}):
        assert board.keep("cpu", garbage) is False, garbage
    assert board.for_problem("cpu", KEY[0]) == []


@pytest.mark.parametrize("overhead", [float("nan"), float("inf"), -50.0], ids=["nan", "inf", "negative"])
def test_a_board_entry_with_an_impossible_overhead_is_not_adopted(overhead):
    ctx = types.SimpleNamespace(calibrations={}, device=torch.device("cpu"))
    entry = {"key": list(KEY), "overhead_ms": overhead, "spread_ms": 0.0, "cpu_overhead_ms": None,
             "cpu_spread_ms": 0.0, "measured_at": time.monotonic() - 1.0}
    judge_timing.adopt_calibration(ctx, KEY, [entry])
    assert KEY not in ctx.calibrations, ctx.calibrations
