"""The pause of a device's waiting runners for a measurement (kb_gym/worker/neighbours.py), on plain processes.

The Evaluator-level behaviour (a loading candidate stopped through its siblings' timing, one that resumes itself
killed) is in tests/adversarial/test_neighbour_pause.py.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from kb_gym import sandbox
from kb_gym.worker import neighbours
from kb_gym.worker.loading import StageError
from kb_gym.worker.runner_client import RunnerProcess

BUSY = "import time\nwhile True:\n    time.perf_counter()\n"
# Its time in the kernel: each mapping of 1.5 GB is populated inside one mmap call (0.4-1.3 s here), which a stop
# does not cut short (a stopped task takes the stop on its way back to its own code)
IN_THE_KERNEL = ("import mmap\nwhile True:\n    mmap.mmap(-1, 1536 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS"
                 " | mmap.MAP_POPULATE).close()\n")


class Tree:
    """What PauseWatcher needs of a runner: a pid and counted stops, as RunnerProcess has them."""

    stop = RunnerProcess.stop
    restop = RunnerProcess.restop
    resume = RunnerProcess.resume

    def __init__(self, code: str = BUSY) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", code])
        self.pid = self.proc.pid
        self._stops, self._stopped, self._stop_lock = 0, set(), threading.Lock()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def files(tmp_path):
    return tmp_path / "gpu-0.measure", tmp_path / "gpu-0.unpaused"


def _cpu_s(pid: int) -> float:
    return sandbox.tree_usage(pid).cpu_ns / 1e9


def test_a_waiting_runner_is_stopped_for_a_measurement_and_runs_again_after(files):
    tree = Tree()
    told: list[dict] = []
    watcher = neighbours.PauseWatcher(files, tree, notify=told.append)
    try:
        watcher.watch()
        time.sleep(0.2)
        measuring = neighbours.Measuring(files)
        assert measuring.begin(wait=5.0)  # only once the watched tree is stopped
        before = _cpu_s(tree.pid)
        time.sleep(0.5)
        assert _cpu_s(tree.pid) - before < 0.005  # it used no CPU through the measurement
        assert 0.4 < watcher.paused_seconds() < 2.0  # the pause going on counts
        measuring.end()
        time.sleep(0.3)
        assert _cpu_s(tree.pid) - before > 0.1  # it runs again
        assert watcher.pauses == 1 and not watcher.verdict
        assert [m["state"] for m in told] == ["begin", "end"]  # the evaluator's stage clock stops in between
        assert 0.4 < told[1]["seconds"] < 2.0 and watcher.paused_s == pytest.approx(told[1]["seconds"])
    finally:
        watcher.unwatch()
        tree.close()


def test_a_watch_that_begins_during_a_measurement_waits_for_its_end(files):
    measuring = neighbours.Measuring(files)
    assert measuring.begin()  # no watcher yet: nothing to wait for
    tree = Tree()
    told: list[dict] = []
    watcher = neighbours.PauseWatcher(files, tree, notify=told.append)
    began = time.monotonic()
    threading.Timer(0.4, measuring.end).start()
    try:
        watcher.watch()  # the judge would send the candidate to its runner only after this
        assert time.monotonic() - began >= 0.35
        assert watcher.paused_seconds() >= 0.3 and [m["state"] for m in told] == ["begin", "end"]  # not its load's
    finally:
        watcher.unwatch()
        tree.close()


def test_without_watchers_a_measurement_waits_for_nothing(files):
    measuring = neighbours.Measuring(files)
    began = time.monotonic()
    # two flocks: well under the WAIT_S (5 s) a measurement would wait for a watcher (1 s: a loaded 2-core CI host)
    assert measuring.begin() and time.monotonic() - began < 1.0
    measuring.end()
    assert neighbours.Measuring(None).begin()  # no pause files: no neighbours


def test_a_stopped_tree_that_runs_is_killed_with_its_verdict(files):
    tree = Tree()
    watcher = neighbours.PauseWatcher(files, tree)
    try:
        watcher.watch()
        measuring = neighbours.Measuring(files)
        assert measuring.begin(wait=5.0)
        sandbox.thaw([tree.pid])  # what a timer sending it SIGCONT does
        tree.proc.wait(timeout=5)
        assert "ran while they were stopped" in watcher.verdict
        measuring.end()
    finally:
        watcher.unwatch()
        tree.close()


class _Reader:
    """Gives its message once ``at`` seconds have passed on the monotonic clock."""

    def __init__(self, at: float) -> None:
        self.at = at

    def read(self, timeout: float):
        wait = self.at - time.monotonic()
        if wait > timeout:
            time.sleep(timeout)
            return None
        time.sleep(max(0.0, wait))
        return {"type": "loaded"}


class _Runner:
    _read_unpaused = RunnerProcess._read_unpaused
    stage = "load"

    def __init__(self, at: float) -> None:
        self.reader = _Reader(at)
        self.killed = False

    def kill(self) -> None:
        self.killed = True


def test_a_loads_time_limit_leaves_out_the_time_its_runner_was_paused():
    paused = {"s": 0.0}
    runner = _Runner(time.monotonic() + 0.6)
    threading.Timer(0.1, lambda: paused.update(s=0.5)).start()  # stopped 0.5 s for another's measurement
    assert runner._read_unpaused(0.3, lambda: paused["s"]) == {"type": "loaded"}
    late = _Runner(time.monotonic() + 0.6)
    with pytest.raises(StageError, match="exceeded its time limit"):  # with no pause, the same wait ends at its limit
        late._read_unpaused(0.3, lambda: 0.0)
    assert late.killed


def test_a_tree_inside_a_long_system_call_is_not_killed_for_the_kernels_time(files, monkeypatch):
    """A runner mapping gigabytes (an H100's 6.4 GB output memfd) is inside one system call when the stop lands and
    keeps running there, in the kernel, for seconds: on the H100 one ran past the settle time (SETTLE_S) and was killed
    as a runner that ran while paused, an honest candidate's verdict. Its kernel time is not its own code running: not
    killed. (The settle is cut to 0.05 s here, so that a 1.5 GB mapping outlasts it; the tree's CPU after the settle
    is read against the kernel's ticks.)"""
    monkeypatch.setattr(neighbours, "SETTLE_S", 0.05)
    tree = Tree(IN_THE_KERNEL)
    watcher = neighbours.PauseWatcher(files, tree)
    try:
        time.sleep(0.5)  # inside its first mapping
        watcher.watch()
        measuring = neighbours.Measuring(files)
        before = sandbox.process_usage(tree.pid)[tree.pid]
        assert measuring.begin(wait=5.0)
        time.sleep(1.5)
        after = sandbox.process_usage(tree.pid)[tree.pid]
        measuring.end()
        time.sleep(0.1)
        assert not watcher.verdict, watcher.verdict
        assert tree.proc.poll() is None  # alive, and resumed
        spent = after.cpu_ns - before.cpu_ns
        assert (after.system_ticks - before.system_ticks) * neighbours.TICK_NS >= 0.5 * spent  # the kernel's time
    finally:
        watcher.unwatch()
        tree.close()


def test_a_measurement_waits_for_the_forward_after_a_load_and_then_stops_the_runner(files):
    """A forward launches its kernels before it waits for them: stopped between the two, an honest slow one's GPU work
    ran on beside the measurement and past the NVML reading's grace (load_forward.py). So a measurement that begins
    during it waits for its end (the runner synchronises before replying), the runner running meanwhile."""
    tree = Tree()
    watcher = neighbours.PauseWatcher(files, tree)
    measuring = neighbours.Measuring(files)
    try:
        watcher.watch()
        with watcher.forward():
            begun = threading.Event()
            waiter = threading.Thread(target=lambda: measuring.begin(wait=5.0) and begun.set())
            waiter.start()
            before = _cpu_s(tree.pid)
            time.sleep(0.6)
            assert not begun.is_set()  # held off while the forward runs
            assert _cpu_s(tree.pid) - before > 0.1  # and the runner was not stopped for it
        waiter.join(timeout=5.0)
        assert begun.is_set() and 0.5 < measuring.waited_s < 2.0, measuring.waited_s
        stopped = _cpu_s(tree.pid)
        time.sleep(0.3)
        assert _cpu_s(tree.pid) - stopped < 0.005  # once it ended, the runner is stopped for the measurement
        assert 0.5 < watcher.forward_waits_s < 2.0 and not watcher.verdict
    finally:
        measuring.end()
        watcher.unwatch()
        tree.close()


def test_a_forward_that_outlasts_its_budget_is_stopped_as_a_load_is(files, monkeypatch):
    """The wait is bounded over the whole forward, however many measurements it meets: a candidate cannot hold its
    siblings' measurements off for longer than FORWARD_WAIT_S by a forward that never ends."""
    monkeypatch.setattr(neighbours, "FORWARD_WAIT_S", 0.5)
    tree = Tree()
    watcher = neighbours.PauseWatcher(files, tree)
    try:
        watcher.watch()
        with watcher.forward():
            for most in (1.5, 0.4):  # the first waits out the budget, the second finds it spent
                measuring = neighbours.Measuring(files)
                assert measuring.begin(wait=5.0)
                assert measuring.waited_s < most, measuring.waited_s
                stopped = _cpu_s(tree.pid)
                time.sleep(0.3)
                assert _cpu_s(tree.pid) - stopped < 0.005  # stopped through the measurement
                measuring.end()
                time.sleep(0.2)
        assert watcher.forward_waits_s == pytest.approx(0.5, abs=0.15) and not watcher.verdict
    finally:
        watcher.unwatch()
        tree.close()
