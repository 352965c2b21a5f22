"""Eager time of every problem at a size: the cost model's estimate and, on a GPU, the measurement.

    python3 -P scripts/problem_times.py [--dataset builtin] [--size gpu] [--measure] [--only KEYS] [--out FILE.json]

Prints a markdown table (docs/problems.md, "Eager time at GPU size"). --measure times the eager forward
on cuda:0 in fp32 without TF32, as the Evaluator's baseline runs: the median of 10 cold-L2 calls
(kb_gym.worker.clock.timed_call), after 2 warm-up calls, and the peak memory of one call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from kb_gym.problems import load_problems
from kb_gym.problems.eager_trace import estimate


def measure(problem, device: torch.device) -> dict:
    from kb_gym.worker.clock import CacheFlusher, timed_call
    from kb_gym.worker.inputs import init_model, make_inputs
    from kb_gym.worker.loading import load_source

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    module = load_source(problem.code, f"kb_times_{problem.level}_{problem.id}")
    model = init_model(module, module.Model, 0, device, torch.float32)
    flusher = CacheFlusher(device)
    inputs = make_inputs(module, 1, device, torch.float32)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    for _ in range(2):
        timed_call(model, inputs, device, flusher)
    peak = (torch.cuda.max_memory_allocated(device) - base) / 1e9
    times = [timed_call(model, inputs, device, flusher).ms for _ in range(10)]
    del model, inputs, flusher
    torch.cuda.empty_cache()
    return {"measured_ms": statistics.median(times), "measured_peak_gb": peak}


def _table_row(row: dict) -> str:
    def f(key: str, spec: str = ".2f") -> str:
        return format(row[key], spec) if isinstance(row.get(key), float | int) else "-"
    return (f"| `{row['key']}` | {row.get('shapes', '-')} | {f('estimated_ms')} | {f('measured_ms')} | "
            f"{row.get('launches', '-')} | {f('gflop', '.1f')} | {f('memory_gb')} / {f('measured_peak_gb')} |")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="builtin")
    parser.add_argument("--size", default="gpu", choices=("cpu", "gpu"))
    parser.add_argument("--measure", action="store_true", help="also time each eager forward on cuda:0")
    parser.add_argument("--only", default=None, help="problem keys, comma-separated (default: all)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    rows = []
    print("| key | inputs -> outputs | estimated ms | measured ms | launches | GFLOP | memory GB (est. / peak) |")
    print("|---|---|---|---|---|---|---|")
    for problem in load_problems(args.dataset, size=args.size):
        if only is not None and problem.key not in only:
            continue
        row: dict = {"key": problem.key}
        try:
            est = estimate(problem)
            row.update(estimated_ms=est.ms, launches=est.launches, gflop=est.gflop, memory_gb=est.memory_gb,
                       shapes=f"{est.input_shapes} -> {est.output_shapes}")
        except Exception as exc:  # noqa: BLE001 - an op meta tensors cannot run (nonzero): no estimate
            row["estimate_error"] = f"{type(exc).__name__}: {exc}"[:200]
        if args.measure:
            try:
                row.update(measure(problem, torch.device("cuda:0")))
            except Exception as exc:  # noqa: BLE001 - report it in the table, go on with the next
                row["measure_error"] = f"{type(exc).__name__}: {exc}"[:200]
                torch.cuda.empty_cache()
        rows.append(row)
        print(_table_row(row), flush=True)
    measured = [r for r in rows if "measured_ms" in r]
    if measured:
        inside = sum(1 <= r["measured_ms"] <= 15 for r in measured)
        ratios = [r["measured_ms"] / r["estimated_ms"] for r in measured if r.get("estimated_ms")]
        print(f"\n{inside} of {len(measured)} measured inside 1-15 ms; measured / estimated: median "
              f"{statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}" if ratios else "")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
