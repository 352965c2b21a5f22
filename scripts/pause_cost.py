"""What the neighbour pause (kb_gym/worker/neighbours.py) costs a compiling neighbour, and where a runner's kill goes.

    python3 -P scripts/pause_cost.py compile [--device cpu]   # a cold load_inline build beside back-to-back timings,
                                                              # the pause on, then off
    python3 -P scripts/pause_cost.py kill --numel 67108864    # runner_kill and its parts for a large-output problem

``compile``: one worker builds a new C++ (CPU) or CUDA (GPU) extension while the other evaluates reference copies of
a small problem one after another, each with a timing stage, until the build is done; printed per setting: the
build's load seconds, how long it was paused, and the siblings' count and timing seconds. ``kill``: reference copies
of ``x * 2`` on ``--numel`` floats; printed: runner_kill and its parts (stage_seconds kill_*) per evaluation.
docs/benchmarks.md 1i has the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

CPP = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SRC = """
#include <torch/extension.h>
torch::Tensor gelu_TAG(torch::Tensor x) {
    return 0.5 * x * (1 + torch::tanh(0.7978845608 * (x + 0.044715 * x * x * x)));
}
"""
ext = load_inline("TAG", cpp_sources=SRC, functions=["gelu_TAG"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.gelu_TAG(x)
'''


def _problem(name: str, body: str, inputs: str):
    from kb_gym import Problem

    return Problem(id=900, name=name, level=1, code=f"""import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return {body}

def get_inputs():
    return [{inputs}]

def get_init_inputs():
    return []
""")


def compile_cost(device: str, pause: str) -> dict:
    from kb_gym import EvalConfig, Evaluator
    from kb_gym.problems import reference_as_candidate

    gelu = _problem("900_Gelu", "0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))",
                    "torch.randn(64, 256)")
    tag = "pause_" + uuid.uuid4().hex[:8]  # a source no build cache holds
    source = CPP.replace("TAG", tag)
    config = EvalConfig(trials=2, timing_min_reps=10, timing_max_reps=30, timing_warmup=1, timing_max_seconds=3,
                        load_timeout=600, correctness_timeout=60, timing_timeout=60)
    with Evaluator(device, results_path=False, baseline_cache=False, workers_per_device=2) as ev:
        ev.warm()
        began = time.monotonic()
        build = ev.submit(gelu, source, config=config)
        statuses, timing = [], 0.0
        while not build.done():
            r = ev.evaluate(gelu, reference_as_candidate(gelu), config=config)
            statuses.append(r.status)
            timing += r.stage_seconds.get("timing", 0.0)
        b = build.result()
    return {"pause": pause, "status": b.status, "wall_s": round(time.monotonic() - began, 2),
            "load_s": round(b.stage_seconds.get("load", 0.0), 2),
            "paused_for_neighbours_s": round(b.stage_seconds.get("paused_for_neighbours") or 0.0, 2),
            "siblings": len(statuses), "sibling_statuses": sorted(set(statuses)), "sibling_timing_s": round(timing, 2)}


def kill_parts(device: str, numel: int, n: int) -> dict:
    from kb_gym import EvalConfig, Evaluator
    from kb_gym.problems import reference_as_candidate

    problem = _problem("901_BigScale", "x * 2.0", f"torch.randn({numel})")
    config = EvalConfig(trials=1, timing_min_reps=3, timing_max_reps=5, timing_warmup=1, timing_max_seconds=5)
    keys = ("runner_kill", "kill_wait", "kill_payload", "kill_keep", "kill_scratch", "teardown")
    rows = []
    with Evaluator(device, results_path=False, baseline_cache=False, workers_per_device=2) as ev:
        ev.warm()
        for _ in range(n):
            r = ev.evaluate(problem, reference_as_candidate(problem), config=config)
            rows.append({k: round(r.stage_seconds.get(k, -1.0), 4) for k in keys} | {"status": r.status})
            print(json.dumps(rows[-1]), flush=True)
    return {"numel": numel, "median_runner_kill_s": statistics.median(r["runner_kill"] for r in rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["compile", "kill", "compile-one"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--numel", type=int, default=1 << 26)
    parser.add_argument("-n", type=int, default=6)
    parser.add_argument("--pause", default="1")
    args = parser.parse_args()
    os.environ.setdefault("KB_GYM_EXTENSIONS_DIR", tempfile.mkdtemp(prefix="kb-gym-ext-"))
    if args.what == "kill":
        print(json.dumps(kill_parts(args.device, args.numel, args.n)))
    elif args.what == "compile-one":  # one setting, in a process of its own (the pause is read at start-up)
        os.environ["KB_GYM_NEIGHBOUR_PAUSE"] = args.pause
        print(json.dumps(compile_cost(args.device, args.pause)))
    else:
        for pause in ("1", "0"):
            subprocess.run([sys.executable, "-P", __file__, "compile-one", "--device", args.device, "--pause", pause],
                           check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
