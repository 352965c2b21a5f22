"""Evaluators in different processes on one host never measure on one GPU at the same time (device_lock.py).
No GPU is needed: the locks are files named after the physical GPU."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from kb_gym.device_lock import DeviceLock, GpuClaim, physical_gpu


@pytest.fixture(autouse=True)
def lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KB_GYM_GPU_LOCK_DIR", str(tmp_path))
    return tmp_path


def _holder(script: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-P", "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_the_physical_gpu_is_named_as_the_host_sees_it(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert physical_gpu("cuda:1") == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert physical_gpu("cuda:1") == "5"  # two ranks with different views of the same GPU share its lock
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f1c2a/0,GPU-77")
    assert physical_gpu("cuda:0") == "GPU-8f1c2a_0"


def test_a_second_process_waits_until_the_first_one_has_measured():
    other = _holder("""
        import time
        from kb_gym.device_lock import DeviceLock
        hold = DeviceLock("cuda:0").hold()
        hold.take(exclusive=True)
        print("holding", flush=True)
        time.sleep(1.5)
        print(time.time(), flush=True)
        hold.release()
        time.sleep(5)
    """)
    hold = DeviceLock("cuda:0").hold()
    hold.take(exclusive=True)
    got_it = time.time()
    released = float(other.stdout.readline())
    hold.release()
    other.kill()
    assert got_it >= released  # it waited for the other process's job to end
    other_gpu = DeviceLock("cuda:1").hold()  # another GPU is not held up by it
    t0 = time.perf_counter()
    other_gpu.take(exclusive=True)
    other_gpu.release()
    assert time.perf_counter() - t0 < 0.5


def test_refuse_mode_names_the_process_that_holds_the_gpu_and_frees_it_when_that_one_ends():
    other = _holder("""
        import os, time
        from kb_gym.device_lock import GpuClaim
        claim = GpuClaim(["cuda:0", "cpu"])
        print("holding", flush=True)
        print(os.getpid(), flush=True)
        time.sleep(30)
    """)
    pid = other.stdout.readline().strip()
    with pytest.raises(RuntimeError, match=f"pid {pid}.*gpu_sharing='wait'"):
        GpuClaim(["cuda:0"])
    GpuClaim(["cuda:1"]).release()  # other GPUs are free
    other.kill()
    other.wait()
    GpuClaim(["cuda:0"]).release()  # the holder's end frees its claim


def test_an_unknown_sharing_mode_is_one_clear_error():
    from kb_gym import Evaluator

    with pytest.raises(ValueError, match="gpu_sharing must be one of"):
        Evaluator("cpu", gpu_sharing="share", results_path=False)


@pytest.mark.parametrize("host_wide", [False, True])
def test_a_quiet_job_waits_for_running_loads_and_new_loads_wait_for_it(host_wide):
    """A baseline-only job times with no candidate loading beside it (red team round 8): it waits for the loads
    already running, and a load that starts while it waits or runs waits for it."""
    lock = DeviceLock("cuda:0", host_wide=host_wide)
    events: list[str] = []
    lock.begin_load()

    def quiet() -> None:
        lock.begin_quiet()
        events.append("quiet")
        time.sleep(0.2)
        events.append("quiet done")
        lock.end_quiet()

    def load() -> None:
        lock.begin_load()
        events.append("second load")
        lock.end_load()

    q = threading.Thread(target=quiet)
    q.start()
    time.sleep(0.2)
    second = threading.Thread(target=load)
    second.start()
    time.sleep(0.2)
    assert events == []  # the quiet job waits for the first load; the second load waits behind the quiet job
    events.append("first load done")
    lock.end_load()
    q.join(5)
    second.join(5)
    assert events == ["first load done", "quiet", "quiet done", "second load"]


LOADING_ELSEWHERE = """
    import time
    from kb_gym.device_lock import DeviceLock
    lock = DeviceLock("cuda:0")
    lock.begin_load()
    print("holding", flush=True)
    time.sleep(60)
"""


def test_a_quiet_job_waits_for_a_load_in_another_process():
    holder = _holder(LOADING_ELSEWHERE)
    lock = DeviceLock("cuda:0")
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (lock.begin_quiet(), got.set()))
    waiter.start()
    try:
        assert not got.wait(0.5)  # the other Evaluator's candidate is loading
    finally:
        holder.kill()
        holder.wait()
    assert got.wait(5)
    lock.end_quiet()


@pytest.mark.parametrize("host_wide", [False, True])
def test_a_quiet_wait_outlasted_by_a_load_is_cut_and_holds_nothing(host_wide):
    """A candidate can sleep in its import for its whole load limit: the baseline-only job's wait is cut at its
    timeout (it gets no quiet), and the loads its wait held back go on at once."""
    lock = DeviceLock("cuda:0", host_wide=host_wide)
    lock.begin_load()  # the sleeper
    started = time.monotonic()
    assert lock.begin_quiet(timeout=0.3) is False
    assert 0.3 <= time.monotonic() - started < 2.0
    second = threading.Thread(target=lambda: (lock.begin_load(), lock.end_load()))
    second.start()
    second.join(2)
    assert not second.is_alive()  # nothing of the cut wait is held
    lock.end_load()
    assert lock.begin_quiet(timeout=0.3) is True  # and once the loads are over, the quiet is had
    lock.end_quiet()


def test_a_quiet_wait_outlasted_by_another_process_load_is_cut():
    holder = _holder(LOADING_ELSEWHERE)
    lock = DeviceLock("cuda:0")
    try:
        assert lock.begin_quiet(timeout=0.3) is False
        lock.begin_load()  # neither the gate nor the quiet file is left held
        lock.end_load()
    finally:
        holder.kill()
        holder.wait()


def test_a_candidate_asleep_in_its_load_does_not_stall_a_problems_first_candidate(tmp_path, monkeypatch):
    """The first candidate of a problem under ``reuse_cached_baseline`` waits for a baseline-only job, which waits
    for quiet: beside a candidate asleep in its import it waited out that candidate's whole load limit. Now the
    wait is cut (workers.QUIET_WAIT_S), that baseline is kept nowhere, and the candidate times its own."""
    from kb_gym import EvalConfig, Evaluator, workers
    from kb_gym.baseline_cache import BaselineCache
    from kb_gym.problems import load_problems, reference_as_candidate

    monkeypatch.setattr(workers, "QUIET_WAIT_S", 1.0)
    slept, other = load_problems("builtin", size="cpu")[:2]
    cfg = EvalConfig(reuse_cached_baseline=True, trials=1, timing_min_reps=3, timing_max_reps=5, timing_warmup=1,
                     integrity="off", load_timeout=60)
    cache = BaselineCache(tmp_path / "baselines.json")
    with Evaluator("cpu", config=cfg, results_path=False, baseline_cache=cache, workers_per_device=2) as ev:
        ev.warm()
        asleep = "import time\ntime.sleep(12)\n" + reference_as_candidate(slept)
        sleeper = ev.submit(slept, asleep, config=cfg.replace(reuse_cached_baseline=False, timing=False))
        time.sleep(1.0)
        started = time.monotonic()
        first = ev.evaluate(other, reference_as_candidate(other))
        waited = time.monotonic() - started
        assert not sleeper.done()  # it was still asleep in its import when the first candidate was judged
        assert first.status == "correct" and first.baseline_cached is False, (first.status, first.error)
        assert first.ref_runtime_ms is not None  # timed its own baseline, paired
        assert cache.with_prefix(other.code_hash) == {}  # the baseline timed beside the sleeper is kept nowhere
        assert sleeper.result().status == "correct"
        again = ev.evaluate(other, reference_as_candidate(other))  # for a while no wait for quiet is tried again
        assert again.status == "correct" and cache.with_prefix(other.code_hash) == {}
    assert waited < 10.0, waited


# --- modes: stages that measure nothing share the device, a measurement holds it alone --------------------------


@pytest.mark.parametrize("host_wide", [False, True])
def test_shared_holds_overlap_and_an_exclusive_one_waits_for_every_one_of_them(host_wide):
    lock = DeviceLock("cuda:0", host_wide=host_wide)
    a, b = lock.hold(), lock.hold()
    a.take(exclusive=False)
    b.take(exclusive=False)  # at once: two correctness stages side by side
    got: list[str] = []
    timing = lock.hold()
    waiter = threading.Thread(target=lambda: (timing.take(exclusive=True), got.append("timing")))
    waiter.start()
    time.sleep(0.2)
    a.release()
    time.sleep(0.2)
    assert got == []  # one shared stage is still on the device
    b.release()
    waiter.join(5)
    assert got == ["timing"]
    timing.release()


@pytest.mark.parametrize("host_wide", [False, True])
def test_a_waiting_measurement_holds_new_shared_stages_back(host_wide):
    """A stream of correctness stages never puts a timing stage off: one that asks after it waits behind it."""
    lock = DeviceLock("cuda:0", host_wide=host_wide)
    first = lock.hold()
    first.take(exclusive=False)
    events: list[str] = []

    def take(name: str, exclusive: bool, hold_for: float) -> None:
        hold = lock.hold()
        hold.take(exclusive=exclusive)
        events.append(name)
        time.sleep(hold_for)
        events.append(name + " done")
        hold.release()

    timing = threading.Thread(target=take, args=("timing", True, 0.2))
    timing.start()
    time.sleep(0.2)
    late = threading.Thread(target=take, args=("late correctness", False, 0.0))
    late.start()
    time.sleep(0.2)
    assert events == []
    first.release()
    timing.join(5)
    late.join(5)
    assert events == ["timing", "timing done", "late correctness", "late correctness done"]


def test_a_hold_changes_mode_and_two_shared_holders_both_asking_to_measure_take_turns():
    lock = DeviceLock("cuda:0", host_wide=False)
    a, b = lock.hold(), lock.hold()
    a.take(exclusive=False)
    b.take(exclusive=False)
    order: list[str] = []

    def measure(name: str, hold) -> None:
        hold.take(exclusive=True)  # leaves its shared hold first: no two holders wait on each other
        order.append(name)
        alone.append(lock._shared == 0)
        time.sleep(0.1)
        order.append(name + " measured")
        hold.take(exclusive=False)  # back to shared for its kernel checks (behind the other's waiting measurement)
        hold.release()

    alone: list[bool] = []

    threads = [threading.Thread(target=measure, args=(n, h)) for n, h in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert not any(t.is_alive() for t in threads) and alone == [True, True]
    assert order in (["a", "a measured", "b", "b measured"], ["b", "b measured", "a", "a measured"])
    assert a.mode is None and b.mode is None


SHARED_ELSEWHERE = """
    import time
    from kb_gym.device_lock import DeviceLock
    hold = DeviceLock("cuda:0").hold()
    hold.take(exclusive=False)
    print("holding", flush=True)
    time.sleep(1.0)
    print(time.time(), flush=True)
    hold.release()
    time.sleep(5)
"""


def test_another_processs_shared_stage_lets_a_shared_one_in_and_holds_a_measurement_off():
    other = _holder(SHARED_ELSEWHERE)
    try:
        lock = DeviceLock("cuda:0")
        side = lock.hold()
        t0 = time.perf_counter()
        side.take(exclusive=False)
        assert time.perf_counter() - t0 < 0.5  # beside the other process's correctness stage
        side.release()
        measuring = lock.hold()
        measuring.take(exclusive=True)  # a measurement: after the other process's stage
        got_it = time.time()
        released = float(other.stdout.readline())
        measuring.release()
        assert got_it >= released
    finally:
        other.kill()
        other.wait()


def test_with_shared_stages_no_timing_overlaps_another_jobs_stage_and_verdicts_hold(monkeypatch):
    """Two workers on one device, ``shared_stages``: a problem's first evaluation (outputs not yet known) holds the
    device exclusively throughout; later ones hold it shared for correctness and the kernel checks, exclusively for
    timing, and no hold is ever exclusive beside another."""
    from kb_gym import EvalConfig, Evaluator, device_lock
    from kb_gym.problems import load_problems, reference_as_candidate

    takes: list[tuple[int, bool, int, bool]] = []  # (hold, exclusive, other shared holds, another exclusive)
    real_take = device_lock.DeviceHold.take

    holds: list = []  # every hold kept alive: a freed one's id() can be the next one's (a CI run merged two)

    def spy(self, exclusive: bool) -> None:
        real_take(self, exclusive)
        lock = self.lock
        holds.append(self)
        takes.append((id(self), exclusive, lock._shared - (0 if exclusive else 1), lock._exclusive and not exclusive))

    monkeypatch.setattr(device_lock.DeviceHold, "take", spy)
    problem = load_problems("builtin", size="cpu")[0]
    cfg = EvalConfig(trials=1, timing_min_reps=3, timing_max_reps=5, timing_warmup=1, integrity="off")
    with Evaluator("cpu", config=cfg, results_path=False, baseline_cache=False, workers_per_device=2,
                   shared_stages=True) as ev:
        first = ev.evaluate(problem, reference_as_candidate(problem))
        first_takes = list(takes)
        later = ev.evaluate_many([(problem, reference_as_candidate(problem))] * 4)
    assert first.status == "correct" and all(r.status == "correct" for r in later), [r.error for r in later]
    assert [t[1] for t in first_takes] == [True]  # exclusive, once
    modes: dict[int, list[bool]] = {}
    for hold, exclusive, _, _ in takes[len(first_takes):]:
        modes.setdefault(hold, []).append(exclusive)
    assert sorted(modes.values()) == [[False, True, False]] * 4  # shared, timing alone, shared again
    assert all(others == 0 for _, exclusive, others, _ in takes if exclusive)  # a measurement is alone
    assert not any(beside for *_, beside in takes)
    spans = sorted(tuple(r.worker["timed_at"]) for r in later if r.worker.get("timed_at"))
    assert len(spans) == 4 and all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
