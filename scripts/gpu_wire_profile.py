"""Where a large-output evaluation's wall goes: one judge in this process, run_job under cProfile.

    python3 -P scripts/gpu_wire_profile.py [--device cuda:0] [--rows 16384] [--cols 16384] [--trials 5]

A reference copy of ``x + 1`` (one output of rows x cols fp32) is evaluated once to warm the runner pool
and the build, then once under cProfile; prints the stage seconds and the judge's 25 costliest calls.
The runner's own side shows as the judge's wait for its messages (MessageReader.read / read_bytes).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from kb_gym.config import EvalConfig
from kb_gym.problems import Problem, reference_as_candidate
from kb_gym.worker.job import WorkerContext, run_job

CODE = """import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x + 1
def get_inputs():
    return [torch.randn({rows}, {cols})]
def get_init_inputs():
    return []
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=16384)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    problem = Problem(level=1, id=990, name="wire_profile", code=CODE.format(rows=args.rows, cols=args.cols))
    cfg = EvalConfig(trials=args.trials).to_dict()
    ctx = WorkerContext(args.device, Path(tempfile.mkdtemp(prefix="kb_wire_")), send=lambda msg: None)
    job = {"type": "eval", "job_id": 0, "problem_code": problem.code, "problem_key": problem.key,
           "source": reference_as_candidate(problem), "seed": 1, "config": cfg}
    t0 = time.perf_counter()
    first = run_job(ctx, dict(job, job_id=1))
    print(f"warm-up evaluation {time.perf_counter() - t0:.1f}s {first.get('status')} {first.get('error')}")
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    result = run_job(ctx, dict(job, job_id=2, seed=2))
    profile.disable()
    gb = args.rows * args.cols * 4 / 1e9
    print(f"output {gb:.2f} GB: evaluation {time.perf_counter() - t0:.1f}s {result.get('status')} "
          f"{result.get('error')} reps {result.get('timing_reps')}")
    print("stages", {k: round(v, 2) for k, v in result["stage_seconds"].items()})
    pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
    pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    if ctx.pool is not None:
        ctx.pool.close()


if __name__ == "__main__":
    main()
