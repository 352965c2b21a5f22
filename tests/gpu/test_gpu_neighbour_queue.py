"""GPU work a neighbour queued before its stop, on a real GPU (kb_gym/worker/gpu_activity.py, neighbours.py).

With two workers on one device a candidate loads while its sibling is measured, and its runner is stopped for the
measurement; but a stop reaches host threads only, and kernels it queued before run on through the sibling's timing
(docs/integrity.md, the loading neighbour's GPU work). The judge reads NVML's per-process samples while its runner is
stopped, and kills a runner whose work ran on past the stop's grace: its verdict is that, its queue dies with its
context. The control (``KB_GYM_GPU_OWNER_CHECK=0``) shows the same neighbour left alive without the reading.

Run on the device machine by scripts/gpu_check.sh; skipped elsewhere (tests/conftest.py).
"""

from __future__ import annotations

import re

import pytest

from kb_gym import EvalConfig, Evaluator, get_problem, load_problems

pytestmark = pytest.mark.gpu

# Long timing stages, so that the sibling's measurement comes while the neighbour sleeps in its import; integrity="off":
# the neighbour's import would not pass the static checks
CONFIG = EvalConfig(trials=2, timing_warmup=3, timing_min_reps=200, timing_max_reps=200, integrity="off")
HONEST = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
# ~500 fp32 8192^3 matmuls (~20 ms each on an H100) queued in its import, under the launch queue's depth so that the
# host does not wait for them, then a sleep through its siblings' measurements
QUEUER = '''
import time, torch
_x = torch.randn(8192, 8192, device="cuda") / 90.0
for _ in range(500):
    _x = torch.tanh(_x @ _x)
time.sleep(15)
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
'''


def _beside_siblings(n: int = 2):
    relu = get_problem(load_problems("builtin"), name="level1/1_ReLU")
    with Evaluator("cuda", config=CONFIG, results_path=False, workers_per_device=2) as ev:
        ev.warm()
        first = ev.submit(relu, QUEUER)
        siblings = [ev.submit(relu, HONEST) for _ in range(n)]
        return first.result(), [s.result() for s in siblings]


def test_a_neighbour_whose_queued_gpu_work_runs_through_a_measurement_is_killed():
    queuer, siblings = _beside_siblings()
    print("queuer:", queuer.status, queuer.error[:300], queuer.worker.get("neighbour_gpu_check"), queuer.stage_seconds)
    for s in siblings:
        print("sibling:", s.status, s.flags, s.speedup, s.stage_seconds.get("neighbour_pause_wait"))
    assert queuer.worker.get("neighbour_gpu_check") == "on", queuer.worker
    assert queuer.status == "runtime_error" and "GPU work ran on" in queuer.error, (queuer.status, queuer.error)
    # killed within the grace (0.25 s), one sample period (at most 1 s) and the watcher's look (0.1 s) of the stop,
    # with room for a busy host: what a saboteur's queue still runs beside a measurement
    late = float(re.search(r"ran on ([0-9.]+) s", queuer.error).group(1))
    assert late < 2.5, queuer.error
    assert [s.status for s in siblings] == ["correct"] * len(siblings), [s.error for s in siblings]


def test_without_the_reading_the_same_neighbour_lives(monkeypatch):
    monkeypatch.setenv("KB_GYM_GPU_OWNER_CHECK", "0")
    queuer, siblings = _beside_siblings(1)
    print("queuer:", queuer.status, queuer.worker.get("neighbour_gpu_check"), queuer.stage_seconds)
    print("sibling:", siblings[0].status, siblings[0].flags, siblings[0].speedup)
    assert queuer.worker.get("neighbour_gpu_check") == "off"
    assert queuer.status == "correct", (queuer.status, queuer.error)


def test_nvml_names_this_process_by_its_pid_and_gives_a_sample_period():
    import torch

    from kb_gym.worker.gpu_activity import GpuActivity, NvmlSource

    reading, note = GpuActivity.open(torch.device("cuda:0"))
    raw = NvmlSource(torch.device("cuda:0")).period_s()
    print("NVML:", note, "period read", raw, "used", reading.period_s if reading else None)
    assert note == "on" and reading is not None
