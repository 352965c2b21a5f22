"""The probe check's cost per evaluation: two fidelity reports of one machine, without and with the probe.

    python scripts/probe_cost.py fidelity-probe-off.json fidelity-probe-on.json   # gpu_check.sh part probecost

Per case: the median wall per evaluation less its load stage (a cold CUDA build is no cost of the probe), both ways,
their ratio, and with the probe each repeat's probe stage and how its pass split (the spare's calls, the candidate's,
the checks after the probe's stop), and the reading after the candidate's exit where one ran (its seconds, and its
harness share less the pass's own); then the ratio of the sums and the median ratio, against issue 10's 1.5x budget.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

BUDGET = 1.5  # issue 10: the integrity design may cost at most 1.5x per evaluation


def own_seconds(row: dict[str, Any]) -> float:
    return row["wall_s"] - (row.get("stage_seconds") or {}).get("load", 0.0)


def compare(off: dict[str, Any], on: dict[str, Any]) -> tuple[list[str], dict[str, float]]:
    """Lines of the table, and the totals: off and on seconds summed over the cases both reports hold, their ratio
    and the median of the per-case ratios."""
    before = {(r["case"], r.get("preset")): r for r in off["rows"]}
    lines, pairs = [], []
    for row in on["rows"]:
        base = before.get((row["case"], row.get("preset")))
        if base is None:
            continue
        a, b = own_seconds(base), own_seconds(row)
        pairs.append((a, b))
        passes = " ".join(
            "/".join(f"{k} {v:.2f}" for k, v in p.items()) if p else "-" for p in row.get("probe_pass_s") or [])
        stage = "/".join(f"{v:.2f}" for v in row.get("probe_check_s") or []) or "-"
        after = "/".join(f"{v:.2f}" for v in row.get("probe_after_exit_s") or []) or "-"
        drift = "/".join("-" if v is None else f"{v:+.4f}" for v in row.get("probe_after_exit_drift_ms") or []) or "-"
        lines.append(f"{row['case']:<32} off {a:6.2f}s on {b:6.2f}s x{b / a if a else float('nan'):5.2f}  "
                     f"probe_check {stage}  after_exit {after} (share drift ms {drift})  {passes}")
    if not pairs:
        return ["no case in both reports"], {}
    total_off, total_on = sum(a for a, _ in pairs), sum(b for _, b in pairs)
    totals = {"off_s": total_off, "on_s": total_on, "ratio": total_on / total_off if total_off else float("nan"),
              "median_ratio": statistics.median(b / a for a, b in pairs if a)}
    lines.append(f"sum over {len(pairs)} cases: off {total_off:.2f}s on {total_on:.2f}s x{totals['ratio']:.2f}; "
                 f"median ratio x{totals['median_ratio']:.2f} (budget x{BUDGET})")
    return lines, totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("off", type=Path)
    parser.add_argument("on", type=Path)
    args = parser.parse_args()
    lines, _ = compare(json.loads(args.off.read_text()), json.loads(args.on.read_text()))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
