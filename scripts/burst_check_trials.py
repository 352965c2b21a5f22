"""How often the burst check (kb_gym/worker/burst.py) charges round 4's false event time, and an honest reference
copy, on GELU over ROWS x 1024 inputs (0: the 64 x 256 GELU of the adversarial tests).

    python scripts/burst_check_trials.py --rows 0 --tries 6 [--device cuda:0]

Prints one line per evaluation (speedup, flags, the burst's forwards, per-forward cost, tolerance and charge) and
how many of each were charged: the numbers of docs/benchmarks.md 0k.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "adversarial"))

from test_judge_isolation import GELU, TIMED  # noqa: E402
from test_redteam_round4 import LIE_UNDER_THE_FLOOR  # noqa: E402
from test_redteam_round5 import _fresh_gelu  # noqa: E402

from kb_gym import Evaluator  # noqa: E402
from kb_gym.problems import reference_as_candidate  # noqa: E402

SHOWN = ("forwards", "forward_ms", "tolerance_ms", "spread_ms", "claimed_ms", "charged_ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=0, help="GELU over ROWS x 1024 (0: the tests' 64 x 256)")
    parser.add_argument("--tries", type=int, default=6)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    problem = _fresh_gelu("burst", args.rows) if args.rows else GELU
    config = TIMED.replace(integrity="strict", burst_check=True)
    with Evaluator(args.device, results_path=False, baseline_cache=False) as ev:
        for name, source in (("lie", LIE_UNDER_THE_FLOOR), ("honest", reference_as_candidate(problem))):
            charged = 0
            for _ in range(args.tries):
                r = ev.evaluate(problem, source, config=config)
                burst = (r.correctness.get("envelope") or {}).get("burst") or {}
                charged += bool(burst.get("counted"))
                shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in burst.items() if k in SHOWN}
                print(name, r.status, f"{r.speedup:.2f}x" if r.speedup else "-", r.flags, shown or "no burst",
                      flush=True)
            print(f"{name}: charged in {charged} of {args.tries}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
