"""The fidelity benchmark's own kernels (kb_gym/bench_kernels/fidelity) are honest: correct, with their own
launches and no flags, at a CPU size (Triton's interpreter). CUDA ones need nvcc and a GPU."""

from __future__ import annotations

import re

import pytest

from kb_gym import Evaluator, Problem
from kb_gym.fidelity import CASES, KERNELS

CPU_SIZES = {"M, K, N = 4096, 4096, 4096": "M, K, N = 70, 96, 80",
             "BATCH, C_IN, C_OUT, SIZE = 32, 64, 128, 128": "BATCH, C_IN, C_OUT, SIZE = 2, 3, 5, 12"}
TRITON_CASES = [c for c in CASES if "cuda" not in c.kernel]


def cpu_sized(code: str) -> str:
    for big, small in CPU_SIZES.items():
        code = code.replace(big, small)
    return re.sub(r"torch\.randn\(\d+, \d+\)", "torch.randn(48, 96)", code)


@pytest.fixture(scope="module")
def ev():
    with Evaluator("cpu", results_path=False, baseline_cache=False, timing=False, trials=2) as e:
        yield e


@pytest.mark.parametrize("case", TRITON_CASES, ids=[c.name for c in TRITON_CASES])
def test_fidelity_kernels_are_honest_at_a_cpu_size(ev, case):
    problem = Problem(id=1, name=case.problem.name, level=case.problem.level, code=cpu_sized(case.problem.code))
    r = ev.evaluate(problem, (KERNELS / case.kernel).read_text())
    assert r.status == "correct", (case.name, r.error)
    assert r.flags == [] and r.custom_kernel_launches, (case.name, r.flags)
