"""Reference-as-candidate on several devices at once: does every GPU of a host judge alike?

    python3 -P scripts/refcopy_devices.py [--devices cuda:0,cuda:1] [--dataset official] [--problems 16]
                                          [--size auto] [--out DIR]

The multi-GPU issue's check: each problem's reference submitted as its own candidate on every device, one
Evaluator per device, all running at once (as a service spread over the host's GPUs runs). Every speedup should
be inside [0.98, 1.02], and a problem's baseline should measure within 2% on either device. Problems are taken in
a spread over levels 1 and 2, smallest outputs first. Each device's results go to DIR/results-DEVICE.jsonl (so
``kb-gym timeline DIR/results-*.jsonl`` shows, from the record, that no two timings shared a GPU); the table
and a JSON summary (DIR/refcopy-devices.json) are printed and written at the end. Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from kb_gym import Evaluator
from kb_gym.device_timeline import overlap_report, timelines
from kb_gym.evaluator import resolve_devices
from kb_gym.problems import load_problems, reference_as_candidate
from kb_gym.problems.eager_trace import output_gb

SPEEDUP_BAND = (0.98, 1.02)
BASELINE_AGREEMENT = 0.02


def choose(dataset: str, size: str, count: int) -> list:
    problems = [p for level in (1, 2) for p in load_problems(dataset, level=level, size=size)]
    chosen = problems[::max(1, len(problems) // count)][:count]
    return sorted(chosen, key=output_gb)


def run(devices: list[str], problems: list, out: Path) -> list[dict]:
    results: list[dict] = [{} for _ in devices]  # by position: a device may be named twice (cpu,cpu on the CPU)

    def one_device(k: int, device: str) -> None:
        path = out / f"results-{k}-{device.replace(':', '')}.jsonl"
        with Evaluator(device, results_path=str(path), baseline_cache=False) as ev:
            ev.warm()
            for p in problems:
                r = ev.evaluate(p, reference_as_candidate(p))
                results[k][p.key] = r
                print(f"{device} {p.key:<48} {r.status:<13} speedup {_f(r.speedup)} ref {_f(r.ref_runtime_ms)} ms "
                      f"flags {r.flags} {(r.error or '')[:200]}", flush=True)

    threads = [threading.Thread(target=one_device, args=(k, d), name=d) for k, d in enumerate(devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _f(value: float | None) -> str:
    return f"{value:.3f}" if isinstance(value, float | int) else "-"


def summarize(devices: list[str], problems: list, results: list[dict]) -> dict:
    rows, failures = [], []
    for p in problems:
        got = [by_key.get(p.key) for by_key in results]
        speedups = [r.speedup if r is not None else None for r in got]
        refs = [r.ref_runtime_ms if r is not None else None for r in got]
        spread = (max(refs) / min(refs) - 1) if all(refs) else None
        inside = all(s is not None and SPEEDUP_BAND[0] <= s <= SPEEDUP_BAND[1] for s in speedups)
        agree = spread is not None and spread <= BASELINE_AGREEMENT
        rows.append({"problem": p.key, "speedups": speedups, "ref_ms": refs, "baseline_spread": spread,
                     "statuses": [r.status if r is not None else "missing" for r in got],
                     "inside_band": inside, "baselines_agree": agree})
        if not (inside and agree):
            failures.append(p.key)
    every = [r for by_key in results for r in by_key.values()]
    gpu_overlaps = sum(len(line.overlaps) for key, line in timelines(every).items() if not key.endswith("/cpu"))
    return {"devices": devices, "problems": len(problems), "rows": rows, "failures": failures,
            "inside_band": sum(r["inside_band"] for r in rows),
            "baselines_agree": sum(r["baselines_agree"] for r in rows),
            "gpu_timing_overlaps": gpu_overlaps, "timeline": overlap_report(every)}


def table(summary: dict) -> str:
    devices = summary["devices"]
    head = ("| problem | " + " | ".join(f"speedup {d}" for d in devices) + " | "
            + " | ".join(f"baseline ms {d}" for d in devices) + " | baseline spread |")
    lines = [head, "|" + "---|" * (2 + 2 * len(devices))]
    for row in summary["rows"]:
        spread = f"{row['baseline_spread']:.1%}" if row["baseline_spread"] is not None else "-"
        lines.append(f"| `{row['problem']}` | " + " | ".join(_f(s) for s in row["speedups"]) + " | "
                     + " | ".join(_f(v) for v in row["ref_ms"]) + f" | {spread} |")
    lines.append(f"\n{summary['inside_band']} of {summary['problems']} problems inside [0.98, 1.02] on every device; "
                 f"{summary['baselines_agree']} with baselines within 2% across devices; "
                 f"{summary['gpu_timing_overlaps']} pairs of timings shared a GPU")
    lines.append(summary["timeline"])
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default="cuda", help="the devices compared (default: every visible GPU)")
    ap.add_argument("--dataset", default="official")
    ap.add_argument("--size", default="auto", help="problem size: auto (gpu on GPUs), gpu or cpu")
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--out", default="refcopy_devices")
    args = ap.parse_args()
    devices = resolve_devices(args.devices)
    if len(devices) < 2:
        print(f"refcopy_devices: needs two devices or more, got {devices}", file=sys.stderr)
        return 2
    size = args.size if args.size != "auto" else ("gpu" if all(d.startswith("cuda") for d in devices) else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    problems = choose(args.dataset, size, args.problems)
    t0 = time.perf_counter()
    summary = summarize(devices, problems, run(devices, problems, out))
    summary["wall_s"] = time.perf_counter() - t0
    (out / "refcopy-devices.json").write_text(json.dumps(summary, indent=1))
    print(table(summary))
    print(f"{summary['wall_s']:.0f} s")
    return int(bool(summary["failures"]) or summary["gpu_timing_overlaps"] > 0)


if __name__ == "__main__":
    sys.exit(main())
