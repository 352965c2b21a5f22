"""Triton's kept kernels on a real GPU (kb_gym/worker/triton_cache.py, KB_GYM_TRITON_CACHE=1): a Triton candidate
evaluated twice loads its kernels from what the first runner compiled, and is judged the same.

Run on the device machine by scripts/gpu_check.sh; skipped elsewhere (tests/conftest.py).
"""

from __future__ import annotations

import pytest
from test_gpu_probe_check import RELU, TRITON_RELU  # a 4096 x 4096 ReLU and a Triton kernel for it

from kb_gym import EvalConfig, Evaluator
from kb_gym.worker import triton_cache

pytestmark = pytest.mark.gpu

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
