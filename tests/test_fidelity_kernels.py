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


def test_a_row_keeps_each_repeats_probe_check_where_the_probe_ran():
    """A problem's first probe pass runs the spare's calls and later ones reuse them, so the row keeps each repeat's
    probe stage and pass split (a median of two would be neither); rows without a probe reading carry none."""
    from types import SimpleNamespace

    from kb_gym.fidelity import _row, format_row

    def result(probe_s: float, probe: dict | None, after_s: float = 0.0) -> SimpleNamespace:
        return SimpleNamespace(status="correct", flags=[], error=None, runtime_ms=0.5, ref_runtime_ms=1.0,
                               speedup=2.0, timing_reps=10, correctness={"envelope": {"probe": probe}},
                               stage_seconds={"probe_check": probe_s, "timing": 2.0, "probe_after_exit": after_s})

    bare = {"cand_events_ms": 0.5, "ref_events_ms": 1.0, "cand_kb_events_ms": 0.6, "cand_graph_ms": None}
    fresh = {"spare": 0.9, "candidate": 0.2, "checks": 0.1, "pass": 1.3, "after_exit": 0.3}
    reused = {"candidate": 0.2, "checks": 0.1, "pass": 0.35}
    first = {"seconds": fresh, "harness_ms": 0.6, "after_exit_share_ms": 0.612}  # read again after its exit
    row = _row(CASES[0], "default", [(result(1.31, first, 0.3), 3.0), (result(0.36, {"seconds": reused}), 2.0)],
               bare)
    assert row["probe_check_s"] == [1.31, 0.36] and row["probe_pass_s"] == [fresh, reused]
    assert row["probe_after_exit_s"] == [0.3, 0.0] and row["probe_after_exit_drift_ms"] == [pytest.approx(0.012), None]
    assert format_row(row).endswith("probe_check_s 1.31/0.36")
    plain = _row(CASES[0], "default", [(result(0.0, None), 2.0)], bare)
    assert "probe_check_s" not in plain and "probe_check_s" not in format_row(plain)


def test_the_probe_cost_script_compares_own_time_per_case_without_the_load(tmp_path):
    """`gpu_check.sh probecost`: per case the wall less its load stage without and with the probe, and the totals
    against the 1.5x budget."""
    import importlib.util
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "probe_cost.py"
    spec = importlib.util.spec_from_file_location("probe_cost", script)
    probe_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe_cost)
    off = {"rows": [{"case": "a", "preset": "default", "wall_s": 12.0, "stage_seconds": {"load": 10.0}},
                    {"case": "b", "preset": "default", "wall_s": 1.0, "stage_seconds": {}}]}
    on = {"rows": [{"case": "a", "preset": "default", "wall_s": 13.0, "stage_seconds": {"load": 10.0},
                    "probe_check_s": [1.5, 0.5], "probe_pass_s": [{"spare": 1.0, "pass": 1.4}, {"pass": 0.4}],
                    "probe_after_exit_s": [0.3, 0.0], "probe_after_exit_drift_ms": [0.012, None]},
                   {"case": "b", "preset": "default", "wall_s": 1.2, "stage_seconds": {}},
                   {"case": "only_on", "preset": "default", "wall_s": 5.0, "stage_seconds": {}}]}
    lines, totals = probe_cost.compare(off, on)
    assert totals["off_s"] == 3.0 and totals["on_s"] == pytest.approx(4.2)
    assert totals["ratio"] == pytest.approx(1.4) and totals["median_ratio"] == pytest.approx((1.5 + 1.2) / 2)
    assert lines[0].startswith("a ") and "probe_check 1.50/0.50" in lines[0] and "spare 1.00/pass 1.40" in lines[0]
    assert "after_exit 0.30/0.00 (share drift ms +0.0120/-)" in lines[0]
    assert len(lines) == 3 and "budget x1.5" in lines[-1]
    (tmp_path / "off.json").write_text(json.dumps(off))
    (tmp_path / "on.json").write_text(json.dumps(on))
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "off.json"), str(tmp_path / "on.json")],
                         capture_output=True, text=True, check=True).stdout
    assert "sum over 2 cases" in out
