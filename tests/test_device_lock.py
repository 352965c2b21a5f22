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
        lock = DeviceLock("cuda:0")
        lock.acquire()
        print("holding", flush=True)
        time.sleep(1.5)
        print(time.time(), flush=True)
        lock.release()
        time.sleep(5)
    """)
    lock = DeviceLock("cuda:0")
    lock.acquire()
    got_it = time.time()
    released = float(other.stdout.readline())
    lock.release()
    other.kill()
    assert got_it >= released  # it waited for the other process's job to end
    other_gpu = DeviceLock("cuda:1")  # another GPU is not held up by it
    t0 = time.perf_counter()
    other_gpu.acquire()
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
