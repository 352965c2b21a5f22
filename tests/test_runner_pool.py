"""The judge's pool of pristine spares (kb_gym/worker/runner_pool.py), with stand-in runners: which process a
candidate gets, which one the envelope's calibration measures on, and when each was started."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from kb_gym.worker import runner_pool
from kb_gym.worker.loading import StageError

_ids = itertools.count()


class FakeRunner:
    """A runner that is up at once: ``n`` says in which order runners were started."""

    def __init__(self, device: str, scratch_root: Path, zygote: object = None, payloads: object = None) -> None:
        self.n = next(_ids)
        self.forked = zygote is not None
        self.alive = True
        self.killed = False
        self.fails_to_start = False
        self.started = 0.0

    def wait_ready(self, timeout: float = 0.0) -> None:
        if self.fails_to_start:
            raise StageError("crash", "did not start")

    def kill(self) -> None:
        self.alive, self.killed = False, True


@pytest.fixture
def pool(monkeypatch, tmp_path):
    monkeypatch.setattr(runner_pool, "RunnerProcess", FakeRunner)
    monkeypatch.setenv("KB_GYM_ZYGOTE", "0")  # no zygote: the stand-ins are "fresh interpreters"
    made = []

    def make(spares: int) -> runner_pool.RunnerPool:
        p = runner_pool.RunnerPool("cpu", tmp_path, spares=spares)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def _job(pool: runner_pool.RunnerPool) -> tuple[FakeRunner, FakeRunner]:
    """One evaluation as job.py runs it: the candidate's runner taken, then the spare lent for the calibration."""
    runner = pool.take()
    return runner, pool.pristine(timeout=1.0)


def test_with_two_spares_the_calibration_runs_on_a_spare_started_an_evaluation_earlier(pool):
    p = pool(2)
    p.prestart()
    assert p.started == 2
    calibrated = None
    for _ in range(5):
        started_before = {s.n for s in p.spares}  # the spares already started when the job begins
        runner, spare = _job(p)
        assert runner.n in started_before and spare.n in started_before, "nothing waits for a start-up"
        assert spare is not runner and not spare.killed
        # the spare that only measured the reference is the next candidate's runner
        assert calibrated is None or runner is calibrated
        calibrated = spare
    assert p.started == 2 + 5, "one runner started per evaluation"


def test_with_one_spare_the_calibration_waits_for_the_runner_forked_at_the_jobs_start(pool):
    p = pool(1)
    p.prestart()
    starts_before = {s.n for s in p.spares}
    runner, spare = _job(p)
    assert runner.n in starts_before and spare.n not in starts_before


def test_a_dead_or_failed_spare_is_replaced_and_a_discard_lends_the_next(pool):
    p = pool(2)
    p.prestart()
    oldest, second = p.spares
    oldest.alive = False  # died while idle: never handed out
    runner = p.take()
    assert runner is second and oldest.killed and len(p.spares) == 2
    lent = p.pristine(timeout=1.0)
    p.discard_spare()  # the second opinion wants another process
    assert lent.killed and p.pristine(timeout=1.0) is not lent
    p.spares[0].fails_to_start = True
    failed = p.spares[0]
    assert p.pristine(timeout=1.0) is None and failed.killed and failed not in p.spares


def test_close_kills_every_spare(pool):
    p = pool(2)
    p.prestart()
    spares = list(p.spares)
    p.close()
    assert all(s.killed for s in spares) and not p.spares


class BufferedRunner(FakeRunner):
    """A stand-in given the judge's device buffer at birth where its hint asks for one (runner_client.py)."""

    gives_buffers = True

    def __init__(self, device: str, scratch_root: Path, zygote: object = None, payload_bytes: int = 0) -> None:
        super().__init__(device, scratch_root, zygote)
        want = runner_pool.payload.premap_size(payload_bytes)
        self.device_payload = (type("Buffer", (), {"size": want})()
                               if want and self.gives_buffers else None)


def _device_buffers(monkeypatch, gives: bool = True) -> None:
    monkeypatch.setattr(runner_pool, "RunnerProcess", BufferedRunner)
    monkeypatch.setattr(BufferedRunner, "gives_buffers", gives)
    monkeypatch.setattr(runner_pool.device_payload, "wanted", lambda device, nbytes: nbytes > 0)


BIG = 6 << 30  # a 6.4 GB-output problem's hint, as level1/19_ReLU's at GPU size


def test_a_spare_started_for_another_problem_is_replaced_by_one_with_the_device_buffer(pool, monkeypatch):
    _device_buffers(monkeypatch)
    p = pool(1)
    p.prestart()  # started during an earlier problem's job: no hint, no buffer
    stale = p.spares[0]
    p.payload_hint = BIG
    runner = p.take()
    assert stale.killed and runner is not stale
    assert runner.device_payload is not None and runner.device_payload.size == BIG
    assert len(p.spares) == 1 and p.spares[0].device_payload.size == BIG  # the next job's, started with the hint


def test_a_spare_that_fits_is_kept_and_small_outputs_restart_nothing(pool, monkeypatch):
    _device_buffers(monkeypatch)
    p = pool(1)
    p.payload_hint = BIG
    p.prestart()
    fitting = p.spares[0]
    assert p.take() is fitting
    p.payload_hint = 1 << 10  # crosses the pipe: no buffer wanted
    small = p.spares[0]
    assert p.take() is small and not small.killed


def test_without_the_device_buffer_wanted_no_spare_is_restarted(pool, monkeypatch):
    _device_buffers(monkeypatch)
    monkeypatch.setattr(runner_pool.device_payload, "wanted", lambda device, nbytes: False)
    p = pool(1)
    p.prestart()
    stale = p.spares[0]
    p.payload_hint = BIG
    assert p.take() is stale


def test_a_driver_that_gives_no_buffer_is_tried_once_then_the_memfd_serves(pool, monkeypatch):
    _device_buffers(monkeypatch, gives=False)
    p = pool(1)
    p.prestart()
    p.payload_hint = BIG
    first = p.take()
    assert first.device_payload is None and p.device_buffers_fail
    nxt = p.spares[0]
    assert p.take() is nxt  # not restarted again
