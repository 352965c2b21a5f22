"""One honest and a few hostile candidates on the GPU through the judge/runner split, with stage times."""

import json
import time

from kb_gym import Evaluator, get_problem, load_problems
from kb_gym.problems import reference_as_candidate

problems = load_problems("builtin")
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
