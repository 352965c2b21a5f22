"""Outputs through a device buffer the judge owns (worker/device_payload.py, ``KB_GYM_DEVICE_PAYLOAD=1``).

Run on the device machine by scripts/gpu_check.sh; skipped elsewhere (tests/conftest.py). Written in session 27
with no device time left: the first GPU run decides whether the path stays.
"""

from __future__ import annotations

import pytest

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.problems import reference_as_candidate

pytestmark = pytest.mark.gpu

CONFIG = EvalConfig(trials=3, timing_min_reps=3, timing_max_reps=10, timing_warmup=1, integrity="off")

# 256 MB of outputs: over the premap floor (64 MB), so that the evaluator learns the size and sizes the buffers of the
# runners it starts next
LARGE = Problem(id=5, name="5_AddOneLarge", level=1, code='''import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x + 1
def get_inputs():
    return [torch.randn(8192, 8192)]
def get_init_inputs():
    return []
''')

# After each forward, the runner's view of the judge's buffer is written over (the buffer is reached through the
# runner's own module: its send_tensors closure holds it): too late for the outputs already committed
SCRIBBLE = reference_as_candidate(LARGE).replace("        return x + 1", """        out = x + 1
        import gc
        for o in gc.get_objects():
            if type(o).__name__ == "DeviceBuffer":
                o.bytes(o.size).fill_(7)
        return out""")


@pytest.fixture(scope="module")
def ev(monkeypatch_module):
    with Evaluator("cuda:0", results_path=False, baseline_cache=False) as e:
        yield e


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    mp.setenv("KB_GYM_DEVICE_PAYLOAD", "1")
    yield mp
    mp.undo()


def test_large_outputs_cross_through_the_device_buffer_once_the_size_is_known(ev):
    results = [ev.evaluate(LARGE, reference_as_candidate(LARGE), config=CONFIG) for _ in range(4)]
    assert all(r.status == "correct" for r in results), [(r.status, r.error) for r in results]
    assert results[0].worker["device_payloads"] == 0
    assert any(r.worker["device_payloads"] >= 3 for r in results[2:]), [r.worker for r in results]
    assert all(0.97 < r.speedup < 1.03 for r in results), [r.speedup for r in results]


def test_a_runner_that_writes_into_the_buffer_after_its_copy_costs_only_its_own_verdict(ev):
    for _ in range(2):  # the size learnt: the next runners get buffers
        ev.evaluate(LARGE, reference_as_candidate(LARGE), config=CONFIG)
    r = ev.evaluate(LARGE, SCRIBBLE, config=CONFIG)
    assert r.status in ("correct", "incorrect"), (r.status, r.error)
    if r.status == "incorrect":
        assert "tampering" in r.flags, (r.flags, r.error)
    honest = ev.evaluate(LARGE, reference_as_candidate(LARGE), config=CONFIG)
    assert honest.status == "correct" and "tampering" not in honest.flags, honest.error
