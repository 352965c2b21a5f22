"""Triton's kept kernels on a real GPU (kb_gym/worker/triton_cache.py, KB_GYM_TRITON_CACHE=1): a Triton candidate
evaluated twice loads its kernels from what the first runner compiled, and is judged the same.

Run on the device machine by scripts/gpu_check.sh; skipped elsewhere (tests/conftest.py).
"""

from __future__ import annotations

import pytest

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.worker import triton_cache

pytestmark = pytest.mark.gpu

RELU = Problem(id=1, name="1_ReLU_triton_cache", level=1, code='''import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(4096, 4096)]
def get_init_inputs():
    return []
''')

TRITON_RELU = '''import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def relu_k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=m), 0.0), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        relu_k[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
'''

CONFIG = EvalConfig(trials=2, timing_min_reps=5, timing_max_reps=20, timing_warmup=2)


def test_a_triton_candidate_evaluated_again_loads_its_kept_kernels(tmp_path):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(triton_cache.ENV, "1")  # the judges read it: set before they start
        mp.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path / "extensions"))
        with Evaluator("cuda:0", results_path=False, baseline_cache=False) as ev:
            first = ev.evaluate(RELU, TRITON_RELU, config=CONFIG)
            second = ev.evaluate(RELU, TRITON_RELU, config=CONFIG)
    for r in (first, second):
        assert r.status == "correct" and r.custom_kernel_launches, (r.status, r.error, r.custom_kernel_launches)
    assert first.worker["triton_cached"] == 0 and second.worker["triton_cached"] > 0, (first.worker, second.worker)
    # the first call compiled the kernel and Triton's launcher; the second loaded both
    cand = [r.correctness["seconds"]["candidate"] for r in (first, second)]
    assert cand[1] < cand[0], cand
    assert 0.9 < second.speedup / first.speedup < 1.1, (first.speedup, second.speedup)
