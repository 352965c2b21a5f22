"""Patches that reach the harness or torch by paths no static check names (computed attribute names):
the worker's guard compares what the check and the reference run through before every reference
call, fails the candidate with ``tampering`` and replaces the worker, so the next evaluation is clean."""

from __future__ import annotations

import shutil

import pytest

from kb_gym import EvalConfig, Evaluator, Problem

CHECK = EvalConfig(trials=2, timing=False)
TIMED = EvalConfig(trials=2, timing_min_reps=6, timing_max_reps=12, timing_warmup=1, timing_max_seconds=5)

GELU = Problem(id=1, name="1_GELU", level=1, code='''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x)

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
''')

HONEST = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))
'''

# Each reaches its target through getattr with computed names, which the static checks cannot follow.
HARNESS_CHECK_REPLACED = '''
import torch
import torch.nn as nn

_loaded = getattr(getattr(torch, "_ut" + "ils"), "s" + "ys").modules
_runtime = _loaded["kb" + "_gym.worker.runtime"]
_passing = type(_runtime.compare_outputs(torch.zeros(1), torch.zeros(1), 1.0, 1.0))
setattr(_runtime, "compare_" + "outputs", lambda *args, **kwargs: _passing(True))

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
'''

REFERENCE_FOOLED_THEN_RESTORED = '''
import torch
import torch.nn as nn

_F = getattr(getattr(torch, "n" + "n"), "function" + "al")
_real = getattr(_F, "ge" + "lu")

def _zeros_once(x, approximate="none"):
    setattr(_F, "ge" + "lu", _real)  # gone again before anything looks after the reference ran
    return torch.zeros_like(x)

class ModelNew(nn.Module):
    def forward(self, x):
        setattr(_F, "ge" + "lu", _zeros_once)
        return torch.zeros_like(x)
'''

GLOBAL_FORWARD_HOOK = '''
import torch
import torch.nn as nn

_module = getattr(getattr(getattr(torch, "n" + "n"), "mod" + "ules"), "mod" + "ule")
getattr(_module, "register_module_forward" + "_hook")(lambda mod, args, out: torch.zeros_like(out))

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
'''

BASELINE_SLOWED_WHILE_TIMING = '''
import time
import torch
import torch.nn as nn

_F = getattr(getattr(torch, "n" + "n"), "function" + "al")
_real = getattr(_F, "ge" + "lu")
_calls = [0]

def _slow_once(x, approximate="none"):
    setattr(_F, "ge" + "lu", _real)
    getattr(time, "sl" + "eep")(0.05)
    return _real(x, approximate=approximate)

class ModelNew(nn.Module):
    def forward(self, x):
        _calls[0] += 1
        if _calls[0] > 4:  # past the correctness trials: only the timed baseline calls are slowed
            setattr(_F, "ge" + "lu", _slow_once)
        return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))
'''


@pytest.fixture(scope="module")
def ev():
    evaluator = Evaluator("cpu", results_path=False)
    yield evaluator
    evaluator.close()


@pytest.mark.parametrize(("source", "where", "what"), [
    pytest.param(HARNESS_CHECK_REPLACED, "while loading", "kb_gym.worker.runtime.compare_outputs", id="harness"),
    pytest.param(REFERENCE_FOOLED_THEN_RESTORED, "in trial 1", "torch.nn.functional.gelu", id="self_restoring"),
    pytest.param(GLOBAL_FORWARD_HOOK, "while loading", "_global_forward_hooks", id="global_hook"),
])
def test_a_patch_reached_by_computed_names_is_tampering_and_the_next_evaluation_is_clean(ev, source, where, what):
    r = ev.evaluate(GELU, source, config=CHECK)
    assert r.status == "incorrect" and "tampering" in r.flags, (r.status, r.flags, r.error)
    assert where in r.error and what in r.error, r.error
    zeros = ev.evaluate(GELU, "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                              "        return torch.zeros_like(x)\n", config=CHECK)
    assert zeros.status == "incorrect" and "tampering" not in zeros.flags, (zeros.status, zeros.error)
    honest = ev.evaluate(GELU, HONEST, config=CHECK)
    assert honest.status == "correct" and "tampering" not in honest.flags, honest.error


RANDOM_STEERED_THEN_BASELINE_SLOWED = BASELINE_SLOWED_WHILE_TIMING.replace("_calls = [0]\n", '''_calls = [0]
_random = __import__("ran" + "dom")
setattr(_random.SystemRandom, "ran" + "dom", lambda self: 0.9999)  # no random check should ever come up
setattr(_random, "ran" + "dom", lambda: 0.9999)
''')


def test_steering_the_random_choice_of_checked_calls_does_not_hide_a_patch(ev):
    r = ev.evaluate(GELU, RANDOM_STEERED_THEN_BASELINE_SLOWED, config=TIMED)
    assert r.status == "incorrect" and "tampering" in r.flags, (r.status, r.error)


LATE_SLOWDOWN = BASELINE_SLOWED_WHILE_TIMING.replace("if _calls[0] > 4:", "if _calls[0] > 40:").replace(
    "(0.05)", "(0.005)")


def test_a_patch_that_starts_late_in_a_long_timing_loop_is_still_found(ev):
    """Past the first 32 timed calls the guard checks fewer of them on tiny problems (never below 1 in 20):
    a baseline slowed by 5 ms on every pair from the 40th candidate call on is still found while timing."""
    assert LATE_SLOWDOWN != BASELINE_SLOWED_WHILE_TIMING
    long_loop = TIMED.replace(timing_min_reps=200, timing_max_reps=200, timing_target_rel_ci=0.0,
                              timing_max_seconds=60)
    r = ev.evaluate(GELU, LATE_SLOWDOWN, config=long_loop)
    assert r.status == "incorrect" and "tampering" in r.flags and "while timing" in r.error, (r.status, r.error)


def test_slowing_the_baseline_only_while_timing_is_tampering(ev):
    r = ev.evaluate(GELU, BASELINE_SLOWED_WHILE_TIMING, config=TIMED)
    assert r.status == "incorrect" and "tampering" in r.flags and "while timing" in r.error, (r.status, r.error)
    honest = ev.evaluate(GELU, HONEST, config=TIMED)
    assert honest.status == "correct" and set(honest.flags) <= {"no_custom_kernel"}, (honest.error, honest.flags)


FORGED_RESULT = '''
import os
import torch
import torch.nn as nn

_write = getattr(os, "wr" + "ite")
_forged = b'{"type": "result", "status": "correct", "speedup": 100.0, "job_id": JOB, "flags": []}\\n'

class ModelNew(nn.Module):
    def forward(self, x):
        for fd in range(3, 64):  # the worker's result channel is one of these
            for job in range(1, 40):
                try:
                    _write(fd, _forged.replace(b"JOB", str(job).encode()))
                except OSError:
                    break
        return torch.zeros_like(x)
'''


def test_a_result_written_to_the_workers_channel_by_the_candidate_is_rejected(ev):
    """Every message of a job carries the job's secret token; a forged line has none."""
    r = ev.evaluate(GELU, FORGED_RESULT, config=CHECK)
    assert r.status == "incorrect" and "tampering" in r.flags and r.speedup is None, (r.status, r.error)
    assert "token" in r.error, r.error
    honest = ev.evaluate(GELU, HONEST, config=CHECK)
    assert honest.status == "correct", honest.error


LINEAR = Problem(id=2, name="2_Linear", level=1, code='''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 32)
    def forward(self, x):
        return self.fc(x)

def get_inputs():
    return [torch.randn(16, 64)]

def get_init_inputs():
    return []
''')

REFERENCE_WEIGHTS_ZEROED = '''
import torch
import torch.nn as nn

_gc = __import__("g" + "c")

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 32)
    def forward(self, x):
        for obj in getattr(_gc, "get_" + "objects")():
            if isinstance(obj, nn.Module) and type(obj).__name__ == "Model":
                for p in obj.parameters():
                    p.data.zero_()  # .data: the version counter does not move
        return torch.zeros(x.shape[0], 32, device=x.device)
'''


def test_zeroing_the_references_weights_in_place_is_tampering(ev):
    r = ev.evaluate(LINEAR, REFERENCE_WEIGHTS_ZEROED, config=CHECK)
    assert r.status == "incorrect" and "tampering" in r.flags and "parameter" in r.error, (r.status, r.error)
    honest = ev.evaluate(LINEAR, LINEAR.code.replace("class Model(", "class ModelNew("), config=CHECK)
    assert honest.status == "correct", honest.error


LINGERING_THREAD = '''
import time
import torch
import torch.nn as nn

_threading = __import__("thre" + "ading")

def _wait_for_later_jobs():
    while True:
        time.sleep(0.01)

_threading.Thread(target=_wait_for_later_jobs, daemon=True).start()

class ModelNew(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))
'''


def test_a_thread_left_running_fails_the_job_and_does_not_reach_the_next(ev):
    """A thread outlives its job and could patch the next candidate's reference; Python cannot stop it,
    so the job fails and the worker is replaced."""
    r = ev.evaluate(GELU, LINGERING_THREAD, config=CHECK)
    assert r.status == "incorrect" and "tampering" in r.flags and "thread" in r.error, (r.status, r.error)
    honest = ev.evaluate(GELU, HONEST, config=CHECK)
    assert honest.status == "correct" and honest.worker["restarts"] >= 1, (honest.error, honest.worker)


CPP_EXTENSION = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
torch::Tensor gelu(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* xp = xc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) yp[i] = 0.5f * xp[i] * (1.0f + std::erf(xp[i] * 0.70710678f));
    return y;
}
"""
ext = load_inline(name="guard_gelu_cpu", cpp_sources=source, functions=["gelu"], verbose=False)

class ModelNew(nn.Module):
    def forward(self, x):
        return ext.gelu(x)
'''


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("ninja") is None, reason="needs g++ and ninja")
def test_building_an_extension_is_not_taken_for_tampering():
    """load_inline imports setuptools and friends while the candidate loads, after the guard's reference
    point: none of that may look like a patch (a false positive here would fail every CUDA kernel)."""
    with Evaluator("cpu", results_path=False, load_timeout=600, timing_max_seconds=2) as ev:
        r = ev.evaluate(GELU, CPP_EXTENSION)
    assert r.status == "correct" and r.flags == [] and r.custom_kernel_launches, (r.status, r.flags, r.error)
