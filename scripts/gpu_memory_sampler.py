"""Who holds a GPU's memory during a run: ``python3 -P scripts/gpu_memory_sampler.py OUT.jsonl [--every S]``, started
in the background beside a batch (gpu_check.sh's MEMORY_SAMPLES knob), stopped with SIGTERM; then
``python3 -P scripts/gpu_memory_sampler.py --summary OUT.jsonl`` prints the peak and what held it.

Issue 13's open question on an H100: jobs of the 6.4 GB problems ran out of the device's memory beside other jobs, and
with three or four workers a device that runs out more often holds less of the wall (benchmarks.md 1m). Each sample
is one JSON line: the wall time, the device's used MiB, and per compute process its MiB and role (judge, runner,
probe, other), read from its command line; the roles say whose memory a fix should shrink.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

# runners forked from a zygote keep its command line (the zygote itself holds no GPU context)
ROLES = (("kb_gym.worker.runner", "runner"), ("kb_gym.worker.zygote", "runner"), ("kb_gym.worker.probe_clock", "probe"),
         ("kb_gym.worker.pch", "pch"), ("kb_gym.worker", "judge"), ("kb_gym.cli", "evaluator"))


def role(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    return next((name for marker, name in ROLES if marker in cmdline), "other")


def _smi(query: str, fields: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", f"--query-{query}={fields}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=10)
    return [[v.strip() for v in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def sample() -> dict:
    used = sum(int(row[0]) for row in _smi("gpu", "memory.used") if row[0].isdigit())
    procs = [{"pid": int(pid), "mib": int(mib), "role": role(int(pid))}
             for pid, mib in _smi("compute-apps", "pid,used_memory") if pid.isdigit() and mib.isdigit()]
    return {"t": time.time(), "used_mib": used, "procs": procs}


def record(path: Path, every: float) -> None:
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    with path.open("a") as out:
        while running[0]:
            try:
                out.write(json.dumps(sample()) + "\n")
                out.flush()
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                print(f"gpu_memory_sampler: {exc!r}", file=sys.stderr)
            time.sleep(every)


def summary(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        return "gpu_memory_sampler: no samples"
    peak = max(rows, key=lambda r: r["used_mib"])
    by_role: dict[str, list[int]] = defaultdict(list)
    for p in peak["procs"]:
        by_role[p["role"]].append(p["mib"])
    largest: dict[str, int] = defaultdict(int)  # the most one process of each role held at any sample
    for r in rows:
        for p in r["procs"]:
            largest[p["role"]] = max(largest[p["role"]], p["mib"])
    idle = [r["used_mib"] for r in rows]
    lines = [f"memory samples: {len(rows)} over {rows[-1]['t'] - rows[0]['t']:.0f} s; used MiB median "
             f"{sorted(idle)[len(idle) // 2]}, peak {peak['used_mib']} at +{peak['t'] - rows[0]['t']:.0f} s",
             "at the peak, by role (processes: MiB each): " + "; ".join(
                 f"{name} {len(v)}: {sorted(v, reverse=True)}" for name, v in sorted(by_role.items())),
             "largest single process per role (MiB): " + ", ".join(f"{k} {v}" for k, v in sorted(largest.items()))]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args()
    if args.summary:
        print(summary(args.path))
    else:
        record(args.path, args.every)


if __name__ == "__main__":
    main()
