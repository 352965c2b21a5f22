"""Triton's launchers built by the judges (kb_gym/worker/triton_launchers.py) on a real GPU: a Triton candidate's
runner builds the launcher its kernel's argument kinds need; the judge builds it too, in the background, for the
runners after it; a second candidate, another kernel with arguments of the same kinds, finds it in its cache and is
judged as the first. Skipped where Triton builds no launcher per signature (3.7 on).

Run on the device machine by scripts/gpu_check.sh; skipped elsewhere (tests/conftest.py).
"""

from __future__ import annotations

import time

import pytest
from test_gpu_probe_check import RELU, TRITON_RELU  # a 4096 x 4096 ReLU and a Triton kernel for it

from kb_gym import EvalConfig, Evaluator
from kb_gym.worker import triton_launchers

pytestmark = pytest.mark.gpu

CONFIG = EvalConfig(trials=2, timing_min_reps=5, timing_max_reps=20, timing_warmup=2)
# another kernel (a clamp at zero written otherwise), its arguments of the same kinds: pointer, pointer, i32, constexpr
OTHER_RELU = TRITON_RELU.replace("tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0)",
                                 "tl.where(tl.load(x_ptr + offs, mask=mask) > 0, tl.load(x_ptr + offs, mask=mask), 0.0)")


def test_a_launcher_the_judge_built_serves_the_next_candidate_of_the_same_argument_kinds(tmp_path):
    if triton_launchers._driver() is None:
        pytest.skip("this Triton builds no launcher per signature")
    assert OTHER_RELU != TRITON_RELU
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path / "extensions"))
        mp.setenv(triton_launchers.ENV, "1")  # the judges read it: set before they start
        with Evaluator("cuda:0", results_path=False, baseline_cache=False) as ev:
            first = ev.evaluate(RELU, TRITON_RELU, config=CONFIG)
            root = triton_launchers.store_root()
            deadline = time.monotonic() + 120
            while not list((root / triton_launchers.READY).glob("*.json")) and time.monotonic() < deadline:
                time.sleep(0.5)  # the builder runs in the background
            built = sorted(p.name for p in (root / triton_launchers.READY).glob("*.json"))
            second = ev.evaluate(RELU, OTHER_RELU, config=CONFIG)
    log = (root / "build.log").read_text() if (root / "build.log").exists() else ""
    for r in (first, second):
        assert r.status == "correct" and r.custom_kernel_launches, (r.status, r.error, r.custom_kernel_launches)
    assert first.worker["landlock"], "launchers are shared between confined runners only"
    assert first.worker["triton_launchers"]["misses"] >= 1, first.worker["triton_launchers"]
    assert built, log
    launched = second.worker["triton_launchers"]
    assert launched["seeded"] >= 1 and launched["hits"] >= 1 and launched["misses"] == 0, (launched, log)
    cand = [r.correctness["seconds"]["candidate"] for r in (first, second)]
    print(f"launchers: first {first.worker['triton_launchers']} candidate {cand[0]:.2f} s; "
          f"second {launched} candidate {cand[1]:.2f} s")
