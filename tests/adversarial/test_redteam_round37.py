"""Red team, round 37: the last three sessions' changes, read from the candidate's side: the forward after the load
(``worker/load_forward.py``, ``Runner._load_forward``, ``RunnerProcess.load``'s ``during_forward``,
``neighbours.PauseWatcher.forward``/``_wait_for_forward``, ``FORWARD_WAIT_S``), the NVML reading of a stopped
neighbour's queued GPU work (``worker/gpu_activity.py``, ``PauseWatcher._gpu_late``), the comparisons slice by slice
(``checks.aligned_slices``/``_flat_view``/``_pairs``/``_all_close``/``error_stats``/``all_finite``), the widened draw by
index (``inputs.make_inputs``), ``job._record_failure`` and ``tests/test_job_release.py``, and the meta estimate's
budget put off inside an import (``worker/output_size.py``).

Each test asserts what a sound judge does. Holes and false positives were ``xfail(strict=True, raises=AssertionError)``;
each failed its sound assertion on 3 of 3 runs of this file with ``--runxfail``. All three findings were fixed the same
session (50) and the xfails taken off (FIXED below each). Numbers are from this 2-core CPU
(``Evaluator("cpu")``, ``KB_GYM_LOAD_FORWARD=force`` for the forward, two trials, no timing).

FALSE POSITIVES (honest candidates judged wrong):

1. ``test_with_the_forward_an_honest_mirror_of_a_stateful_reference_is_correct`` (two problems). The forward after the
   load is the candidate model's first call, on inputs of a seed of the judge's own; the judge's own reference model
   meets its first call in trial 1. Where the reference's forward changes its own state, the candidate that mirrors it
   is one call ahead in every trial: a ``nn.LazyLinear`` (weights drawn at the first call, from the generator's state
   then: the load forward's seed, not trial 1's) and an 8-bit fake quantisation whose observer takes its scale from the
   first batch (post-training calibration; idempotent on a repeated input, so the rerun check passes it) are
   ``correct`` without the forward and ``incorrect`` with it ("trial 1/2": 100% and 97-99% of values differ), 3 of 3.
   The meta device predicts both outputs' sizes, so the forward runs (``test_the_forward_after_the_load_runs_...``).
   The docstring's "verdicts are the trials' as before" does not hold for such problems (no built-in problem has one;
   a reference of the official set with lazy layers or a calibrating observer would). Off by default, so no verdict
   of today's default runs changes. Fix (``Runner._load_forward``): run the forward on ``copy.deepcopy(self.model)``
   (kernels compiled, library handles and caches are the process's and stay warm; a model deepcopy cannot copy:
   skip the forward, ``why`` says so), or have the judge skip the forward where its reference's state changes in a
   forward (its parameters or buffers before and after the meta forward of ``output_size``, or any uninitialised
   lazy parameter).
2. ``test_a_forward_raising_system_exit_gets_the_trials_verdict_with_the_forward``. ``Runner._load_forward`` catches
   ``Exception`` only, where the trials (``Runner._respond``) catch ``BaseException``: a forward raising
   ``SystemExit`` (or ``KeyboardInterrupt``) is ``runtime_error`` in trial 1 without the forward (the control) and
   ``crash`` ("the candidate's process died: worker closed its pipe", at load) with it, 3 of 3. The same reward under
   the default preset (-0.3 both), but another status and stage in the reports and the batch report's counts, and the
   docstring's "what it raises is left for the trials" broken. Fix: ``except BaseException`` there, as in ``_respond``
   (``why`` the type's name; the trials meet it again).
   FIXED (session 50, both): ``Runner._load_forward`` runs the forward on a copy of the model (skipped where the copy
   fails, or where its parameters and buffers, lazy ones not counted, would pass the forward's byte budget beside its
   inputs and outputs) and catches ``BaseException``: the trials meet the model the reference meets.

GOT THROUGH (holes):

3. ``test_a_measurement_begins_only_once_a_forwarding_neighbour_is_stopped_or_killed`` and
   ``test_the_pause_constants_leave_the_stop_limit_its_margin_after_the_forwards_wait``. A measurement waits
   ``Measuring.begin(wait=WAIT_S)`` for every watched runner to stop, and past that measures anyway. ``WAIT_S`` is
   ``STOP_LIMIT_S + 3`` (18 s): room for a tree with a thread in one long system call to be killed at ``STOP_LIMIT_S``
   (15 s) before the measurement begins. The forward's wait now comes first: a watcher holds the measurement off while
   the forward runs, up to ``FORWARD_WAIT_S`` (5 s), and only then begins the stop, so a candidate whose forward runs
   past its budget (a Python loop) and then enters one long system call (round 34's populate) keeps running into the
   measurement for ~2 s before its kill (5 + 15 = 20 s > 18 s). Shown with the constants at a fifth of their size
   (ratios kept; the watcher told the tree's thread is still in its call): ``begin`` returned False at 3.6 s with the
   neighbour running, its kill came at ~4 s, 3 of 3. The saboteur is killed (``runtime_error``), so it sacrifices
   itself; what it buys is two seconds of host work beside a sibling's measurement, which in a GRPO group lowers the
   sibling. GPU only, and only with ``KB_GYM_LOAD_FORWARD=1`` (off by default). Fix: ``WAIT_S = FORWARD_WAIT_S +
   STOP_LIMIT_S + 3``, or count the forward's wait against ``STOP_LIMIT_S``. FIXED (session 50): the former; the test
   now runs at half the constants' sizes (at a fifth its margin, 0.6 s, failed once under this CPU's load).

HELD (plain tests):

- An answer kept from the forward after the load (computed right on its inputs, returned ever after) is
  ``incorrect``: the forward's seed is ``ctx.seed(seed, "load_forward")``, an HMAC under the judge's secret, never a
  trial's or a timed call's. The forward runs ``self.model`` directly, not through ``_call``: it sets no
  ``forward_checked``, no dataflow or knockout state, and every trial reseeds with ``seed_all``, so no generator state
  of the forward reaches a trial (but see 1: the model's own state does). Its reply is a record (``load_forward.record``
  keeps ``ran``, 200 characters of ``why``, ``seconds``), never read for a verdict.
- ``aligned_slices`` and the comparisons on it, at chunks of 1, 5 and 12 elements: contiguous, transposed (no flat
  view), channels-last, sliced (not dense), expanded (stride 0), rows longer than the chunk with no flat view, a first
  dimension of 40 with one-element rows, zero-size, 0-d; a NaN, an inf and a wrong value at the first, the middle and
  the last element; the odd layout on either side of the pair: ``error_stats`` (count and relative L2), ``_all_close``
  and ``all_finite`` agree with the whole-tensor arithmetic (0 differences in 2,484 checks). Every element is paired
  with itself exactly once and every slice is a view of the tensor's own storage (a permuted 7x11x3 at chunks 1 to
  10,000). A transposed input as the trivial output (no flat view) gives the same verdicts at a chunk of 7 as at the
  default: the copy of ``x.t()`` is held to the degenerate bound and fails, an honest answer passes. Candidate
  outputs never reach these in an odd layout: the runner sends their bytes contiguous (``tensors.flatten_bytes``) and
  the judge rebuilds them (``tensors.decode``); the layouts that matter are the judge's own (trivial views of inputs,
  the stride-0 zeros).
- The widened draw by index: an expanded input (stride 0) gets a fresh value in every element (``empty_like`` of an
  overlapping layout is dense), transposed and channels-last inputs keep their strides, integers and numbers are
  untouched, and two draws with one seed (the judge's and the runner's) are the same bits.
- The NVML reading: a device sample period read as NaN, inf, negative, zero, 1e-9, 7 s, a string, None or an error is
  used as a number within [1/6 s, 1 s] (``_or_default`` and the clamp; NaN is not > 0). Stale samples from before
  the stop, a sample whose period began inside the grace, idle samples and another process's busy ones kill no one;
  the tree's busy sample whose period began past the grace is late however the samples are ordered, and the next
  reading starts at the newest sample seen.

Read, not made into tests: ``output_size.predicted_output_bytes`` runs the problem's reference (``module.Model`` on
the meta device) in the evaluator or judge, never candidate code: a candidate cannot reach the budget or
``_importing``. Its one sharp edge is the reference's own (a reference whose forward imports without end would never
meet its budget: the timer re-arms every ``IMPORT_RETRY_S`` while an import frame is on the stack), and references
are the problem set's, trusted. ``job._record_failure``: the watcher's kill verdict replaces whatever the stage
raised; a candidate's error text reaches it as a string only (bounded to 20,000 characters at load), so a failing
candidate can keep no tensor of the judge's alive into the next job. The NVML reading's known bound stays as
documented: queued work runs unseen for the grace and one sample period (up to 1.25 s where the period cannot be
read), and a measurement shorter than that is not protected by it. ``batch_report.py`` and ``batch_bench.py`` only
count what results already say (``load_forward`` ran and seconds, the ``GPU_KILLED`` prefix): no verdict.

Time: 18-21 s for the file on this 2-core machine (3 runs: 19.1, 19.4, 21.0 s wall, before the fixes; the pause test ~4 s then, ~10 s at half size, seven
evaluations on two CPU Evaluators most of the rest).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
import types

import pytest
import torch
from device import DEVICE
from test_redteam_round12 import SCALE  # x * 2 + 1 on 64 x 256

from kb_gym import EvalConfig, Evaluator, Problem, sandbox
from kb_gym.worker import checks, load_forward, neighbours
from kb_gym.worker.gpu_activity import DEFAULT_PERIOD_S, GRACE_S, GpuActivity, Sample
from kb_gym.worker.inputs import make_inputs
from kb_gym.worker.runner_client import RunnerProcess

HEAD = "import torch\nimport torch.nn as nn\n"
CONFIG = EvalConfig(trials=2, timing=False)


def _evaluator(monkeypatch: pytest.MonkeyPatch, forward: bool) -> Evaluator:
    if forward:
        monkeypatch.setenv(load_forward.ENV, "force")  # the judges inherit it: the forward after the load, on the CPU
    else:
        monkeypatch.delenv(load_forward.ENV, raising=False)
    return Evaluator(DEVICE, config=CONFIG, results_path=False, baseline_cache=False)


@pytest.fixture(scope="module")
def with_forward():
    mp = pytest.MonkeyPatch()
    try:
        with _evaluator(mp, forward=True) as ev:
            yield ev
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def without_forward():
    mp = pytest.MonkeyPatch()
    try:
        with _evaluator(mp, forward=False) as ev:
            yield ev
    finally:
        mp.undo()


# --- 1. the forward after the load is the model's first call ---------------------------------------------------------

LAZY = Problem(id=91, name="91_LazyLinearTanh", level=1, code=HEAD + '''

class Model(nn.Module):
    """A lazy layer: its weights are drawn at the first forward, from the generator's state then."""

    def __init__(self, out_features):
        super().__init__()
        self.fc = nn.LazyLinear(out_features)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def get_inputs():
    return [torch.randn(32, 48)]


def get_init_inputs():
    return [16]
''')
LAZY_MIRROR = HEAD + '''

class ModelNew(nn.Module):
    def __init__(self, out_features):
        super().__init__()
        self.fc = nn.LazyLinear(out_features)

    def forward(self, x):
        return torch.tanh(self.fc(x))
'''

CALIBRATED = Problem(id=92, name="92_FirstBatchFakeQuant", level=1, code=HEAD + '''

class Model(nn.Module):
    """8-bit fake quantisation whose scale an observer takes from the first batch it sees, then keeps (post-training
    calibration): the same input always gives the same answer, but the first call sets the grid."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(()))
        self.calibrated = False

    def forward(self, x):
        if not self.calibrated:
            self.scale, self.calibrated = x.abs().max() / 127.0, True
        return torch.clamp(torch.round(x / self.scale), -127, 127) * self.scale


def get_inputs():
    return [torch.randn(32, 48)]


def get_init_inputs():
    return []
''')
CALIBRATED_MIRROR = HEAD + '''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(()))
        self.calibrated = False

    def forward(self, x):
        if not self.calibrated:
            self.scale, self.calibrated = x.abs().max() / 127.0, True
        return torch.clamp(torch.round(x / self.scale), -127, 127) * self.scale
'''

STATEFUL = [pytest.param(LAZY, LAZY_MIRROR, id="lazy_linear"),
            pytest.param(CALIBRATED, CALIBRATED_MIRROR, id="first_batch_calibration")]
RAISES_SYSTEM_EXIT = HEAD + '''

class ModelNew(nn.Module):
    def forward(self, x):
        raise SystemExit("no kernel for this shape")
'''


@pytest.mark.parametrize("problem,source", STATEFUL)
def test_without_the_forward_an_honest_mirror_of_a_stateful_reference_is_correct(without_forward, problem, source):
    """The control: the judge's reference and the candidate meet the same calls in the same order."""
    r = without_forward.evaluate(problem, source)
    assert "load_forward" not in r.worker
    assert r.status == "correct", (r.status, r.error)


def test_without_the_forward_a_system_exit_in_forward_is_the_trials_runtime_error(without_forward):
    """The control: ``Runner._respond`` catches BaseException, so the trial reports the SystemExit."""
    r = without_forward.evaluate(SCALE, RAISES_SYSTEM_EXIT)
    assert "load_forward" not in r.worker
    assert r.status == "runtime_error" and "trial 1/2" in (r.error or ""), (r.status, r.error)


@pytest.fixture(scope="module")
def mirrored(with_forward):
    return {p.values[0].name: with_forward.evaluate(*p.values) for p in STATEFUL}


def test_the_forward_after_the_load_runs_on_these_problems(mirrored):
    """The meta device predicts their outputs' size, so the forward runs (below, the verdicts it changes)."""
    assert {name: (r.worker.get("load_forward") or {}).get("ran") for name, r in mirrored.items()} == {
        LAZY.name: True, CALIBRATED.name: True}


@pytest.mark.parametrize("problem,source", STATEFUL)
def test_with_the_forward_an_honest_mirror_of_a_stateful_reference_is_correct(mirrored, problem, source):
    r = mirrored[problem.name]
    assert r.status == "correct", (r.status, r.error)


def test_a_forward_raising_system_exit_gets_the_trials_verdict_with_the_forward(with_forward):
    """load_forward.py: what the forward raises is left for the trials to meet: the control's verdict."""
    r = with_forward.evaluate(SCALE, RAISES_SYSTEM_EXIT)
    assert r.worker.get("load_forward") is None or r.worker["load_forward"]["why"] == "SystemExit"
    assert (r.status, "trial 1/2" in (r.error or "")) == ("runtime_error", True), (r.status, r.error)


MEMORISES_THE_LOAD_FORWARD = HEAD + '''

class ModelNew(nn.Module):
    """Computes the first call (the forward after the load, outside the lock) and answers it ever after."""

    def __init__(self):
        super().__init__()
        self.kept = None

    def forward(self, x):
        if self.kept is None:
            self.kept = x * 2.0 + 1.0
        return self.kept.clone()
'''


def test_an_answer_kept_from_the_forward_after_the_load_is_incorrect(with_forward):
    """The forward's inputs come from a seed of the judge's own (HMAC of the job's seed and "load_forward"), never a
    trial's: its answer is no trial's."""
    r = with_forward.evaluate(SCALE, MEMORISES_THE_LOAD_FORWARD)
    assert r.worker["load_forward"]["ran"]
    assert r.status == "incorrect", (r.status, r.error)


# --- 2. the measurement's wait: the forward's budget, then the stop's -------------------------------------------------

SLEEPER = "import time\ntime.sleep(120)\n"


class _Tree:
    """What PauseWatcher needs of a runner: a pid and counted stops, as RunnerProcess has them."""

    stop = RunnerProcess.stop
    restop = RunnerProcess.restop
    resume = RunnerProcess.resume

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SLEEPER])
        self.pid = self.proc.pid
        self._stops, self._stopped, self._stop_lock = 0, set(), threading.Lock()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


SCALE_DOWN = 2.0  # the pause's constants, half their size: 2.5 s of forward, 7.5 s of stop limit, 11.5 s of wait


def test_a_measurement_begins_only_once_a_forwarding_neighbour_is_stopped_or_killed(tmp_path, monkeypatch):
    """A candidate's forward after its load outlasts its wait budget, and as it is stopped one of its threads is inside
    one long system call (round 34's populate; here the watcher's reading of the tree says so). The measurement must
    not begin while that thread runs: the tree stops, or is killed at STOP_LIMIT_S, before the measurement's wait is up.
    Run at half the constants' sizes (their ratios kept); before session 50's fix, 5 s + 15 s against a WAIT_S of
    18 s."""
    wait = neighbours.WAIT_S / SCALE_DOWN
    monkeypatch.setattr(neighbours, "FORWARD_WAIT_S", neighbours.FORWARD_WAIT_S / SCALE_DOWN)
    monkeypatch.setattr(neighbours, "STOP_LIMIT_S", neighbours.STOP_LIMIT_S / SCALE_DOWN)
    monkeypatch.setattr(neighbours, "SETTLE_S", neighbours.SETTLE_S / SCALE_DOWN)
    tree = _Tree()
    in_the_call = {tree.pid}  # its thread inside one long system call: not stopped until it is killed

    def unstopped(pids, timeout=1.0, asleep_is_stopped=True, also=()):
        time.sleep(timeout)
        return [p for p in pids if p in in_the_call and tree.proc.poll() is None]

    monkeypatch.setattr(sandbox, "unstopped", unstopped)
    files = tmp_path / "gpu-0.measure", tmp_path / "gpu-0.unpaused"
    watcher = neighbours.PauseWatcher(files, tree)
    measuring = neighbours.Measuring(files)
    seen: dict[str, object] = {}

    def measure() -> None:
        seen["began"] = measuring.begin(wait=wait)
        seen["neighbour_running"] = tree.proc.poll() is None and tree.pid in unstopped([tree.pid], 0.0)

    try:
        watcher.watch()
        with watcher.forward():  # a forward that never replies
            waiter = threading.Thread(target=measure)
            waiter.start()
            waiter.join(timeout=20.0)
        assert seen == {"began": True, "neighbour_running": False}, (seen, watcher.verdict)
        assert watcher.verdict == neighbours.DID_NOT_STOP
    finally:
        measuring.end()
        watcher.unwatch()
        tree.close()


def test_the_pause_constants_leave_the_stop_limit_its_margin_after_the_forwards_wait():
    """The same at full size, as arithmetic: the forward's wait, then the stop limit, within the measurement's wait."""
    assert neighbours.WAIT_S >= neighbours.FORWARD_WAIT_S + neighbours.STOP_LIMIT_S, (
        neighbours.WAIT_S, neighbours.FORWARD_WAIT_S, neighbours.STOP_LIMIT_S)


# --- 3. comparisons slice by slice ------------------------------------------------------------------------------------

def _layouts() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(37)
    base = torch.randn(6, 10, 7, generator=g)
    return [
        ("contiguous", base),
        ("transposed", base.transpose(0, 2)),  # no flat view: blocks of the first dimension
        ("channels_last", torch.randn(3, 4, 5, 6, generator=g).to(memory_format=torch.channels_last)),
        ("sliced", torch.randn(9, 20, generator=g)[:, ::3]),  # not dense
        ("expanded", torch.randn(1, 7, generator=g).expand(40, 7)),  # stride 0: a flat view that repeats
        ("long_rows", torch.randn(13, 2, generator=g).t()),  # rows of 13 > the chunk: within a row too
        ("size_one_rows", torch.randn(1, 40, generator=g).t()),  # a first dimension of 40, rows of one element
        ("zero_size", torch.randn(0, 5, generator=g).t()),
        ("scalar", torch.tensor(1.5)),
    ]


@pytest.mark.parametrize("chunk", [1, 5, 12])
def test_slice_by_slice_comparisons_match_the_whole_on_every_layout(monkeypatch, chunk):
    """``aligned_slices`` pairs the same elements of two tensors whatever their layouts (the first with no flat view,
    the second contiguous, and the other way round), each element once: ``error_stats``, ``_all_close`` and
    ``all_finite`` at a chunk of a few elements agree with the whole-tensor arithmetic, with a NaN, an inf and a wrong
    element placed at the first, the last and a middle position."""
    monkeypatch.setattr(checks, "CHUNK", chunk)
    differs = []
    for name, t in _layouts():
        n = t.numel()
        for where in sorted({0, n // 2, n - 1}) if n else [None]:
            for bad in (float("nan"), float("inf"), 0.5):
                flat = t.contiguous().clone()
                if where is not None:
                    flat.view(-1)[where] = bad if bad != 0.5 else flat.view(-1)[where] + bad
                odd = torch.empty_like(t).copy_(flat)  # the candidate's values in the reference's layout
                for a, b in ((flat, t), (odd, t.contiguous()), (odd, t), (t, odd)):
                    ad, bd = a.double().reshape(-1), b.double().reshape(-1)
                    close = torch.isclose(ad, bd, rtol=1e-4, atol=1e-4)
                    want_frac = float((~close).sum()) / max(n, 1)
                    sq_ref, sq_diff = float(bd.norm()) ** 2, float((ad - bd).norm()) ** 2
                    want_l2 = (sq_diff / sq_ref) ** 0.5 if sq_ref > 0 else (0.0 if sq_diff == 0 else float("inf"))
                    frac, l2 = checks.error_stats(a, b, 1e-4, 1e-4)
                    same_l2 = (math.isnan(l2) and math.isnan(want_l2)) or l2 == pytest.approx(want_l2, rel=1e-9)
                    if frac != want_frac or not same_l2:
                        differs.append((name, where, bad, "error_stats", frac, want_frac, l2, want_l2))
                    if checks._all_close(a, b, 1e-4, 1e-4, torch.float32) != bool(close.all()):
                        differs.append((name, where, bad, "_all_close"))
                    if checks.all_finite(a) != bool(torch.isfinite(a).all()):
                        differs.append((name, where, bad, "all_finite"))
    assert not differs, differs[:5]


def test_slices_of_a_layout_with_no_flat_view_cover_each_element_once(monkeypatch):
    """The pairs themselves: every element of a transposed tensor beside the same element of a contiguous one, each
    exactly once, and no slice a copy (a view of the tensor's own storage)."""
    t = torch.arange(7 * 11 * 3, dtype=torch.float32).reshape(7, 11, 3)
    a, b = t.permute(2, 0, 1), t.permute(2, 0, 1).contiguous()
    for chunk in (1, 4, 11, 40, 10_000):
        seen = []
        for sa, sb in checks.aligned_slices([a, b], chunk):
            assert sa.numel() <= chunk and torch.equal(sa, sb)
            assert sa.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
            seen += sa.reshape(-1).tolist()
        assert sorted(seen) == t.reshape(-1).tolist(), chunk


def test_a_transposed_input_passing_as_the_answer_is_degenerate_at_any_chunk(monkeypatch):
    """The trivial output with no flat view (an input's transpose, ``correctness.input_views``) is judged as a whole
    one: the answer ``x.t() + 1e-3 * tanh(x.t())`` is within the tolerance of ``x.t()`` (scaled), so a candidate
    returning the transpose is held to the relative-L2 bound and fails, at a chunk of 7 elements as at the default."""
    x = torch.randn(24, 40, generator=torch.Generator().manual_seed(5))
    ref = x.t() + 1e-6 * torch.tanh(x.t())
    zeros = torch.zeros((), dtype=ref.dtype).expand(ref.numel()).view(ref.shape)
    honest = ref.contiguous() + 1e-9 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(6))
    verdicts = []
    for chunk in (7, checks.CHUNK):
        monkeypatch.setattr(checks, "CHUNK", chunk)
        trivial = [zeros, x, x.t()]
        copy = checks.compare_outputs(x.t().contiguous(), ref, 1e-4, 1e-4, trivial)
        good = checks.compare_outputs(honest, ref, 1e-4, 1e-4, trivial)
        verdicts.append((copy.ok, copy.degenerate, copy.unverifiable, good.ok, good.degenerate))
    assert verdicts[0] == verdicts[1], verdicts
    copy_ok, degenerate, unverifiable, good_ok, _ = verdicts[0]
    assert degenerate and not copy_ok or unverifiable, verdicts  # never a plain pass for the copy
    assert good_ok, verdicts


# --- 4. the widened draw ----------------------------------------------------------------------------------------------

def test_the_widened_draw_is_fresh_in_every_element_and_the_same_on_both_sides():
    """``make_inputs(widen=True)`` redraws floating inputs in their own layouts: an expanded input (stride 0, one value
    per row repeated) gets a value of its own in every element (empty_like of an overlapping layout is dense), a
    transposed or channels-last one keeps its strides, integer inputs are untouched, and the judge and the runner
    (two calls with one seed) get the same bits."""
    problem = types.SimpleNamespace(get_inputs=lambda: [
        torch.rand(1, 48).expand(32, 48), torch.rand(48, 32).t(),
        torch.rand(2, 3, 4, 5).to(memory_format=torch.channels_last), torch.randint(0, 9, (5,)), 3.0])
    judge = make_inputs(problem, 123, torch.device("cpu"), torch.float32, widen=True)
    runner = make_inputs(problem, 123, torch.device("cpu"), torch.float32, widen=True)
    plain = make_inputs(problem, 123, torch.device("cpu"), torch.float32)
    for j, r in zip(judge, runner, strict=True):
        assert (torch.equal(j, r) and j.stride() == r.stride()) if isinstance(j, torch.Tensor) else j == r
    expanded, transposed, channels_last, ints, number = judge
    assert expanded.unique().numel() == expanded.numel() and (expanded < 0).any() and expanded.abs().max() > 1
    assert transposed.stride() == plain[1].stride() and channels_last.stride() == plain[2].stride()
    assert torch.equal(ints, plain[3]) and number == 3.0


# --- 5. the NVML reading ----------------------------------------------------------------------------------------------

class _Source:
    def __init__(self, samples: list[Sample], period) -> None:
        self._samples, self._period = samples, period

    def samples(self, since_us: int) -> list[Sample]:
        return list(self._samples)

    def context_pids(self) -> set[int]:
        return {os.getpid()}

    def period_s(self) -> float:
        if isinstance(self._period, BaseException):
            raise self._period
        return self._period


@pytest.mark.parametrize("period", [float("nan"), float("inf"), -0.5, 0.0, 1e-9, 7.0, "0.2", None,
                                    RuntimeError("NVML_ERROR_NOT_SUPPORTED")])
def test_an_unreadable_or_odd_sample_period_is_read_as_a_plausible_one(period):
    """The period places each sample's start: read too short, queued work would count as in flight at the stop (no
    kill); too long, an honest runner's work in flight would look late. Whatever the device's own samples say (NaN,
    inf, a negative, a string, nothing, an error), the period used is a number within [1/6 s, 1 s]."""
    reading = GpuActivity(_Source([], period))
    assert 1 / 6 <= reading.period_s <= DEFAULT_PERIOD_S and not math.isnan(reading.period_s), reading.period_s


def test_samples_from_before_the_stop_and_other_processes_and_idle_ones_kill_no_one_but_late_work_does():
    """NVML may hand back samples older than ``since`` (a sample ending just after the stop whose period began before
    it; a stale one before the stop), other processes' (a reused number outside the tree), and idle ones: none is the
    tree's work run late. A busy sample of the tree's whose period began past the grace is, however the samples come
    ordered, and the next reading starts at the newest sample seen."""
    stopped = 5000.0
    mine, other = 41, 42
    period = 0.2

    def at(t: float) -> int:
        return int((stopped + t) * 1e6)

    honest = [Sample(mine, 100, at(-3.0)),  # stale, before the stop
              Sample(mine, 100, at(period + GRACE_S - 0.01)),  # its period began inside the grace
              Sample(mine, 0, at(4.0)),  # idle, late
              Sample(other, 100, at(6.0))]  # another process, busy late
    reading = GpuActivity(_Source(honest, period))
    assert reading.busy_after({mine}, stopped, at(-10.0)) == (0.0, at(6.0))
    late = [Sample(mine, 1, at(period + GRACE_S + 0.05)), *honest]
    late.reverse()
    reading = GpuActivity(_Source(late, period))
    seconds, last = reading.busy_after({mine}, stopped, at(-10.0))
    assert seconds == pytest.approx(period + GRACE_S + 0.05, abs=1e-6) and last == at(6.0)
