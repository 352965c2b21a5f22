"""One honest and a few hostile candidates on the GPU through the judge/runner split, with stage times."""

import json
import time

from kb_gym import Evaluator, get_problem, load_problems
from kb_gym.problems import reference_as_candidate

problems = load_problems("builtin", size="cpu")
relu = get_problem(problems, name="level1/1_ReLU")
t0 = time.perf_counter()
with Evaluator("cuda:0", results_path=False, baseline_cache=False) as ev:
    ev.warm()
    print(f"judge start {time.perf_counter() - t0:.2f}s")
    cases = {"reference": reference_as_candidate(relu),
             "zeros": reference_as_candidate(relu).replace("return torch.relu(inp)", "return torch.zeros_like(inp)"),
             "raises": ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                        "        raise ValueError('x')\n")}
    for name, src in list(cases.items()) * 2:
        t1 = time.perf_counter()
        r = ev.evaluate(relu, src)
        print(f"{name:<10} {r.status:<13} worker {r.worker} speedup {r.speedup} "
              f"wall {time.perf_counter() - t1:.2f}s flags {r.flags} "
              f"stages {json.dumps({k: round(v, 3) for k, v in r.stage_seconds.items()})} err {(r.error or '')[:300]}")
        print("   envelope", r.correctness.get("envelope"))
    batch = [(p, reference_as_candidate(p)) for p in problems if p.level < 3][:8] * 2
    t1 = time.perf_counter()
    results = ev.evaluate_many(batch)
    wall = time.perf_counter() - t1
    print(f"batch of {len(batch)} reference candidates: {wall / len(batch):.2f}s per candidate; statuses "
          f"{sorted({r.status for r in results})}; speedups {[round(r.speedup or 0, 3) for r in results]}")
    for (p, _), r in zip(batch[:8], results[:8], strict=True):
        env = r.correctness.get("envelope") or {}
        print(f"   {p.key:<28} speedup {round(r.speedup or 0, 3)} cand {r.runtime_ms} ref {r.ref_runtime_ms} "
              f"flags {r.flags} excess {env.get('excess_ms')} tol {env.get('tolerance_ms')} "
              f"overhead {env.get('overhead_ms')} counted {env.get('counted')}")

    # Reference as candidate on official L1/L2 problems (the timing's fairness check): each within
    # [0.98, 1.02]? Problems taken in a spread over both levels until SMOKE_OFFICIAL_SECONDS is spent.
    import os

    budget = float(os.environ.get("SMOKE_OFFICIAL_SECONDS", "150"))
    official = [p for level in (1, 2) for p in load_problems("official", level=level)]
    chosen = official[::max(1, len(official) // 24)]

    from kb_gym.problems.eager_trace import output_gb

    # Smallest outputs first (level1/9's 4 GB took 170 s): the budget goes to many problems first.
    chosen.sort(key=output_gb)
    speedups = {}
    t1 = time.perf_counter()
    for p in chosen:
        if time.perf_counter() - t1 > budget:
            break
        t2 = time.perf_counter()
        r = ev.evaluate(p, reference_as_candidate(p))
        speedups[p.key] = r.speedup
        print(f"refcopy {p.key:<48} {r.status:<13} speedup {r.speedup if r.speedup is None else round(r.speedup, 3)} "
              f"ci {[round(v, 3) for v in r.speedup_ci or []]} ref {r.ref_runtime_ms} ms reps {r.timing_reps} "
              f"wall {time.perf_counter() - t2:.1f}s flags {r.flags} "
              f"stages {json.dumps({k: round(v, 2) for k, v in r.stage_seconds.items()})}", flush=True)
    good = [s for s in speedups.values() if s]
    inside = sum(0.98 <= s <= 1.02 for s in good)
    print(f"refcopy official: {len(good)} problems, {inside} inside [0.98, 1.02], range "
          f"{min(good, default=0):.3f}-{max(good, default=0):.3f}, "
          f"{(time.perf_counter() - t1) / max(1, len(speedups)):.1f}s each")
