"""Why a GPU judge hashes outputs on the host or the device (device_digest.py), step by step.

    python3 -P scripts/gpu_digest_diag.py [--device cuda:0]

1. In this process, set up as a judge is (its own Triton cache, the build cache beside it): whether the
   kernel passes its self-check, why not, and what was compiled for the runners' seed.
2. A runner from the pool: what its "ready" said about loading the kernel, and its log.
3. One timed evaluation through an Evaluator: the digest it used, the envelope, and the note.
4. The digest's cost at 32 and 512 MB next to the host path (copy to pinned memory and BLAKE2b).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()
    device = torch.device(args.device)
    scratch = Path(tempfile.mkdtemp(prefix="kb_digest_diag_"))
    os.environ["TRITON_CACHE_DIR"] = str(scratch / "triton")
    os.environ.setdefault("KB_GYM_EXTENSIONS_DIR", str(scratch / "torch_extensions"))
    from kb_gym.worker import device_digest

    t0 = time.perf_counter()
    ok = device_digest.trusted(device)
    print(f"1. judge self-check: trusted={ok} why_not={device_digest.why_not(device)!r} "
          f"({time.perf_counter() - t0:.1f} s); seed: {[p.name for p in device_digest._seed]}", flush=True)

    from kb_gym.worker.runner_pool import RunnerPool

    pool = RunnerPool(args.device, scratch)
    try:
        runner = pool.take()
        runner.wait_ready()
        print(f"2. runner ready: device_digest={runner.info.get('device_digest')} "
              f"error={runner.info.get('device_digest_error')!r} startup={runner.info.get('startup_seconds')} "
              f"judge side: {runner.device_digest} note={runner.digest_note!r}", flush=True)
        print("   runner log tail:", runner.log_tail()[-1500:], flush=True)
        runner.kill()
    finally:
        pool.close()

    from kb_gym import Evaluator
    from kb_gym.problems import get_problem, load_problems, reference_as_candidate

    size = "gpu" if device.type == "cuda" else "cpu"
    problem = get_problem(load_problems("builtin", size=size), name="level1/1_ReLU")
    with Evaluator(args.device, results_path=False, baseline_cache=False) as ev:
        r = ev.evaluate(problem, reference_as_candidate(problem))
        print(f"3. evaluation: {r.status} speedup {r.speedup} digest {r.worker.get('digest')} "
              f"note {r.worker.get('digest_note', '')!r} envelope {r.correctness.get('envelope')}", flush=True)

    from kb_gym.worker.digest import output_digest
    from kb_gym.worker.tensors import host_bytes

    for mb in (32, 512) if device.type == "cuda" else (1,):
        x = torch.randn(mb << 18, device=device)
        device_digest.tree_digests(x, 1, 0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        device_digest.tree_digests(x, 2, 0)
        dev_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        output_digest(host_bytes(x), 2, 0)
        host_ms = (time.perf_counter() - t0) * 1e3
        print(f"4. {mb} MB: device digest {dev_ms:.2f} ms, host copy + BLAKE2b {host_ms:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
