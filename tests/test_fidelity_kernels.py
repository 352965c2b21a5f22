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


def test_a_preset_row_reports_its_wall_and_speedup_spread_and_the_summary_compares_presets():
    """`kb-gym bench --fidelity --presets default,rl`: per kernel and preset the median wall per evaluation and
    the spread of the speedup over the repeats, then one line per preset."""
    from types import SimpleNamespace

    from kb_gym.fidelity import _row, format_fidelity

    def result(speedup: float) -> SimpleNamespace:
        return SimpleNamespace(status="correct", flags=[], error=None, runtime_ms=1.0 / speedup, ref_runtime_ms=1.0,
                               speedup=speedup, timing_reps=10, correctness={},
                               stage_seconds={"load": 1.0, "timing": 2.0})

    bare = {"cand_events_ms": 0.5, "ref_events_ms": 1.0, "cand_kb_events_ms": 0.6, "cand_graph_ms": None}
    rows = [_row(CASES[0], "default", [(result(s), w) for s, w in ((2.0, 4.0), (1.9, 5.0), (2.1, 6.0))], bare),
            _row(CASES[0], "rl", [(result(s), w) for s, w in ((1.8, 1.0), (2.2, 2.0), (2.0, 9.0))], bare)]
    assert rows[0]["wall_s"] == 5.0 and rows[1]["wall_s"] == 2.0
    assert rows[0]["speedup_spread"] == pytest.approx(0.2 / 2.0) and rows[1]["speedup_spread"] == pytest.approx(0.2)
    assert rows[1]["speedup_ratio"] == pytest.approx(2.0 / 2.0)  # the last evaluation against the bare speedup
    text = format_fidelity({"rows": rows, "presets": ["default", "rl"], "repeats": 3})
    assert rows[0]["stage_seconds"] == {"load": 1.0, "timing": 2.0}  # where the wall goes
    assert "preset rl: median wall 2.00s per evaluation, speedup spread over 3 repeats: median 0.200" in text
