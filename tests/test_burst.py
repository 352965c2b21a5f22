"""The burst check (kb_gym/worker/burst.py): how many forwards it asks for, how it reads the judge's clock, and on
the CPU end to end: honest candidates are not charged, a runner that reports false times is, and a runner that
leaves forwards of the burst undone is caught by the outputs drawn after it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kb_gym import EvalConfig, Evaluator
from kb_gym.problems import get_problem, load_problems, reference_as_candidate
from kb_gym.worker import burst
from kb_gym.worker.burst import burst_size, read_burst

CPU_TIMED = EvalConfig(trials=2, timing_min_reps=10, timing_max_reps=20, timing_warmup=1, timing_max_seconds=10,
                       load_timeout=60, correctness_timeout=30, timing_timeout=60, burst_check=True)


def test_the_burst_is_sized_to_the_claim_within_time_and_memory():
    # the envelope already bounds a 20 ms CPU claim (tolerance 3 ms) or a 4 ms GPU one (0.3 ms) within the drift
    # allowed (CPU: 100%, GPU: 10%): no burst; a 2 ms GPU claim wants 5 forwards: 8
    assert burst_size(20.0, 3.0, 20.0, 1 << 20, "cpu", 60.0) == 0 and burst_size(4.0, 0.3, 4.0, 1, "cuda", 60) == 0
    assert burst_size(2.0, 0.3, 2.0, 1 << 20, "cuda", 60.0) == 8
    # a 1 ms claim under a 3 ms tolerance wants 100 forwards: 128, a power of two
    assert burst_size(1.0, 3.0, 1.0, 1 << 20, "cpu", 60.0) == 128
    # a 1 us claim wants 100,000: the time (0.6 s at 2 ms a forward: 300 -> 256) and memory caps hold it
    assert burst_size(0.001, 3.0, 2.0, 1 << 20, "cpu", 60.0) == 256
    assert burst_size(0.001, 3.0, 0.01, 64 << 20, "cpu", 60.0) == 4  # 256 MB of outputs held
    assert burst_size(0.001, 0.3, 0.001, 1, "cuda", 60.0) == burst.MAX_FORWARDS
    assert burst_size(0.001, 3.0, 2.0, 1 << 20, "cpu", 1.0) == 0  # no time left in the stage
    assert burst_size(0.0, 3.0, 2.0, 1, "cpu", 60.0) == 0


def test_the_reading_charges_what_the_judges_clock_shows_beyond_the_claim():
    # three pairs: the candidate's burst less the spare's share read right before it
    honest = read_burst([21.0, 20.5, 21.5], [50.0] * 3, 100, claimed_ms=0.2, claimed_host_ms=None,
                        loop_tolerance_ms=3.0, device_kind="cpu")
    assert not honest.counted and honest.tolerance_ms == 7.5 and honest.forward_ms == pytest.approx(0.21)
    # back to back 2x slower on the CPU (100% allowed, then the 3 ms): not charged; 2.5x slower is
    assert not read_burst([40.0] * 3, [50.0] * 3, 100, 0.2, None, 3.0, "cpu").counted
    assert read_burst([50.0] * 3, [50.0] * 3, 100, 0.2, None, 3.0, "cpu").charged_ms == pytest.approx(0.3)
    lie = read_burst([20.0, 19.0, 21.0], [50.0] * 3, 100, claimed_ms=0.001, claimed_host_ms=None,
                     loop_tolerance_ms=3.0, device_kind="cpu")
    assert lie.counted and lie.charged_ms == pytest.approx(0.199) and not lie.launch_bound
    # noisy pairs widen the tolerance to their range, or to a share of the harness's share: 15% on the CPU, 2% on
    # a GPU
    noisy = read_burst([20.0, 0.0, 40.0], [50.0] * 3, 100, 0.001, None, 3.0, "cpu")
    assert noisy.tolerance_ms == 40.0 and not noisy.counted
    assert read_burst([20.0] * 3, [1000.0] * 3, 100, 0.001, None, 3.0, "cpu").tolerance_ms == 150.0
    assert read_burst([20.0] * 3, [1000.0] * 3, 100, 0.001, None, 0.3, "cuda").tolerance_ms == 20.0
    # the clean-clone CI run's honest ReLU copy: three pairs agreeing on a 48 ms offset of a 276 ms share (range
    # 4.9 ms) against a 0.04 ms claim is the CPU's drift between two processes, not a lie
    assert not read_burst([46.0, 48.3, 50.9], [276.3] * 3, 512, 0.04, None, 3.0, "cpu").counted
    # on a GPU, a forward whose reported host time covers the burst is launch-bound, not hiding work
    launch = read_burst([20.0] * 3, [50.0] * 3, 100, claimed_ms=0.05, claimed_host_ms=0.2, loop_tolerance_ms=0.3,
                        device_kind="cuda")
    assert launch.counted and launch.launch_bound and launch.charged_ms == pytest.approx(0.15)
    hidden = read_burst([20.0] * 3, [50.0] * 3, 100, claimed_ms=0.05, claimed_host_ms=0.06, loop_tolerance_ms=0.3,
                        device_kind="cuda")
    assert hidden.counted and not hidden.launch_bound


def test_nothing_is_run_where_no_calibration_or_no_claim_exists():
    calls = []
    runner = SimpleNamespace(burst=lambda *a, **k: calls.append("burst"))
    timing = SimpleNamespace(calibration=None, cand=SimpleNamespace(event_ms=[1.0]), mismatch=None)
    burst.confirm(runner, timing, lambda k: calls.append("calibrate"), None, None, 0, 1 << 20, "cpu", lambda: 60.0)
    assert calls == []


@pytest.fixture(scope="module")
def ev():
    with Evaluator("cpu", results_path=False, baseline_cache=False) as e:
        yield e


@pytest.fixture(scope="module")
def relu():
    return get_problem(load_problems("builtin", size="cpu"), name="level1/1_ReLU")


def _burst_of(r):
    return ((r.correctness or {}).get("envelope") or {}).get("burst")


def test_honest_candidates_are_confirmed_not_charged(ev, relu):
    """Two honest answers of ~0.1 ms a forward (a reference copy, and torch.where), three times each: each got its
    burst, which charged nothing. The Triton solution through the interpreter (60-90 ms a forward here) needs none:
    the loop's 3 ms tolerance is within the drift allowed, so the envelope already bounds a false claim."""
    from kb_gym.training.learning_check.corpus import correct_code

    clamp = reference_as_candidate(relu).replace("torch.clamp_min(inp, 0.0)", "torch.where(inp > 0, inp, 0.0)")
    assert clamp != reference_as_candidate(relu)
    for source in (reference_as_candidate(relu), clamp) * 3:
        r = ev.evaluate(relu, source, config=CPU_TIMED)
        if (_burst_of(r) or {}).get("counted"):
            # under a loaded 2-core host (a clean-clone CI run, session 43) one honest evaluation in a few dozen is
            # charged; the check is off by default: what must hold is that a charge does not repeat
            r = ev.evaluate(relu, source, config=CPU_TIMED)
        assert r.status == "correct", (r.status, r.error)
        b = _burst_of(r)
        assert b is not None and b["forwards"] >= 2, r.correctness.get("envelope")
        # the CPU clock's reading too, where it is on (cpu_clock.py): it charges side_stream by itself
        assert not b["counted"] and "side_stream" not in r.flags and "launch_bound" not in r.flags, (
            b, r.correctness["envelope"].get("cpu_clock"))
    solution, variant = correct_code(relu)
    assert variant == "triton_solution"
    r = ev.evaluate(relu, solution, config=CPU_TIMED)
    assert r.status == "correct" and _burst_of(r) is None and "side_stream" not in r.flags, r.correctness


LEFT_UNDONE = '''
import torch
import torch.nn as nn

_calls = [0]


class ModelNew(nn.Module):
    def forward(self, x):
        _calls[0] += 1
        if _calls[0] > 60:  # past the correctness trials and the timed calls: the burst's forwards
            return torch.zeros_like(x)
        return torch.relu(x)
'''


def test_forwards_left_undone_in_the_burst_are_found_by_the_draw(ev, relu):
    r = ev.evaluate(relu, LEFT_UNDONE, config=CPU_TIMED)
    assert r.status == "incorrect" and "back to back after the timed calls" in (r.error or ""), (r.status, r.error)
    assert "timing_mismatch" in r.flags
    honest = ev.evaluate(relu, reference_as_candidate(relu), config=CPU_TIMED)
    assert honest.status == "correct" and not _burst_of(honest)["counted"]


def test_the_burst_is_off_by_default(ev, relu):
    assert EvalConfig().burst_check is False
    r = ev.evaluate(relu, reference_as_candidate(relu), config=CPU_TIMED.replace(burst_check=False))
    assert r.status == "correct" and _burst_of(r) is None
