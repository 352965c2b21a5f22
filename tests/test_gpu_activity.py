"""A stopped neighbour's queued GPU work, read from per-process samples (kb_gym/worker/gpu_activity.py) and the pause
watcher that kills its owner (kb_gym/worker/neighbours.py), with a stand-in for NVML. The same on a GPU, with NVML and
a candidate that queues seconds of kernels before its stop: tests/gpu/test_gpu_neighbour_queue.py."""

from __future__ import annotations

import os
import time

import pytest
import torch
from test_neighbours import Tree

from kb_gym.worker import gpu_activity, neighbours
from kb_gym.worker.gpu_activity import GRACE_S, GpuActivity, Sample


class FakeNvml:
    """NVML as a judge reads it: ``busy`` pids have a kernel running in every period, from ``busy_from`` (time.time())
    on, a sample per period ending now; ``contexts``: the processes with a context on the device."""

    def __init__(self, busy: set[int] = frozenset(), contexts: set[int] | None = None, period: float = 0.2,
                 busy_from: float = 0.0) -> None:
        self.busy, self.period, self.busy_from = set(busy), period, busy_from
        self.contexts = {os.getpid(), *busy} if contexts is None else contexts
        self.asked: list[int] = []

    def samples(self, since_us: int) -> list[Sample]:
        self.asked.append(since_us)
        now = time.time()
        return [Sample(pid, 60 if now - self.period >= self.busy_from else 0, int(now * 1e6)) for pid in self.busy
                if now * 1e6 > since_us]

    def context_pids(self) -> set[int]:
        return self.contexts

    def period_s(self) -> float:
        return self.period


def test_work_counts_only_in_periods_that_began_past_the_stops_grace():
    reading = GpuActivity(FakeNvml(period=0.2))
    stopped = 1000.0
    samples = [Sample(7, 90, int((stopped + 0.2 + GRACE_S) * 1e6)),  # its period began at the grace: in flight
               Sample(7, 0, int((stopped + 5) * 1e6)),  # idle
               Sample(8, 90, int((stopped + 5) * 1e6))]  # another process's
    reading.source.samples = lambda since: samples
    assert reading.busy_after({7}, stopped, 0) == (0.0, int((stopped + 5) * 1e6))
    samples.append(Sample(7, 5, int((stopped + 1.0) * 1e6)))  # began 0.8 s after the stop
    late, last = reading.busy_after({7}, stopped, 0)
    assert late == pytest.approx(1.0) and last == int((stopped + 5) * 1e6)


def test_the_sample_period_is_read_as_no_shorter_than_a_sixth_and_no_longer_than_a_second():
    assert GpuActivity(FakeNvml(period=0.01)).period_s == pytest.approx(1 / 6)
    assert GpuActivity(FakeNvml(period=3.0)).period_s == 1.0

    class Broken(FakeNvml):
        def period_s(self) -> float:
            raise RuntimeError("no samples")

    assert GpuActivity(Broken()).period_s == 1.0  # the longest documented: a period's start never placed too late


def test_attribution_is_trusted_only_where_nvml_names_the_judge_by_its_own_pid(monkeypatch):
    reading, note = GpuActivity.open(torch.device("cuda:0"), FakeNvml())
    assert reading is not None and note == "on"
    reading, note = GpuActivity.open(torch.device("cuda:0"), FakeNvml(contexts={os.getpid() + 100_000}))
    assert reading is None and "does not name this judge's context" in note  # the host's PIDs, not this namespace's

    class NoNvml(FakeNvml):
        def context_pids(self) -> set[int]:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    reading, note = GpuActivity.open(torch.device("cuda:0"), NoNvml())
    assert reading is None and note.startswith("no NVML: OSError")
    assert GpuActivity.open(torch.device("cpu")) == (None, "not a GPU")
    monkeypatch.setenv(gpu_activity.ENV, "0")
    assert GpuActivity.open(torch.device("cuda:0"), FakeNvml()) == (None, "off")


@pytest.fixture
def files(tmp_path):
    return tmp_path / "gpu-0.measure", tmp_path / "gpu-0.unpaused"


def _paused_through(files, tree: Tree, nvml: FakeNvml, seconds: float) -> neighbours.PauseWatcher:
    watcher = neighbours.PauseWatcher(files, tree, gpu=GpuActivity(nvml))
    watcher.watch()
    measuring = neighbours.Measuring(files)
    try:
        assert measuring.begin(wait=5.0)
        end = time.monotonic() + seconds
        while time.monotonic() < end and not watcher.verdict:
            time.sleep(0.05)
    finally:
        measuring.end()
        watcher.unwatch()
    return watcher


def test_a_stopped_tree_whose_gpu_work_runs_on_past_the_grace_is_killed(files):
    """A loading candidate queues seconds of kernels, then its host threads are stopped for a sibling's measurement:
    its queue runs on through the measurement. Seen busy in a period that began past the grace: killed, that its
    verdict (its context goes with it, and its queue)."""
    tree = Tree()
    try:
        watcher = _paused_through(files, tree, FakeNvml(busy={tree.pid}), seconds=3.0)
        assert "GPU work ran on" in watcher.verdict and "killed" in watcher.verdict, watcher.verdict
        tree.proc.wait(timeout=5)
    finally:
        tree.close()


def test_work_in_flight_at_the_stop_and_other_processes_work_are_not_the_trees(files):
    tree = Tree()
    try:
        # busy only in the first 0.1 s after the stop (kernels in flight), and another process busy throughout
        nvml = FakeNvml(busy={tree.pid}, period=0.2)
        nvml.samples = lambda since, base=nvml.samples: [
            Sample(s.pid, s.sm if s.t_us / 1e6 < stopped[0] + 0.1 else 0, s.t_us) for s in base(since)]
        other = FakeNvml(busy={tree.pid + 100_000})
        stopped = [time.time()]
        watcher = _paused_through(files, tree, nvml, seconds=1.5)
        assert not watcher.verdict and tree.proc.poll() is None
        stopped[0] = time.time()
        watcher = _paused_through(files, tree, other, seconds=1.5)
        assert not watcher.verdict and tree.proc.poll() is None
        assert other.asked and other.asked[0] >= int((stopped[0] - 1) * 1e6)  # samples from the stop on only
    finally:
        tree.close()


def test_a_reading_that_fails_mid_pause_leaves_the_pause_as_before(files):
    class Failing(FakeNvml):
        def samples(self, since_us: int) -> list[Sample]:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    tree = Tree()
    try:
        watcher = _paused_through(files, tree, Failing(busy={tree.pid}), seconds=0.6)
        assert not watcher.verdict and watcher.gpu is None and tree.proc.poll() is None
    finally:
        tree.close()
