"""A job that ran out of the device's memory beside another job runs again with the device to itself
(kb_gym/device_turns.py): on an H100 two judges' comparisons of 6-7 GB outputs ran out of its 80 GB side by side and an
honest reference copy got ``crash`` (session 38). Here the judge's own out-of-memory is a reference whose forward
raises PyTorch's OutOfMemoryError, on the CPU."""

from __future__ import annotations

import threading
import time

import pytest

from kb_gym import EvalConfig, Evaluator, Problem, evaluator
from kb_gym.device_turns import DeviceTurns

CONFIG = EvalConfig(trials=2, timing_min_reps=3, timing_max_reps=5, timing_warmup=1)

CANDIDATE = """import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x * 2
"""


def _problem(claim_file: str, always: bool, name: str) -> Problem:
    """A reference whose forwards on real data run out of memory in the first job that loads it (the one that creates
    ``claim_file``), or in every job (``always``), as a judge's comparison did beside another job's."""
    return Problem(id=1, name=name, level=1, code=f'''import os
import torch
try:
    os.close(os.open({claim_file!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    OOM = True
except FileExistsError:
    OOM = {always!r}
class Model(torch.nn.Module):
    def forward(self, x):
        if OOM and x.device.type != "meta":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB (beside another job)")
        return x * 2
def get_inputs():
    return [torch.randn(64, 64)]
def get_init_inputs():
    return []
''')


def test_a_turn_alone_waits_for_the_running_jobs_and_keeps_new_ones_out():
    turns = DeviceTurns()
    events: list[str] = []
    first_in, release_first = threading.Event(), threading.Event()

    def shared(name: str, hold: threading.Event | None = None) -> None:
        with turns.shared() as turn:
            events.append(f"{name} in")
            if hold is not None:
                first_in.set()
                hold.wait(5)
            events.append(f"{name} out")
        events.append(f"{name} overlapped={turn.overlapped}")

    def alone() -> None:
        with turns.alone() as turn:
            events.append("alone in")
            time.sleep(0.05)
            events.append("alone out")
        assert not turn.overlapped

    a = threading.Thread(target=shared, args=("a", release_first))
    a.start()
    first_in.wait(5)
    b = threading.Thread(target=alone)
    b.start()
    time.sleep(0.1)  # the alone turn is waiting for a: a later shared job waits behind it
    c = threading.Thread(target=shared, args=("c",))
    c.start()
    time.sleep(0.1)
    assert events == ["a in"], events
    release_first.set()
    for t in (a, b, c):
        t.join(5)
    assert events.index("alone in") > events.index("a out")
    assert events.index("c in") > events.index("alone out")
    assert "a overlapped=False" in events and "c overlapped=False" in events


def test_shared_turns_that_meet_are_both_marked_overlapped():
    turns = DeviceTurns()
    with turns.shared() as one, turns.shared() as two:
        pass
    with turns.shared() as three:
        pass
    assert one.overlapped and two.overlapped and not three.overlapped


@pytest.fixture(scope="module")
def ev():
    with Evaluator("cpu", workers_per_device=2, results_path=False, baseline_cache=False) as e:
        yield e


def test_out_of_memory_beside_another_job_is_run_again_alone(ev, tmp_path):
    problem = _problem(str(tmp_path / "claim"), False, "1_OOM_beside_another")
    first, second = ev.submit(problem, CANDIDATE, config=CONFIG), ev.submit(problem, CANDIDATE, config=CONFIG)
    results = [first.result(timeout=300), second.result(timeout=300)]
    assert [r.status for r in results] == ["correct", "correct"], [(r.status, r.error) for r in results]
    retried = [r for r in results if r.worker.get("retried_alone")]
    assert len(retried) == 1, [r.worker for r in results]
    assert "ran out of the device's memory" in retried[0].worker["retried_alone"]
    assert retried[0].worker.get("alone") is True
    assert retried[0].worker.get("evicted", 0) == 0  # alone once the other job ended was enough: nobody stopped
    later = ev.evaluate(problem, CANDIDATE, config=CONFIG)  # the problem's jobs now run alone
    assert later.status == "correct" and later.worker.get("alone") is True, (later.status, later.worker)


def test_out_of_memory_alone_is_the_verdict_and_leaves_the_problem_shared(ev, tmp_path):
    problem = _problem(str(tmp_path / "claim"), True, "1_OOM_always")
    first, second = ev.submit(problem, CANDIDATE, config=CONFIG), ev.submit(problem, CANDIDATE, config=CONFIG)
    results = [first.result(timeout=300), second.result(timeout=300)]
    assert [r.status for r in results] == ["crash", "crash"], [(r.status, r.error) for r in results]
    assert all("ran out of the device's memory" in r.error for r in results), [r.error for r in results]
    assert any(r.worker.get("retried_alone") for r in results), [r.worker for r in results]
    later = ev.evaluate(problem, CANDIDATE, config=CONFIG)  # alone it ran out too: no reason to keep it alone
    assert later.status == "crash" and not later.worker.get("alone"), (later.status, later.worker)


HOG = """import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 60.00 GiB")
"""


def test_a_candidate_out_of_memory_is_retried_but_sets_nothing_for_its_problem(ev, tmp_path):
    (tmp_path / "claim").touch()  # the claim taken: the reference runs out nowhere
    problem = _problem(str(tmp_path / "claim"), False, "1_OOM_candidate")
    futures = [ev.submit(problem, HOG, config=CONFIG) for _ in range(2)]
    results = [f.result(timeout=300) for f in futures]
    assert all(r.status == "runtime_error" and "out of memory on the device" in r.error for r in results), [
        (r.status, r.error) for r in results]
    assert any(r.worker.get("retried_alone") for r in results), [r.worker for r in results]
    assert not any(r.worker.get("evicted") for r in results)  # never stops the other workers: buggy kernels OOM often
    later = ev.evaluate(problem, CANDIDATE, config=CONFIG)  # the candidate's footprint says nothing of the problem's
    assert later.status == "correct" and not later.worker.get("alone"), (later.status, later.worker)


# A judge that holds the device's memory while idle (its context, spares, probe, device buffer: ~37 GB of the H100 in
# session 38): a lock held for its life from the first reference it loads. A reference of HOLDING runs out of memory
# while another judge holds one.
HOLD = """import fcntl
import os
import sys
import uuid
import torch
HOLDS = {holds!r}
if not hasattr(sys, "_kb_test_hold"):
    _path = os.path.join(HOLDS, uuid.uuid4().hex)
    try:
        _fd = os.open(_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        fcntl.flock(_fd, fcntl.LOCK_EX)
        sys._kb_test_hold = (_fd, _path)
    except PermissionError:  # a runner (the spare's reference): sandboxed, it holds nothing here
        sys._kb_test_hold = None


def another_judge_holds():
    if sys._kb_test_hold is None:
        return False
    for name in os.listdir(HOLDS):
        path = os.path.join(HOLDS, name)
        if path == sys._kb_test_hold[1]:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False


class Model(torch.nn.Module):
    def forward(self, x):
        if {oom!r} and x.device.type != "meta" and another_judge_holds():
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB (another judge holds 37 GiB)")
        return x * 2
def get_inputs():
    return [torch.randn(64, 64)]
def get_init_inputs():
    return []
"""


def test_out_of_memory_beside_an_idle_worker_is_run_again_with_it_stopped(tmp_path, monkeypatch):
    holds = tmp_path / "holds"
    holds.mkdir()
    holder = Problem(id=2, name="2_Holder", level=1, code=HOLD.format(holds=str(holds), oom=False))
    holding = Problem(id=3, name="3_OOM_beside_an_idle_judge", level=1, code=HOLD.format(holds=str(holds), oom=True))
    with Evaluator("cpu", workers_per_device=2, results_path=False, baseline_cache=False) as ev:
        both = [ev.submit(holder, CANDIDATE, config=CONFIG) for _ in range(2)]  # one on each worker: both hold
        assert [f.result(timeout=300).status for f in both] == ["correct", "correct"]
        r = ev.evaluate(holding, CANDIDATE, config=CONFIG)  # nothing beside it, the other judge idle and holding
        assert r.status == "correct", (r.status, r.error, r.worker)
        assert "ran out of the device's memory" in r.worker.get("retried_alone", ""), r.worker
        assert r.worker.get("alone") is True and r.worker.get("evicted") == 1, r.worker
        later = ev.evaluate(holding, CANDIDATE, config=CONFIG)  # its jobs now start by stopping the others
        assert later.status == "correct" and later.worker.get("alone") is True, (later.status, later.worker)
        assert not later.worker.get("retried_alone"), later.worker
        monkeypatch.setattr(evaluator, "TURN_MEMORY_S", -1.0)  # remembered no longer: side by side again
        again = ev.evaluate(holding, CANDIDATE, config=CONFIG)  # it starts side by side (and is retried if need be)
        assert again.status == "correct", (again.status, again.error)
        assert not again.worker.get("alone") or again.worker.get("retried_alone"), again.worker


def test_one_worker_per_device_does_not_retry(tmp_path):
    problem = _problem(str(tmp_path / "claim"), False, "1_OOM_one_worker")
    with Evaluator("cpu", results_path=False, baseline_cache=False) as ev:
        r = ev.evaluate(problem, CANDIDATE, config=CONFIG)
    assert r.status == "crash" and "ran out of the device's memory" in r.error, (r.status, r.error)
    assert not r.worker.get("retried_alone"), r.worker
