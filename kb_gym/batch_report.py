"""What ``kb-gym bench --batch`` reports, from its rows: the wall and its ratio to the KernelBench way, stage
medians, verdicts, build-cache hits and the throughput issue's target figures; parts of one batch measured in
separate runs added up (``merge_parts``); and the printed table (``format_batch``)."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

KINDS = ("reference", "triton", "cuda", "wrong", "raises")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _own(row: dict[str, Any]) -> float:
    """A candidate's own evaluation time: its total less the time it waited behind the others submitted with it,
    for a worker (``queue``), on its worker for the device another worker's candidate held (``device_wait``), and
    with its load stopped while another worker's candidate was measured (``paused_loading``, neighbours.py: the
    pauses that fell in its device wait are in ``device_wait`` already): a whole batch is submitted at once, so all
    three say more about the batch than about the candidate."""
    stages = row["stages"]
    return (row["total_s"] - stages.get("queue", 0.0) - stages.get("device_wait", 0.0)
            - stages.get("paused_loading", 0.0))


def _launcher_hits(rows: list[dict[str, Any]]) -> str:
    counts = [r.get("triton_launchers") or {} for r in rows]
    hits, misses = sum(c.get("hits", 0) for c in counts), sum(c.get("misses", 0) for c in counts)
    return f"{hits}/{hits + misses}"


def _sums(parts: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for part in parts:
        for name, seconds in part.items():
            total[name] = total.get(name, 0.0) + seconds
    return total


def _startup_phases(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    phases: dict[str, list[float]] = {}
    for row in rows:
        for name, seconds in (row.get("runner_startup") or {}).items():
            phases.setdefault(name, []).append(seconds)
    return phases


# The stages a job holds its device through (workers.py: from its first grant to its result), summed over a batch
HELD_STAGES = {"correctness": ("correctness",), "timing": ("timing",), "kernel checks": ("dataflow", "knockout"),
               "teardown": ("teardown",)}


def judge_memory_peaks(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Per stage, the most device memory a judge held in it over the batch and the problem it was judging
    (job._memory_mark's third figure)."""
    peaks: dict[str, list[Any]] = {}
    for r in rows:
        for stage, marks in (r.get("judge_memory_mib") or {}).items():
            if stage not in peaks or marks[2] > peaks[stage][0]:
                peaks[stage] = [marks[2], r["problem"]]
    return peaks


def held_split(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Where the batch's device-held seconds went, summed over its rows; ``rest``: held but in none of them (the
    grant's message, the result's). None where no row held a device (one worker, no host lock: a CPU batch)."""
    held = [r for r in rows if r["stages"].get("device_held") is not None]
    if not held:
        return None
    split = {name: sum(sum(r["stages"].get(s, 0.0) for s in stages) for r in held)
             for name, stages in HELD_STAGES.items()}
    split["rest"] = sum(r["stages"]["device_held"] for r in held) - sum(split.values())
    return split


def held_coverage(rows: list[dict[str, Any]], started_at: float | None, wall: float) -> float | None:
    """The share of the batch's wall during which its device was held by some job (the union of the rows'
    ``held_at`` spans, per device, averaged over devices): near 1, the time is inside the holds and GPU busy
    rises only with what a hold does; well under 1, more workers per device would hold it more of the time."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r.get("held_at") and started_at is not None:
            begin, end = max(r["held_at"][0], started_at), min(r["held_at"][1], started_at + wall)
            if end > begin:
                spans.setdefault(str(r.get("device")), []).append((begin, end))
    if not spans or wall <= 0:
        return None
    shares = []
    for intervals in spans.values():
        covered, reach = 0.0, float("-inf")
        for begin, end in sorted(intervals):
            covered += max(0.0, end - max(begin, reach))
            reach = max(reach, end)
        shares.append(covered / wall)
    return sum(shares) / len(shares)


def _float64_opinions(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The jobs whose correctness stage asked float64 for a second opinion (worker/float64.py), how many of them
    computed it on the host (the device's memory full), and the judge's correctness seconds in them: held time."""
    asked = [(r.get("float64") or {}, r) for r in rows]
    asked = [(f, r) for f, r in asked if f.get("judged_against_float64") or f.get("float64_sampled")]
    return {"jobs": len(asked), "on_host": sum(f.get("float64_on") == "cpu" for f, _ in asked),
            "judge_s": sum((r.get("correctness_seconds") or {}).get("judge", 0.0) for _, r in asked)}


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """The figures derived from ``report``'s rows, wall and KernelBench-way rows, added to it."""
    rows, wall = report["rows"], report["wall_s"]
    devices = max(1, len(report.get("devices") or []))
    stages: dict[str, list[float]] = {}
    for row in rows:
        for stage, seconds in row["stages"].items():
            stages.setdefault(stage, []).append(seconds)
    cuda = [r for r in rows if r["kind"] == "cuda" and not r["build_cached"]]
    again = report.get("cuda_again") or []
    triton_again = report.get("triton_again") or []
    report.update(
        candidates=len(rows), per_candidate_s=wall / len(rows),
        evaluations_per_gpu_hour=3600 * len(rows) / (wall * devices),
        stage_median_s={k: statistics.median(v) for k, v in stages.items()},
        # how much of the wall some job held the device, and what the holds did (the GPU-busy target's two halves)
        held_coverage=(held_coverage(rows, report.get("started_at"), wall) if "parts_merged" not in report
                       else report.get("held_coverage")),
        held_split_s=held_split(rows),
        # where a runner's start-up goes (medians over the candidates' runners; what spare_wait waits for)
        runner_startup_median_s={k: statistics.median(v) for k, v in _startup_phases(rows).items()},
        # the correctness stage's parts, summed over the batch (correctness.run_trials)
        correctness_total_s=_sums([r.get("correctness_seconds") or {} for r in rows]),
        # each memfd payload's parts, summed over the batch (runner_client: runner copy, judge map, copy out)
        payload_total_s=_sums([{k: sum(v) for k, v in (r.get("payload_seconds") or {}).items()} for r in rows]),
        judge_memory_peak_mib=judge_memory_peaks(rows),
        statuses={kind: sorted(r["status"] for r in rows if r["kind"] == kind) for kind in KINDS},
        # jobs run with the device to themselves (device_turns): after running out of memory beside another job,
        # or as a later job of such a problem; and the other workers stopped for them
        turns={"alone": sum(bool(r.get("alone")) for r in rows),
               "retried_alone": sum(bool(r.get("retried_alone")) for r in rows),
               "evicted": sum(int(r.get("evicted") or 0) for r in rows)},
        # jobs whose runner was stopped for another worker's measurement, how their queued GPU work was read
        # ("on", or why not: neighbours.py, gpu_activity.py), and how many that reading killed
        pauses={"paused": sum(bool(r["stages"].get("paused_for_neighbours")) for r in rows),
                "gpu_check": dict(Counter(r.get("neighbour_gpu_check") or "-" for r in rows
                                          if r["stages"].get("paused_for_neighbours"))),
                "gpu_killed": sum(bool(r.get("gpu_killed")) for r in rows)},
        float64=_float64_opinions(rows),
        # the forward after each load, outside the lock (load_forward.py): how many ran, and their seconds summed
        load_forward={"ran": sum(bool((r.get("load_forward") or {}).get("ran")) for r in rows),
                      "seconds": sum((r.get("load_forward") or {}).get("seconds") or 0.0 for r in rows)},
        build_cache_hits=sum(r["build_cached"] for r in rows),
        # hits whose build the runner found up to date; the rest were built again all the same
        build_cache_reused=sum(r.get("build_reused") is True for r in rows),
        targets={  # the throughput issue's figures (medians, seconds)
            "cuda_cold_load_s": _median([r["stages"].get("load", 0.0) for r in cuda]),
            "cuda_cold_total_s": _median([_own(r) for r in cuda if r["total_s"] is not None]),
            "cuda_cache_hit_load_s": _median([r["stages"].get("load", 0.0) for r in again if r["build_cached"]]),
            "cuda_cache_hit_total_s": _median([_own(r) for r in again if r["build_cached"] and r["total_s"]]),
            "cuda_cache_hits": f"{sum(r['build_cached'] for r in again)}/{len(again)}",
            "triton_warm_total_s": _median([_own(r) for r in rows if r["kind"] == "triton" and r["total_s"]]),
            # the same Triton sources evaluated again after the batch (their kernels kept, where triton_cache is on)
            "triton_again_total_s": _median([_own(r) for r in triton_again if r["total_s"]]),
            "triton_again_kept": f"{sum(bool(r.get('triton_cached')) for r in triton_again)}/{len(triton_again)}",
            # Triton launchers the candidates' kernels asked for that were in their runner's cache (the judges' builds,
            # triton_launchers.py), of all they asked for
            "triton_launcher_hits": _launcher_hits(rows + triton_again),
        })
    kb = report.get("kernelbench_way")
    if kb:
        kb.update(per_candidate_s=kb["wall_s"] / len(kb["rows"]), statuses=sorted(r["status"] for r in kb["rows"]))
        report["speedup_over_kernelbench_way"] = kb["wall_s"] / wall
    return report


def merge_parts(paths: list[str | Path]) -> dict[str, Any]:
    """The reports of parts i/n of one batch (``--part``), added up: walls summed (each part's two ways ran in
    one run on one machine), rows joined, the GPU's busy share weighted by wall. Refuses parts of different
    batches, repeated parts, or a set that misses one."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    batches = {p.get("batch") for p in parts}
    if len(batches) != 1 or None in batches:
        raise ValueError(f"the reports are not parts of one batch: {sorted(map(str, batches))}")
    numbers = sorted(p.get("part") or "" for p in parts)
    total = int(numbers[0].split("/")[1]) if numbers[0] else 0
    if numbers != sorted(f"{i}/{total}" for i in range(1, total + 1)):
        raise ValueError(f"parts {numbers} are not 1..{total} of {total}, once each")
    busy = [(p["gpu_busy"], p["wall_s"]) for p in parts]
    merged = {**{k: parts[0][k] for k in ("size", "backend", "workers_per_device", "batch", "devices")},
              "part": None, "parts_merged": total, "problems": sum(p["problems"] for p in parts),
              "wall_s": sum(p["wall_s"] for p in parts), "rows": [r for p in parts for r in p["rows"]],
              "cuda_again": [r for p in parts for r in p.get("cuda_again") or []],
              "triton_again": [r for p in parts for r in p.get("triton_again") or []],
              "gpu_busy": (sum(b * w for b, w in busy) / sum(w for _, w in busy)
                           if all(b is not None for b, _ in busy) else None),
              "held_coverage": (sum(p["held_coverage"] * p["wall_s"] for p in parts) / sum(p["wall_s"] for p in parts)
                                if all(p.get("held_coverage") is not None for p in parts) else None)}
    if all(p.get("kernelbench_way") for p in parts):
        merged["kernelbench_way"] = {"wall_s": sum(p["kernelbench_way"]["wall_s"] for p in parts),
                                     "rows": [r for p in parts for r in p["kernelbench_way"]["rows"]]}
    return summarize(merged)


def format_batch(report: dict[str, Any]) -> str:
    def f(v: Any, spec: str = ".2f") -> str:
        return format(v, spec) if isinstance(v, int | float) else "-"

    t = report["targets"]
    part = (f", part {report['part']}" if report.get("part") else
            f", {report['parts_merged']} parts added up" if report.get("parts_merged") else "")
    lines = [f"{report['candidates']} candidates on {report['problems']} problems ({report['size']} size{part}), "
             f"devices {', '.join(report['devices'])}",
             f"Evaluator: {f(report['wall_s'], '.1f')} s, {f(report['per_candidate_s'])} s per candidate, "
             f"{f(report['evaluations_per_gpu_hour'], '.0f')} evaluations per GPU-hour, GPU busy "
             f"{f(report['gpu_busy'], '.0%')}, build-cache hits {report['build_cache_hits']} "
             f"({report.get('build_cache_reused', '-')} up to date)",
             "stage medians (s): " + ", ".join(f"{k} {v:.3f}" for k, v in report["stage_median_s"].items()),
             f"device held {f(report.get('held_coverage'), '.0%')} of the wall (the union of the jobs' holds); held "
             "seconds, summed: " + (", ".join(f"{k} {v:.1f}" for k, v in (report.get("held_split_s") or {}).items())
                                    or "-"),
             "runner start-up medians (s): " + (", ".join(f"{k} {v:.3f}" for k, v in
                                                      report.get("runner_startup_median_s", {}).items()) or "-"),
             "correctness stage, summed (s): " + (", ".join(f"{k} {v:.1f}" for k, v in
                                                          report.get("correctness_total_s", {}).items()) or "-"),
             "memfd payloads, summed (s): " + (", ".join(f"{k} {v:.1f}" for k, v in
                                                       report.get("payload_total_s", {}).items()) or "-"),
             "judge's device memory, most held in a stage (MiB, the problem): " + (", ".join(
                 f"{k} {v[0]} ({v[1]})" for k, v in (report.get("judge_memory_peak_mib") or {}).items()) or "-"),
             "out of device memory beside another job, run again alone: {retried_alone}; jobs alone: {alone}; "
             "workers stopped for them: {evicted}".format(**report.get("turns", {"alone": "-", "retried_alone": "-",
                                                                                   "evicted": "-"})),
             "paused for another worker's measurement: {paused} jobs; their queued GPU work read: {check}; killed for "
             "it: {gpu_killed}".format(**{"paused": "-", "gpu_killed": "-", **report.get("pauses", {}),
                                          "check": ", ".join(f"{k} {v}" for k, v in
                                                             report.get("pauses", {}).get("gpu_check", {}).items())
                                          or "-"}),
             "float64 second opinions: {jobs} jobs ({on_host} on the host), the judge's correctness seconds in them "
             "{judge_s:.1f}; forwards after the load: {ran} ({seconds:.1f} s)".format(
                 **{"jobs": "-", "on_host": "-", "judge_s": 0.0, **report.get("float64", {}),
                    "ran": "-", "seconds": 0.0, **report.get("load_forward", {})}),
             "statuses: " + "; ".join(f"{k}: {','.join(sorted(set(v)))}" for k, v in report["statuses"].items() if v),
             f"CUDA cold: load {f(t['cuda_cold_load_s'])} s, own time {f(t['cuda_cold_total_s'])} s; again: "
             f"{t['cuda_cache_hits']} cache hits, load {f(t['cuda_cache_hit_load_s'])} s, own time "
             f"{f(t['cuda_cache_hit_total_s'])} s; Triton on a warm worker: {f(t['triton_warm_total_s'])} s, again: "
             f"{f(t.get('triton_again_total_s'))} s ({t.get('triton_again_kept', '-')} with kept kernels; Triton "
             f"launchers found built: {t.get('triton_launcher_hits', '-')}) (medians; "
             "own time: total less the waits behind the batch, for a worker, for the device and paused for "
             "another worker's measurement)"]
    if report.get("headers_wait_s") is not None:
        lines.append(f"precompiled header for CUDA builds: waited {f(report['headers_wait_s'], '.1f')} s after the "
                     "warm-up, before the clock (once per machine and toolchain)")
    kb = report.get("kernelbench_way")
    if kb:
        lines.append(f"KernelBench way: {f(kb['wall_s'], '.1f')} s, {f(kb['per_candidate_s'])} s per candidate; "
                     f"the Evaluator is {f(report['speedup_over_kernelbench_way'])}x faster")
    return "\n".join(lines)
