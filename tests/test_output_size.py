"""A problem's output bytes before its first evaluation (worker/output_size.py), and what the judge does with them:
the runner's memfd mapped for them while it prepares, outside the device lock, not in the first copy."""

from __future__ import annotations

import signal
import sys
import threading
import time

import pytest
import torch

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.problems import reference_as_candidate
from kb_gym.worker import output_size
from kb_gym.worker.loading import load_source
from kb_gym.worker.payload import PREMAP_MIN_BYTES

TWO_OUTPUTS = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, 2 * n)
        self.bn = nn.BatchNorm1d(2 * n)

    def forward(self, x, k):
        y = self.bn(self.lin(x))
        return y.relu(), y.sum(dim=1, keepdim=True).long() + k

def get_inputs():
    return [torch.randn(8, 16), 3]

def get_init_inputs():
    return [16]
'''


def _module(code: str, name: str):
    return load_source(code, f"kb_test_output_size_{name}")


def test_the_meta_forward_gives_the_outputs_bytes_in_the_jobs_precision():
    module = _module(TWO_OUTPUTS, "two")
    # fp32: 8 x 32 floats and 8 x 1 int64; fp16 halves the floating output only (integer outputs keep their dtype)
    assert output_size.predicted_output_bytes(module, torch.float32) == 8 * 32 * 4 + 8 * 8
    assert output_size.predicted_output_bytes(module, torch.float16) == 8 * 32 * 2 + 8 * 8


def _forward_body(body: str) -> str:
    return ("import time\nimport torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
            f"    def forward(self, x):\n        {body}\n\n"
            "def get_inputs():\n    return [torch.randn(64, 64)]\n\ndef get_init_inputs():\n    return []\n")


@pytest.mark.parametrize("body", [
    "return x[x > 0]",  # data-dependent shape
    "return x * x.max().item()",  # a number read from the data
    "return x + torch.ones(64, 64, device='cpu')",  # a tensor made on a named device
    "raise RuntimeError('no')",
])
def test_what_the_meta_device_cannot_run_is_unknown(body):
    assert output_size.predicted_output_bytes(_module(_forward_body(body), "unknown"), torch.float32) == 0


def test_a_forward_past_its_budget_is_unknown_and_the_alarm_is_put_back():
    module = _module(_forward_body("time.sleep(10); return x"), "slow")
    before = signal.getsignal(signal.SIGALRM)
    started = time.monotonic()
    assert output_size.predicted_output_bytes(module, torch.float32, budget_s=0.2) == 0
    assert time.monotonic() - started < 2.0
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    quick = _module(_forward_body("return x.t()"), "quick")  # the next estimate is not cut by a stale timer
    assert output_size.predicted_output_bytes(quick, torch.float32, budget_s=0.2) == 64 * 64 * 4


def test_the_budget_never_ends_inside_an_import(tmp_path, monkeypatch):
    """A meta forward imports modules lazily; the budget's exception raised inside one left modules half made (on an
    H100, the judge's next use of torch's symbolic shapes: "module 'sympy' has no attribute 'printing'"). The import
    runs to its end; the budget ends the forward after it."""
    (tmp_path / "kb_slow_import.py").write_text(
        "import time\nfor _ in range(30):\n    time.sleep(0.01)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = _module(_forward_body("import kb_slow_import; time.sleep(10); return x"), "lazy_import")
    started = time.monotonic()
    assert output_size.predicted_output_bytes(module, torch.float32, budget_s=0.05) == 0
    assert time.monotonic() - started < 2.0
    imported = sys.modules.get("kb_slow_import")
    assert imported is not None and imported.DONE
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_off_the_main_thread_nothing_is_estimated():
    # the budget's timer interrupts only the main thread: elsewhere a slow forward could not be cut short
    module = _module(TWO_OUTPUTS, "thread")
    box: list[int] = []
    worker = threading.Thread(target=lambda: box.append(output_size.predicted_output_bytes(module, torch.float32)))
    worker.start()
    worker.join()
    assert box == [0]


# 4096 x 4160 float32: 68 MB of output, over the 64 MB from which the memfd is mapped before the device lock
BIG_RELU = Problem(id=19, name="19_ReLU_4096x4160", level=1, code='''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(4096, 4160)]

def get_init_inputs():
    return []
''')


def test_a_problems_first_evaluation_maps_the_memfd_while_it_prepares():
    out_bytes = 4096 * 4160 * 4
    assert out_bytes >= PREMAP_MIN_BYTES
    with Evaluator("cpu", results_path=False, baseline_cache=False) as ev:
        r = ev.evaluate(BIG_RELU, reference_as_candidate(BIG_RELU), config=EvalConfig(timing=False, trials=1))
    assert r.status == "correct", (r.status, r.error)
    assert r.worker["predicted_output_bytes"] == out_bytes == r.correctness["output_bytes"]
    assert r.worker["payload_premap_s"] > 0, r.worker  # mapped as the job prepared, outside the device lock
    assert r.worker["shm_payloads"] >= 1
