"""A device's measurements with its neighbours' runners stopped (kb_gym/worker/neighbours.py).

With two workers on one device, a candidate loads while its sibling is timed: its import is its own code, and what it
runs there (kernels on a GPU, busy cores on either device) ran beside the sibling's measurement. In a GRPO group a
candidate that costs its siblings their speed credit raises its own advantage (round 24's open neighbour exposure).
Now every runner whose job does not hold the device is stopped while another job of the device measures, and one that
runs all the same is killed. These run on the CPU in CI (the CPU device's timing is what a busy neighbour bends there)
and against a GPU judge with KB_GYM_ADVERSARIAL_DEVICE (device.py).
"""

from __future__ import annotations

import ast
import re

import pytest
from device import DEVICE, ON_GPU
from test_redteam_round5 import UNFREEZABLE

from kb_gym import EvalConfig, Evaluator, get_problem, load_problems

# long enough timing stages (the probe windows and loops of a GPU, the loop of the CPU) to be read against the busy
# neighbour's own record of when it ran; integrity="off": the neighbour's import would not pass the static checks
CONFIG = EvalConfig(trials=2, timing_warmup=3, timing_min_reps=200, timing_max_reps=200, integrity="off")
HONEST = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
FORWARD = "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"

# Burns the CPU until BUSY_S after its import began and records every stretch of more than 20 ms in which it did not
# run (the last too: a stop that outlasts BUSY_S, on an H100 the whole sibling's window, is one gap to the end), and
# the span it recorded over; then fails its load with that record, which the test reads from the error. A
# pause spends the neighbour's BUSY_S, so a sibling measured after the record ended (as on a GPU, where one window
# takes ~9 s) is beside a neighbour that no longer runs: only windows inside the span say anything.
BUSY_S = 10
RECORDER = f'''
import time, torch
_gaps = []
_last = time.time()
_end = _last + {BUSY_S}
while True:
    _now = time.time()
    if _now - _last > 0.02:
        _gaps.append((_last, _now))
    _last = _now
    if _now >= _end:
        break
raise RuntimeError("GAPS " + repr(_gaps) + " SPAN " + repr((_end - {BUSY_S}, _last)))
''' + FORWARD


@pytest.fixture(scope="module")
def relu():
    return get_problem(load_problems("builtin"), name="level1/1_ReLU")


def _siblings_beside(relu, neighbour: str, n: int = 3):
    """``neighbour`` submitted first, then ``n`` honest siblings, on one device with two workers."""
    with Evaluator(DEVICE, config=CONFIG, results_path=False, workers_per_device=2) as ev:
        ev.warm()
        first = ev.submit(relu, neighbour)
        siblings = [ev.submit(relu, HONEST) for _ in range(n)]
        return first.result(), [s.result() for s in siblings]


def _stopped_through(gaps: list[tuple[float, float]], window: list[float], margin: float = 0.1) -> bool:
    """Whether the neighbour did not run from ``margin`` after the window's start to ``margin`` before its end."""
    start, end = window[0] + margin, window[1] - margin
    return any(a <= start and b >= end for a, b in gaps)


def _gaps(error: str) -> list[tuple[float, float]]:
    found = re.search(r"GAPS (\[.*?\])", error or "")
    assert found, error
    return ast.literal_eval(found.group(1))


def _span(error: str) -> tuple[float, float]:
    found = re.search(r"SPAN (\(.*?\))", error or "")
    assert found, error
    return ast.literal_eval(found.group(1))


def _timed_windows(siblings, span: tuple[float, float]) -> list[list[float]]:
    """The siblings' timed windows cut to the neighbour's record, where long enough to say something past the margins."""
    windows = [s.worker["timed_at"] for s in siblings if s.status == "correct" and s.worker.get("timed_at")]
    inside = [[max(w[0], span[0]), min(w[1], span[1])] for w in windows]
    return [w for w in inside if w[1] - w[0] > 0.3]


def test_a_loading_neighbour_is_stopped_while_its_sibling_is_measured(relu):
    busy, siblings = _siblings_beside(relu, RECORDER)
    assert [s.status for s in siblings] == ["correct"] * 3, [s.error for s in siblings]
    # the neighbour was paused, not killed: its verdict is its own (it raised in its import)
    assert busy.status == "compile_error" and "GAPS" in busy.error, (busy.status, busy.error)
    assert busy.stage_seconds.get("paused_for_neighbours", 0) > 0.1, busy.stage_seconds
    # its queued GPU work read through its pauses where NVML can (gpu_activity.py), and the result says so
    assert busy.worker.get("neighbour_gpu_check") == ("on" if ON_GPU else "not a GPU"), busy.worker
    windows = _timed_windows(siblings, _span(busy.error))
    assert windows, ([s.worker.get("timed_at") for s in siblings], busy.error)
    gaps = _gaps(busy.error)
    assert all(_stopped_through(gaps, w) for w in windows), (windows, gaps)
    assert all(s.stage_seconds["neighbour_pause_wait"] < 1.0 for s in siblings), [s.stage_seconds for s in siblings]


def test_without_the_pause_the_neighbour_runs_through_its_siblings_measurement(relu, monkeypatch):
    """The control: KB_GYM_NEIGHBOUR_PAUSE=0 (the behaviour before), where the record shows the neighbour ran."""
    monkeypatch.setenv("KB_GYM_NEIGHBOUR_PAUSE", "0")
    busy, siblings = _siblings_beside(relu, RECORDER)
    assert busy.stage_seconds.get("paused_for_neighbours") is None, busy.stage_seconds
    windows = _timed_windows(siblings, _span(busy.error))
    assert windows, ([s.worker.get("timed_at") for s in siblings], busy.error)
    assert not all(_stopped_through(_gaps(busy.error), w) for w in windows)


# A neighbour the pause cannot hold: the kernel sends it SIGCONT every 0.5 ms (round 5's timer), and it burns the CPU
# through its siblings' measurements, recording when it ran. Sound: it is killed, with that as its verdict, or it never
# ran inside a sibling's window (a stop drops a timer's pending SIGCONT, and a periodic timer that lost one may never
# fire again: under load the timer can die, round 28). The siblings are judged as usual either way.
UNSTOPPABLE = UNFREEZABLE + "\n_unfreezable()\n" + RECORDER


def test_a_neighbour_that_resumes_itself_while_paused_is_killed_or_never_ran(relu):
    rogue, siblings = _siblings_beside(relu, UNSTOPPABLE)
    assert [s.status for s in siblings] == ["correct"] * 3, [s.error for s in siblings]
    if rogue.status == "runtime_error":
        assert "another candidate's measurement" in rogue.error, rogue.error
        return
    assert rogue.status == "compile_error" and "GAPS" in rogue.error, (rogue.status, rogue.error)
    gaps = _gaps(rogue.error)
    assert all(_stopped_through(gaps, w) for w in _timed_windows(siblings, _span(rogue.error))), gaps
