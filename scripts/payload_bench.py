"""What one large output costs to reach the judge: the protocol pipe, the shared memfd, and the memfd with
both sides' mappings page-locked (the default on a GPU).

    python3 -P scripts/payload_bench.py [--device cuda:0] [--mb 1024] [--calls 5]

For each transport, a fresh runner loads a reference copy of ``x + 1`` whose output is ``--mb`` MB of fp32,
then the judge calls it ``--calls`` + 1 times untimed, as correctness trials do, with the byte limit a
correctness trial has (twice the output); printed: the first call's wall (it maps, and page-locks, the memfd)
and the median of the others, from sending the seed to holding the judge's own copy of the outputs
(commitment checked).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from kb_gym.problems import Problem, reference_as_candidate
from kb_gym.worker.runner_pool import RunnerPool

CODE = """import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x + 1
def get_inputs():
    return [torch.randn({n})]
def get_init_inputs():
    return []
"""


def per_call_ms(device: str, mb: int, calls: int) -> tuple[list[float], bool]:
    problem = Problem(level=1, id=991, name="payload_bench", code=CODE.format(n=mb * (1 << 20) // 4))
    pool = RunnerPool(device, Path(tempfile.mkdtemp(prefix="kb_payload_")))
    try:
        runner = pool.take()
        runner.prepare(problem.code, 0, "fp32", False, timeout=120)
        runner.load(reference_as_candidate(problem), 0, timeout=300)
        times = []
        for k in range(calls + 1):
            t0 = time.perf_counter()
            reply = runner.call(1000 + k, timeout=300, byte_limit=2 * mb * (1 << 20) + (1 << 20))
            del reply
            times.append((time.perf_counter() - t0) * 1e3)
        pinned = bool(runner.payload and runner.payload.pinned_maps)
        runner.kill()
        return times, pinned
    finally:
        pool.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    for transport, pin in (("pipe", "0"), ("shm", "0"), ("shm", "1")):
        os.environ["KB_GYM_PAYLOAD"], os.environ["KB_GYM_PAYLOAD_PIN"] = transport, pin
        times, pinned = per_call_ms(args.device, args.mb, args.calls)
        later = times[1:]
        print(f"{transport + (' pinned' if pinned else ''):<10} {args.mb} MB output on {args.device}: first call "
              f"{times[0]:.1f} ms, then median {statistics.median(later):.1f} ms per call "
              f"(range {min(later):.1f}-{max(later):.1f}, {len(later)} calls)", flush=True)


if __name__ == "__main__":
    main()
