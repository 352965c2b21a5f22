"""Where one evaluation's time goes: the reference submitted as its own candidate on a few problems, each twice
(first with its baseline measured, then from the baseline cache), on a fresh Evaluator; stage seconds, the timing
record and the runner's fields per evaluation. Usage: gpu_stage_diag.py [PROBLEM_KEY ...] (official first, then
built-in GPU size). The batch's copy-bound official problems (2-6 GB outputs) are the default."""

from __future__ import annotations

import json
import sys
import time

from kb_gym import Evaluator, load_problems
from kb_gym.problems import ProblemError, reference_as_candidate
from kb_gym.worker import launch_shim

keys = sys.argv[1:] or ["level1/19_ReLU", "level1/23_Softmax"]
sets = []
for name, kwargs in (("official", {}), ("builtin", {"size": "gpu"})):
    try:
        sets.append({p.key: p for p in load_problems(name, **kwargs)})
    except ProblemError:
        pass
print("launch shim", launch_shim.enabled(), flush=True)
with Evaluator("cuda:0", results_path=False) as ev:
    ev.warm()
    for key in keys:
        problem = next((s[key] for s in sets if key in s), None)
        if problem is None:
            print(key, "not found")
            continue
        for attempt in (1, 2):
            t0 = time.perf_counter()
            r = ev.evaluate(problem, reference_as_candidate(problem))
            stages = {k: round(v, 2) for k, v in r.stage_seconds.items()}
            worker = {k: r.worker.get(k) for k in ("launch_shim", "digest", "digest_note", "shm_payloads",
                                                    "payload_pinned", "overhead_ms", "payload_seconds")}
            timing = {"reps": r.timing_reps, "host_ms": r.host_runtime_ms, "ref_host_ms": r.ref_host_runtime_ms,
                      "baseline_cached": r.baseline_cached, "ci": r.speedup_ci}
            print(f"{key} #{attempt} {r.status} speedup {r.speedup} wall {time.perf_counter() - t0:.1f}s "
                  f"runtime {r.runtime_ms} ref {r.ref_runtime_ms} flags {r.flags}\n  stages {json.dumps(stages)}\n"
                  f"  worker {json.dumps(worker, default=str)}\n  timing {json.dumps(timing, default=str)}\n"
                  f"  correctness seconds {json.dumps(r.correctness.get('seconds'))}\n"
                  f"  envelope {json.dumps(r.correctness.get('envelope'), default=str)[:400]}\n"
                  f"  judge memory MiB [held, reserved, most held] {json.dumps(r.correctness.get('judge_memory_mib'))}",
                  flush=True)
