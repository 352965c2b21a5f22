"""The cost model's estimate of a problem's eager time, traced on meta tensors (problems/eager_trace.py)."""

from __future__ import annotations

import pytest

from kb_gym.problems import get_problem, load_problems
from kb_gym.problems.cost_model import FP32_FLOPS_PER_S, HBM_BYTES_PER_S, LAUNCH_S
from kb_gym.problems.eager_trace import estimate


@pytest.fixture(scope="module")
def gpu_builtin():
    return load_problems("builtin", size="gpu")


def test_a_matmul_is_priced_by_its_flops_and_an_elementwise_op_by_its_bytes(gpu_builtin):
    mm = estimate(get_problem(gpu_builtin, name="level1/9_SquareMatmul"))
    assert mm.launches == 1 and mm.gflop == pytest.approx(2 * 4096**3 / 1e9)
    assert mm.ms == pytest.approx(1e3 * (2 * 4096**3 / FP32_FLOPS_PER_S + LAUNCH_S))
    relu = estimate(get_problem(gpu_builtin, name="level1/1_ReLU"))
    moved = 2 * 16384 * 32768 * 4  # read once, written once
    assert relu.traffic_gb == pytest.approx(moved / 1e9) and relu.gflop == 0
    assert relu.ms == pytest.approx(1e3 * (moved / HBM_BYTES_PER_S + LAUNCH_S))
    assert relu.output_shapes == [(16384, 32768)]


def test_every_builtin_problem_at_gpu_size_is_traced_and_fits_in_memory(gpu_builtin):
    """Estimates, not measurements (scripts/problem_times.py --measure on a GPU): every problem traces on
    meta tensors, none needs more than ~9 GB, and the estimates sit near the 1-15 ms the sizes aim for."""
    estimates = {p.key: estimate(p) for p in gpu_builtin}
    assert len(estimates) == len(gpu_builtin) >= 92
    assert max(e.memory_gb for e in estimates.values()) < 9
    inside = [k for k, e in estimates.items() if 1 <= e.ms <= 15]
    assert len(inside) >= 0.9 * len(estimates), sorted(set(estimates) - set(inside))


def test_no_builtin_problem_at_gpu_size_is_bound_by_launching_its_kernels(gpu_builtin):
    """At GPU size a problem's time is the GPU's, not Python's: at ~10 us of host time per eager op, launching
    takes at most a third of the estimated time. A sequential scan written as a Python loop (the LSTM, the
    Mamba scan) took as long to launch as to run at 64-256 steps, and a reference copy of the LSTM measured
    0.76-1.25x against itself on the H200 (the judge's and the runner's host speeds differ); its GPU size now
    has fewer, larger steps."""
    bound = {p.key: round(e.launches * 10e-3 / e.ms, 2) for p in gpu_builtin if (e := estimate(p)).ms > 0}
    assert max(bound.values()) <= 1 / 3, sorted(bound.items(), key=lambda kv: -kv[1])[:3]
