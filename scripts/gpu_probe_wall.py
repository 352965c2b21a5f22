"""Why the probe check's wall reading charged an honest kernel on the H200 (docs/benchmarks.md 0y).

The first GPU run of the wall check (probe_check.read_probe: a candidate window's span less the spare's harness-only
span, held to the claim with a 0.3 ms floor) charged an honest reference copy of a 0.036 ms ReLU on 4096 x 4096
(``launch_bound``). This evaluates honest candidates (reference copies and a Triton ReLU) with the probe check on, at
two output sizes (64 MB and 4 MB) and a matmul (a forward of ~0.4 ms, small output), and prints each reading's
per-window samples: whether the wall excess grows with the output's size (the payload path differing between the
spare and the candidate's runner), stays a fixed host cost of the forward (launch and event synchronisation, which
the harness-only call does not pay), or is noise.

    python3 -P scripts/gpu_probe_wall.py --out probe-wall.json   # on the device machine (gpu_check.sh probewall)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.problems import reference_as_candidate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
from test_gpu_probe_check import RELU, TRITON_RELU  # noqa: E402 - the GPU test's own problem and kernel

CONFIG = EvalConfig(trials=3, timing_min_reps=5, timing_max_reps=20, timing_warmup=2, probe_check=True)
SMALL_RELU = Problem(id=19, name="19_ReLU_1024", level=1, code=RELU.code.replace("4096, 4096", "1024, 1024"))
MATMUL = Problem(id=1, name="1_Matmul_2048", level=1, code='''import torch
class Model(torch.nn.Module):
    def forward(self, a, b):
        return a @ b
def get_inputs():
    return [torch.randn(2048, 2048), torch.randn(2048, 2048)]
def get_init_inputs():
    return []
''')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with Evaluator("cuda:0", results_path=False, baseline_cache=False) as ev:
        for problem in (RELU, SMALL_RELU, MATMUL):
            sources = [("reference", reference_as_candidate(problem))]
            if "relu" in problem.code:
                sources.append(("triton", TRITON_RELU))
            for label, source in sources * args.repeats:
                r = ev.evaluate(problem, source, config=CONFIG)
                envelope = (r.correctness or {}).get("envelope") or {}
                probe = envelope.get("probe") or {}
                row = {"problem": problem.name, "candidate": label, "status": r.status, "flags": r.flags,
                       "speedup": r.speedup, "runtime_ms": r.runtime_ms, "probe": probe,
                       "probe_note": envelope.get("probe_note"), "payload_pinned": r.worker.get("payload_pinned"),
                       "shm_payloads": r.worker.get("shm_payloads")}
                rows.append(row)
                print(f"{problem.name:14} {label:9} {r.status:9} speedup {r.speedup or 0:6.3f} flags {r.flags} "
                      f"pinned {row['payload_pinned']}")
                if probe:
                    print(f"  claim {probe['claimed_ms']:.4f} forward {probe['forward_ms']:.4f} "
                          f"wall {probe['wall_ms']:.4f} (tol {probe['wall_tolerance_ms']:.3f}) "
                          f"harness span {probe.get('harness_span_ms', 0):.3f} "
                          f"charged {probe['charged_ms']:.4f} by_wall {probe['by_wall']}")
                    print(f"  wall samples {probe.get('wall_samples_ms')}")
                    print(f"  busy samples {probe.get('busy_samples_ms')}")
                else:
                    print(f"  no probe reading: {row['probe_note']}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
