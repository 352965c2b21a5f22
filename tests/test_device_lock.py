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


def test_a_quiet_job_waits_for_a_load_in_another_process():
    holder = _holder("""
        import time
        from kb_gym.device_lock import DeviceLock
        lock = DeviceLock("cuda:0")
        lock.begin_load()
        print("holding", flush=True)
        time.sleep(60)
    """)
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
