"""What the judge held at each stage's peak: replays the allocation histories a judge wrote under
KB_GYM_MEMORY_HISTORY (kb_gym/worker/memory_history.py), one job's stages in order, and names the tensors alive at
the most held moment of each stage's window, grouped by where the judge allocated them.
Usage: memory_peak.py DIR [PREFIX]   (PREFIX: the files' problem and job, e.g. level1_19_ReLU-3)"""

from __future__ import annotations

import pickle
import sys
from collections import defaultdict
from pathlib import Path

# "start": written as the job begins (job._pipeline); it bounds the load stage's window from below, and is not a stage
STAGES = ("start", "load", "correctness", "calibration", "timing", "checks")
GIB = 1 << 30


def where(frames: list[dict]) -> str:
    """The innermost two frames of kb_gym's own code: the call that allocated, and its caller."""
    ours = [f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in frames if "kb_gym" in f["filename"]]
    return " < ".join(ours[:2]) or (frames[0]["name"] if frames else "?")


Peaks = dict[str, tuple[int, list[tuple[str, int, int]]]]  # stage: (most bytes alive, [(site, bytes, allocations)])


def stage_peaks(events: list[dict], windows: list[tuple[str, float]]) -> Peaks:
    """Per stage (``windows``: each stage's name and the time its mark was written, in order), the most bytes alive
    at once within its window and what held them then: (site, bytes, allocations), largest first. A "start" window
    (the history up to the job's start) is replayed for what stays alive, and not reported."""
    alive: dict[int, tuple[int, str]] = {}
    total = 0
    best: dict[str, tuple[int, dict[int, tuple[int, str]]]] = {}
    bounds = iter(windows)
    name, end = next(bounds)
    for e in events:
        t = e.get("time_us", 0)
        while name is not None and t > end:
            name, end = next(bounds, (None, float("inf")))
        if name is None:
            break
        action, addr, size = e["action"], e["addr"], e["size"]
        if action == "alloc":
            alive[addr] = (size, where(e.get("frames", [])))
            total += size
        elif action in ("free_requested", "free_completed") and addr in alive:
            total -= alive.pop(addr)[0]
        else:
            continue
        if name == "start":  # before the job: what it leaves alive is counted, its peaks are the last job's
            continue
        if total > best.get(name, (-1, {}))[0]:
            best[name] = (total, dict(alive))
    out: dict[str, tuple[int, list[tuple[str, int, int]]]] = {}
    for stage, (most, held) in best.items():
        groups: dict[str, list[int]] = defaultdict(list)
        for size, site in held.values():
            groups[site].append(size)
        out[stage] = (most, sorted(((site, sum(v), len(v)) for site, v in groups.items()), key=lambda g: -g[1]))
    return out


def report(peaks: Peaks, windows: list[tuple[str, float]]) -> list[str]:
    lines = []
    for stage, _ in windows:
        if stage not in peaks:
            continue
        most, groups = peaks[stage]
        lines.append(f"== {stage}: {most / GIB:.2f} GiB held at its peak")
        lines += [f"  {size / GIB:7.2f} GiB  x{count:<3d} {site}" for site, size, count in groups[:12]
                  if size >= 64 << 20]
    return lines


def main() -> None:
    folder = Path(sys.argv[1])
    prefix = sys.argv[2] if len(sys.argv) > 2 else ""
    jobs: dict[str, dict[str, Path]] = defaultdict(dict)
    for path in sorted(folder.glob(f"{prefix}*.pickle")):
        job, _, stage = path.stem.rpartition("-")
        jobs[job][stage] = path
    for job, files in jobs.items():
        ordered = [(s, files[s]) for s in STAGES if s in files]
        if not ordered:
            continue
        snaps = [(s, pickle.loads(p.read_bytes())) for s, p in ordered]
        last = snaps[-1][1]
        events = next((t for t in last["device_traces"] if t), [])
        windows = [(s, max((e.get("time_us", 0) for t in snap["device_traces"] for e in t), default=0))
                   for s, snap in snaps]
        print(f"# {job}: {len(events)} events")
        print("\n".join(report(stage_peaks(events, windows), windows)))


if __name__ == "__main__":
    main()
