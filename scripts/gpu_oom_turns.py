"""Jobs that run out of the device's memory side by side, run again alone (kb_gym/device_turns.py), on a GPU whose
memory two GPU-size jobs do not fit (an H100's 80 GB): level1/23_Softmax (6 GB outputs), two reference copies and two
wrong candidates submitted at once to two workers. Prints each verdict with its turn as it comes."""

from __future__ import annotations

import sys
import time

from kb_gym import Evaluator
from kb_gym.batch_bench import _scaled
from kb_gym.problems import load_problems, reference_as_candidate

KEY = sys.argv[1] if len(sys.argv) > 1 else "level1/23_Softmax"


def main() -> None:
    problem = {p.key: p for p in load_problems("official")}[KEY]
    copy = reference_as_candidate(problem)
    jobs = [("reference", copy), ("wrong", _scaled(copy)), ("reference", copy), ("wrong", _scaled(copy))]
    began = time.perf_counter()
    with Evaluator("cuda:0", workers_per_device=2, results_path=False, baseline_cache=False) as ev:
        futures = [(kind, ev.submit(problem, source)) for kind, source in jobs]
        for kind, future in futures:
            r = future.result()
            w = r.worker
            print(f"{time.perf_counter() - began:6.1f}s {KEY} {kind}: {r.status} speedup {r.speedup} "
                  f"alone {w.get('alone', False)} evicted {w.get('evicted', 0)} "
                  f"retried_alone {str(w.get('retried_alone', ''))[:160]!r} error {str(r.error or '')[:160]!r}",
                  flush=True)


if __name__ == "__main__":
    main()
