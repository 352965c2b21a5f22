"""The wall check on a real GPU (kb_gym/worker/wall_check.py, KB_GYM_WALL_CHECK=1): a claim past the probe's time slice
held to the wall time of unshielded calls. Round 24's lie, at a size where it is whole: a runner whose timed_call skips
the launch shield and reports 1.2 ms less than its forward took hides that from the envelope (~1 ms of shield and its
0.3 ms tolerance).

Run on the device machine by scripts/gpu_check.sh; skipped elsewhere (tests/conftest.py).
"""

from __future__ import annotations

import json

import pytest

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.problems import reference_as_candidate
from kb_gym.worker.probe_check import MAX_CLAIM_MS
from kb_gym.worker.wall_check import MAX_WALL_CLAIM_MS

pytestmark = pytest.mark.gpu

CONFIG = EvalConfig(trials=2, timing_min_reps=5, timing_max_reps=20, timing_warmup=2, integrity="off", probe_check=True)

# fp32 matmul, 6144 x 6144 x 6144 (TF32 off): ~5-8 ms on an H100 or H200, between the probe's limit and the wall's
MATMUL = Problem(id=1, name="1_Matmul_wall", level=1, code='''import torch
class Model(torch.nn.Module):
    def forward(self, a, b):
        return a @ b
def get_inputs():
    return [torch.randn(6144, 6144), torch.randn(6144, 6144)]
def get_init_inputs():
    return []
''')

SHORTENED = reference_as_candidate(MATMUL) + '''
import sys as _sys
_runner = _sys.modules["kb_gym.worker.runner"]
_real = _runner.timed_call


def _shortened(fn, inputs, device, flusher, shield=True):
    timed = _real(fn, inputs, device, flusher, shield=False)  # no shield: ~1 ms less of the envelope
    return timed._replace(ms=max(0.1, timed.ms - 1.2))


_runner.timed_call = _shortened
'''


@pytest.fixture(scope="module")
def ev():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KB_GYM_WALL_CHECK", "1")  # the judges read it: set before they start
        with Evaluator("cuda:0", results_path=False, baseline_cache=False) as e:
            yield e


def _shown(wall: dict | None, *more: object) -> str:
    """What the pass read, for a failure's message: a string, which pytest prints whole (a dict or tuple it cuts to
    240 characters, and session 39's reading lost its samples so)."""
    keys = ("claimed_ms", "wall_ms", "wall_tolerance_ms", "reference_idle_ms", "wall_samples_ms", "idle_samples_ms",
            "charged_ms", "passes", "voids", "unverified", "after_exit", "seconds")
    return json.dumps([{k: wall.get(k) for k in keys} if wall else wall, *more], default=str)


def test_an_honest_claim_past_the_probes_limit_is_not_charged(ev):
    r = ev.evaluate(MATMUL, reference_as_candidate(MATMUL), config=CONFIG)
    assert r.status == "correct", (r.status, r.error)
    assert MAX_CLAIM_MS <= r.runtime_ms < MAX_WALL_CLAIM_MS, r.runtime_ms  # the size is in the wall check's range
    wall = r.correctness["envelope"]["probe"]
    assert wall and wall["mode"] == "wall" and not wall["counted"], _shown(wall)
    assert wall["after_exit"] == "", _shown(wall)  # the probe looked for queued work before the spare's calls
    assert 0.97 < r.speedup < 1.03, _shown(wall, r.speedup)


def test_a_claim_short_by_less_than_the_envelopes_slack_is_charged_by_the_wall(ev):
    r = ev.evaluate(MATMUL, SHORTENED, config=CONFIG)
    assert r.status == "correct", (r.status, r.error)
    wall = r.correctness["envelope"]["probe"]
    assert wall and wall["mode"] == "wall" and wall["counted"] and wall["charged_ms"] > 0.6, _shown(
        wall, r.runtime_ms, r.correctness["envelope"].get("excess_ms"))
    assert r.speedup < 1.05, _shown(wall, r.speedup, r.correctness["envelope"]["excess_ms"])
