"""A judge lets go of a job's tensors when the job ends, whatever its verdict.

On an H100 batch (docs/benchmarks.md 1p) the job after a ``raises`` candidate of a GPU-size problem began with that
problem's tensors still held by its judge: 12 GiB after a 23_Softmax, 14 GiB after a 36_RMSNorm_, held through the
whole next job beside its own. The failure kept for the verdict held its traceback, whose frames held the trial's
tensors, and the frame of ``run_job`` held the failure: a cycle the judge's own collection at clean-up ran too
early to free (the frame was still live), left to the next job's.
"""

from __future__ import annotations

import builtins

import pytest

from kb_gym.config import EvalConfig
from kb_gym.worker import job as job_module

PROBLEM = """
import builtins, weakref
import torch
import torch.nn as nn

def _watch(t):  # in the judge; a runner, another process, has no list to fill
    getattr(builtins, "_kb_job_release_refs", []).append(weakref.ref(t))

class Model(nn.Module):
    def forward(self, x):
        out = x * 2.0
        _watch(out)
        return out

def get_inputs():
    x = torch.randn(64, 64)
    _watch(x)
    return [x]

def get_init_inputs():
    return []
"""

RAISES = PROBLEM.replace("class Model(", "class ModelNew(").replace(
    "        out = x * 2.0\n", "        raise RuntimeError('this kernel is not written yet')\n        out = x\n")
COPY = PROBLEM.replace("class Model(", "class ModelNew(")
WRONG = PROBLEM.replace("class Model(", "class ModelNew(").replace("out = x * 2.0", "out = x * 3.0")


@pytest.fixture()
def judge(tmp_path):
    ctx = job_module.WorkerContext("cpu", tmp_path, send=lambda message: None)
    builtins._kb_job_release_refs = []
    yield ctx
    del builtins._kb_job_release_refs
    if ctx.pool is not None:
        ctx.pool.close()


@pytest.mark.parametrize("source,status,timing", [(RAISES, "runtime_error", False), (WRONG, "incorrect", False),
                                                  (COPY, "correct", True)])
def test_a_jobs_tensors_are_gone_when_the_job_returns(judge, source, status, timing):
    cfg = EvalConfig(timing=timing, trials=2).to_dict()
    job = {"job_id": 1, "problem_code": PROBLEM, "problem_key": "release", "source": source, "seed": 5,
           "config": cfg}
    result = job_module.run_job(judge, job)
    assert result["status"] == status, result
    refs = builtins._kb_job_release_refs
    assert refs, "the reference made no tensor: the test reads nothing"
    # no collection here: what a cycle holds stays until the next one, which is the next job's (job._cleanup)
    alive = [r() for r in refs if r() is not None]
    assert not alive, f"{len(alive)} of the job's {len(refs)} tensors outlived it"
