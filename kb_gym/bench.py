"""``kb-gym bench``: the evaluator's own numbers, for docs/benchmarks.md.

1. The reference submitted as its own candidate on official problems: every verdict must be
   ``correct`` and every speedup near 1 (the measurement's bias and noise in one number).
2. One candidate evaluated five times: the spread of its speedup.
3. Wall time per evaluation of a Triton candidate on a warm worker.
4. Our own Triton and CUDA (load_inline) kernels that beat eager PyTorch on an official problem.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from kb_gym.evaluator import Evaluator
from kb_gym.problems import get_problem, load_problems, reference_as_candidate

KERNELS = Path(__file__).resolve().parent / "bench_kernels"
SELF_CHECK = ["level1/19_ReLU", "level1/23_Softmax", "level1/30_Softsign", "level1/36_RMSNorm_",
              "level1/1_Square_matrix_multiplication_", "level2/1_Conv2D_ReLU_BiasAdd",
              "level2/12_Gemm_Multiply_LeakyReLU", "level2/40_Matmul_Scaling_ResidualAdd",
              "level2/76_Gemm_Add_ReLU", "level2/81_Gemm_Swish_Divide_Clamp_Tanh_Clamp"]
FAST_PROBLEM = "level1/30_Softsign"
FAST_KERNELS = {"triton": "softsign_triton.py", "cuda": "softsign_cuda.py"}


def _row(name: str, kind: str, r: Any, wall: float) -> dict[str, Any]:
    return {"problem": name, "candidate": kind, "status": r.status, "speedup": r.speedup,
            "speedup_ci": r.speedup_ci, "runtime_ms": r.runtime_ms, "ref_runtime_ms": r.ref_runtime_ms,
            "reps": r.timing_reps, "flags": r.flags, "wall_s": round(wall, 3), "error": (r.error or "")[:300],
            "stage_seconds": r.stage_seconds}


def run_bench(dataset: str = "official", device: str = "auto", out: str | None = None,
              repeats: int = 5, problems: list[str] | None = None) -> dict[str, Any]:
    all_problems = load_problems(dataset)
    report: dict[str, Any] = {"self_check": [], "repeat": {}, "fast": [], "device": device}
    with Evaluator(device, results_path=False) as ev:
        started = time.perf_counter()
        ev.warm()
        report["worker_start_s"] = time.perf_counter() - started
        for key in problems or SELF_CHECK:
            problem = get_problem(all_problems, name=key)
            t0 = time.perf_counter()
            r = ev.evaluate(problem, reference_as_candidate(problem))
            report["self_check"].append(_row(key, "reference", r, time.perf_counter() - t0))
            report["hardware"] = r.hardware
            _progress(report["self_check"][-1])
        fast = get_problem(all_problems, name=FAST_PROBLEM)
        for backend, file in FAST_KERNELS.items():
            source = (KERNELS / file).read_text()
            t0 = time.perf_counter()
            r = ev.evaluate(fast, source)
            report["fast"].append(_row(FAST_PROBLEM, backend, r, time.perf_counter() - t0))
            _progress(report["fast"][-1])
        source = (KERNELS / FAST_KERNELS["triton"]).read_text()
        walls, speedups = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = ev.evaluate(fast, source)
            walls.append(time.perf_counter() - t0)
            if r.speedup is not None:
                speedups.append(r.speedup)
        report["repeat"] = {"problem": FAST_PROBLEM, "candidate": "triton", "speedups": speedups,
                            "min": min(speedups, default=None), "max": max(speedups, default=None),
                            "stdev": statistics.stdev(speedups) if len(speedups) > 1 else None,
                            "wall_s": walls, "median_wall_s": statistics.median(walls)}
        report["small"] = _small_problem_walls(ev, repeats)
        report["workers"] = ev.worker_stats
    if out:
        Path(out).write_text(json.dumps(report, indent=1, default=str))
    return report


def _small_problem_walls(ev: Evaluator, repeats: int) -> dict[str, Any]:
    """Per-evaluation overhead on a tiny built-in problem: what an RL loop pays per sample."""
    from kb_gym.problems import BUILTIN_DIR

    problem = get_problem(load_problems("builtin", size="cpu"), name="level1/1_ReLU")
    source = (BUILTIN_DIR / "solutions" / "level1" / "1_ReLU.py").read_text()
    ev.evaluate(problem, source)  # Triton compiles this kernel once per worker
    walls, stages = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = ev.evaluate(problem, source)
        walls.append(time.perf_counter() - t0)
        stages.append(r.stage_seconds)
    return {"problem": problem.key, "status": r.status, "wall_s": walls, "median_wall_s": statistics.median(walls),
            "stage_seconds": stages[-1], "timing_reps": r.timing_reps}


def _progress(row: dict[str, Any]) -> None:
    sp = f"{row['speedup']:.3f}" if row["speedup"] else "-"
    print(f"  {row['problem']:<48} {row['candidate']:<10} {row['status']:<14} {sp:>7}  {row['wall_s']:.1f}s "
          f"{row['error'][:120]}", flush=True)


def format_report(report: dict[str, Any]) -> str:
    lines = [f"hardware: {report.get('hardware', {}).get('name', '?')}  worker start {report['worker_start_s']:.1f}s",
             "", f"{'problem':<48} {'candidate':<10} {'status':<9} {'speedup':>8} {'95% CI':>13} "
                 f"{'ref ms':>9} {'reps':>5} {'wall s':>7}"]
    for row in report["self_check"] + report["fast"]:
        ci = row["speedup_ci"]
        ci_text = f"{ci[0]:.3f}-{ci[1]:.3f}" if ci and None not in ci else "-"
        sp = f"{row['speedup']:.3f}" if row["speedup"] else "-"
        ref = f"{row['ref_runtime_ms']:.3f}" if row["ref_runtime_ms"] else "-"
        lines.append(f"{row['problem']:<48} {row['candidate']:<10} {row['status']:<9} {sp:>8} {ci_text:>13} "
                     f"{ref:>9} {row['reps']:>5} {row['wall_s']:>7.2f}")
    rep = report["repeat"]
    if rep.get("speedups"):
        lines += ["", f"repeat x{len(rep['speedups'])} ({rep['problem']}, {rep['candidate']}): speedups "
                      + ", ".join(f"{s:.3f}" for s in rep["speedups"])
                      + f"; spread {rep['max'] - rep['min']:.3f}"
                      + f"; median wall {rep['median_wall_s']:.2f}s per evaluation"]
    small = report.get("small")
    if small:
        stages = ", ".join(f"{k} {v:.3f}s" for k, v in small["stage_seconds"].items())
        lines.append(f"warm worker, Triton candidate on {small['problem']}: median wall {small['median_wall_s']:.3f}s "
                     f"per evaluation ({stages}; {small.get('timing_reps', '?')} timed pairs)")
    return "\n".join(lines)
