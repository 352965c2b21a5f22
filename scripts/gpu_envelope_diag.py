"""Where the envelope's false alarms come from: is a candidate runner's per-call overhead the spare's?

    python3 -P scripts/gpu_envelope_diag.py [--device cuda:0] [--rounds 5] [--problems level1/7_ScaleAdd,...]

For each problem (built-in, CPU size: 5-10 us kernels, where an honest reference copy was flagged
side_stream on the H200) and round: the overhead a fresh spare calibrates (as the judge does), the
overhead the candidate's own runner calibrates before the candidate loads, the candidate's median
gap (envelope - events) over 20 interleaved timed calls after 6 untimed calls (as correctness leaves
it). Prints one line per round.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from kb_gym.problems import get_problem, load_problems, reference_as_candidate
from kb_gym.worker.clock import CacheFlusher
from kb_gym.worker.inputs import init_model
from kb_gym.worker.loading import load_source
from kb_gym.worker.runner_pool import RunnerPool
from kb_gym.worker.timing import calibrate_overhead, fresh_seed, time_pair


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--problems", default="level1/7_ScaleAdd,level1/3_RowSoftmax,level1/1_ReLU")
    args = ap.parse_args()
    device = torch.device(args.device)
    pool = RunnerPool(args.device, Path(tempfile.mkdtemp(prefix="kb_env_diag_")))
    flusher = CacheFlusher(device)
    problems = load_problems("builtin", size="cpu")
    try:
        for key in args.problems.split(","):
            problem = get_problem(problems, name=key)
            ref_mod = load_source(problem.code, "kb_env_diag_" + key.replace("/", "_"))
            ref_model = init_model(ref_mod, ref_mod.Model, 0, device, torch.float32)
            source = reference_as_candidate(problem)
            for k in range(args.rounds):
                seeds = [fresh_seed() for _ in range(10)]
                spare = pool.pristine()
                spare.prepare(problem.code, 0, "fp32", False, timeout=60, reference_model=True)
                cal_spare = calibrate_overhead(spare, ref_model, ref_mod, device, torch.float32, flusher, seeds, 60)
                pool.discard_spare()
                runner = pool.take()
                runner.prepare(problem.code, 0, "fp32", False, timeout=60, reference_model=True)
                cal_own = calibrate_overhead(runner, ref_model, ref_mod, device, torch.float32, flusher, seeds, 60)
                runner.load(source, 0, timeout=120)
                for _ in range(6):
                    runner.call(fresh_seed(), timeout=60, byte_limit=1 << 34, check_mutation=True)
                t0 = time.perf_counter()
                timing = time_pair(ref_model, ref_model, runner, ref_mod, device, torch.float32, flusher, None,
                                   warmup=3, min_reps=20, max_reps=20, target_rel_ci=0.0, max_seconds=30,
                                   call_timeout=lambda: 60.0, byte_limit=1 << 34)
                gaps = [e - v for e, v in zip(timing.cand.envelope_ms, timing.cand.event_ms, strict=True)]
                runner.kill()
                print(f"{key:<24} round {k}: spare {cal_spare.overhead_ms:.3f} (+-{cal_spare.spread_ms:.3f}) "
                      f"own-before {cal_own.overhead_ms:.3f} (+-{cal_own.spread_ms:.3f}) "
                      f"candidate gap {statistics.median(gaps):.3f} (min {min(gaps):.3f} max {max(gaps):.3f}) "
                      f"| excess vs spare "
                      f"{statistics.median(gaps) - cal_spare.overhead_ms:+.3f} vs own "
                      f"{statistics.median(gaps) - cal_own.overhead_ms:+.3f} "
                      f"({time.perf_counter() - t0:.1f}s)", flush=True)
    finally:
        pool.close()


if __name__ == "__main__":
    main()
