"""Our reference solutions (problems/builtin/solutions/) judged and timed at a size: the speedup table.

    python3 -P scripts/solution_speedups.py [--device cuda:0] [--size gpu] [--only KEY,...] [--out FILE.json]

Every solution (Triton, and on a GPU the CUDA load_inline ones) goes through the Evaluator with the default
config, a few at a time through ``evaluate_many`` so that one candidate's compile overlaps another's timing;
rows are printed and written as each group ends, so a run cut by a time limit keeps what it measured. Prints a
markdown table (docs/benchmarks.md, "Reference solutions"): status, eager and solution ms, speedup and its
interval, the load stage's seconds (a cold nvcc build for CUDA), whether the precompiled header was used and
the header diet each CUDA build got (worker/header_diet.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from kb_gym import Evaluator
from kb_gym.problems import get_problem, load_problems
from kb_gym.problems.solutions import solution_backend, solution_files


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return format(value, spec) if isinstance(value, float | int) else "-"


def _row(key: str, backend: str, r) -> dict:
    return {"key": key, "backend": backend, "status": r.status, "ref_ms": r.ref_runtime_ms, "ms": r.runtime_ms,
            "speedup": r.speedup, "speedup_ci": r.speedup_ci, "flags": r.flags,
            "load_s": r.stage_seconds.get("load"), "total_s": r.stage_seconds.get("total"),
            "pch": (r.worker.get("pch") or {}).get("used"), "headers": r.worker.get("headers"),
            "digest": r.worker.get("digest"),
            "error": (r.error or "")[:300]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--size", default="gpu", choices=("cpu", "gpu"))
    ap.add_argument("--only", default="", help="comma-separated problem keys (level1/1_ReLU,...)")
    ap.add_argument("--group", type=int, default=4, help="solutions per evaluate_many call")
    ap.add_argument("--workers-per-device", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    problems = load_problems("builtin", size=args.size)
    files = solution_files(args.device)
    only = {k for k in args.only.split(",") if k}
    jobs = [(f"{f.parent.name}/{f.stem}", solution_backend(f), f.read_text()) for f in files]
    jobs = [j for j in jobs if not only or j[0] in only]
    rows: list[dict] = []
    print("| solution | kind | status | eager ms | solution ms | speedup (95% CI) | load s | PCH | headers |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    t0 = time.perf_counter()
    with Evaluator(args.device, results_path=False, workers_per_device=args.workers_per_device) as ev:
        ev.warm()
        for start in range(0, len(jobs), args.group):
            group = jobs[start:start + args.group]
            results = ev.evaluate_many([(get_problem(problems, name=key), src) for key, _, src in group])
            for (key, backend, _), r in zip(group, results, strict=True):
                row = _row(key, backend, r)
                rows.append(row)
                ci = row["speedup_ci"] or [None, None]
                print(f"| `{key}` | {backend} | {r.status} | {_fmt(row['ref_ms'])} | {_fmt(row['ms'])} | "
                      f"{_fmt(row['speedup'], '.2f')} ({_fmt(ci[0], '.2f')}-{_fmt(ci[1], '.2f')}) | "
                      f"{_fmt(row['load_s'], '.1f')} | {','.join(row['pch'] or []) or '-'} | "
                      f"{','.join(row['headers'] or []) or '-'} |"
                      + (f" {r.status}: {row['error'][:160]}" if r.status != "correct" else ""), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump({"device": args.device, "size": args.size, "rows": rows}, f, indent=1)
    correct = [r for r in rows if r["status"] == "correct" and r["speedup"]]
    faster = [r for r in correct if r["speedup"] > 1]
    for kind in ("triton", "cuda"):
        mine = [r for r in correct if r["backend"] == kind]
        if mine:
            print(f"{kind}: {len(mine)} correct, median speedup {statistics.median(r['speedup'] for r in mine):.2f}, "
                  f"load median {statistics.median(r['load_s'] or 0 for r in mine):.1f} s")
    print(f"{len(correct)}/{len(rows)} correct, {len(faster)} faster than eager, {time.perf_counter() - t0:.0f} s")
    return 0 if len(correct) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
