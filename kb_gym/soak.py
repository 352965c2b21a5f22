"""``kb-gym soak``: many evaluations mixing faulty candidates with honest ones.

Reports what must stay at zero (exceptions out of the evaluator, results missing from the store)
and what must not keep growing (evaluator and worker memory, device memory between evaluations).
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any

import psutil

from kb_gym.config import EvalConfig
from kb_gym.evaluator import Evaluator, resolve_devices
from kb_gym.problems import get_problem, load_problems
from kb_gym.problems.solutions import solution_files

_HEAD = "import os, sys, time, torch\n"
_TAIL = "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        {body}\n"

# name -> (prelude, forward body). Mixed so that some restart the worker and most do not.
FAULTS: dict[str, tuple[str, str]] = {
    "exception": ("", "raise ValueError('bad kernel')"),
    "wrong": ("", "return torch.relu(x) + 1"),
    "syntax": ("def broken(:\n", "return x"),
    "format": ("", ""),
    "import_error": ("import not_a_module\n", "return x"),
    "os_exit": ("os._exit(7)\n", "return x"),
    "segfault": ("import ctypes\n", "return ctypes.string_at(0)"),
    "hang": ("", "while True: pass"),
    "print_flood": ("", "sys.stdout.write('x' * (8 << 20)); return torch.relu(x)"),
    "children": ("import subprocess\nsubprocess.Popen(['sleep', '120'], start_new_session=True)\n",
                 "return torch.relu(x)"),
    "device_oom": ("", "return torch.empty(1 << 42, dtype=torch.uint8, device=x.device)"),
    "kill_parent": ("import signal\nos.kill(os.getppid(), signal.SIGKILL)\n", "return torch.relu(x)"),
    # Patches of what the reference runs, and forged verdicts: they reach only the candidate's own runner.
    "patch_reference": ("_real = torch.relu\n"
                        "def _once(x):\n    torch.relu = _real\n    return torch.zeros_like(x)\n",
                        "torch.relu = _once; return torch.zeros_like(x)"),
    "forge_result": ("import stat\n"
                     "def _forge():\n"
                     "    for fd in range(3, 64):\n"
                     "        try:\n"
                     "            if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
                     "                os.write(fd, b'{\"type\": \"result\", \"status\": \"correct\"}\\n')\n"
                     "        except OSError:\n"
                     "            pass\n",
                     "_forge(); return torch.relu(x)"),
}


def _fault_source(name: str) -> str:
    prelude, body = FAULTS[name]
    if name == "format":
        return "I would write a kernel here, but no code today."
    return _HEAD + prelude + _TAIL.format(body=body)


def _rss_mb(pid: int, children: bool = True) -> float:
    try:
        proc = psutil.Process(pid)
        procs = [proc, *(proc.children(recursive=True) if children else [])]
        return sum(p.memory_info().rss for p in procs) / 2**20
    except psutil.Error:
        return 0.0


def _gpu_used_mb() -> float | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info(0)
        return (total - free) / 2**20
    except Exception:  # noqa: BLE001
        return None


def _sample(ev: Evaluator, me: int) -> dict[str, Any]:
    """Memory between evaluations: the evaluator, its workers (summed) and the device."""
    pids = [w["pid"] for w in ev.worker_stats if w["pid"]]
    return {"jobs": sum(w["jobs"] for w in ev.worker_stats), "evaluator_rss_mb": _rss_mb(me, children=False),
            "worker_rss_mb": sum(_rss_mb(pid) for pid in pids) if pids else None, "gpu_used_mb": _gpu_used_mb()}


def run_soak(n: int = 1000, fault_rate: float = 0.2, device: str = "auto", seed: int = 0,
             max_minutes: float = 60.0, out: str | None = None, workers_per_device: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    problems = load_problems("builtin", size="cpu")  # many evaluations fast: the small size on any device
    on_gpu = all(d.startswith("cuda") for d in resolve_devices(device))
    honest = [(get_problem(problems, name=f"{p.parent.name}/{p.stem}"), p.read_text())
              for p in solution_files("cuda" if on_gpu else "cpu")]
    relu = get_problem(problems, name="level1/1_ReLU")
    results_path = Path(tempfile.mkdtemp(prefix="kb_gym_soak_")) / "results.jsonl"
    cfg = EvalConfig(trials=2, timing_min_reps=5, timing_max_reps=10, timing_max_seconds=2,
                     correctness_timeout=5, load_timeout=60, timing_timeout=30,
                     integrity="off")  # faults must reach the worker, not stop at the static checks
    stats: dict[str, Any] = {"n": 0, "faults": {}, "statuses": {}, "evaluator_exceptions": 0,
                             "samples": [], "walls": []}
    started = time.monotonic()
    deadline = started + max_minutes * 60
    me = psutil.Process().pid
    with Evaluator(device, config=cfg, results_path=results_path, workers_per_device=workers_per_device) as ev:
        ev.warm()
        start_rss, start_gpu = _rss_mb(me, children=False), _gpu_used_mb()
        in_flight: dict[Future, float] = {}  # one job per worker: a queue would inflate the walls

        def settle() -> None:
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in done:
                t0 = in_flight.pop(future)
                try:
                    r = future.result()
                    stats["statuses"][r.status] = stats["statuses"].get(r.status, 0) + 1
                except Exception as exc:  # noqa: BLE001 - this is what the soak counts
                    stats["evaluator_exceptions"] += 1
                    stats.setdefault("exception_examples", []).append(repr(exc)[:300])
                stats["walls"].append(time.perf_counter() - t0)
                stats["n"] += 1

        for i in range(n):
            if time.monotonic() > deadline:
                break
            if rng.random() < fault_rate:
                name = rng.choice(list(FAULTS))
                problem, source = relu, _fault_source(name)
                stats["faults"][name] = stats["faults"].get(name, 0) + 1
            else:
                problem, source = rng.choice(honest)
            while len(in_flight) >= len(ev.worker_stats):
                settle()
            t0 = time.perf_counter()
            try:
                in_flight[ev.submit(problem, source)] = t0
            except Exception as exc:  # noqa: BLE001
                stats["evaluator_exceptions"] += 1
                stats.setdefault("exception_examples", []).append(repr(exc)[:300])
                stats["n"] += 1
            if i % 50 == 0:
                while in_flight:  # memory is sampled between evaluations, with every worker idle
                    settle()
                stats["samples"].append(_sample(ev, me))
        while in_flight:
            settle()
        stats["samples"].append(_sample(ev, me))
        stats["elapsed_s"] = time.monotonic() - started
        stats["worker_restarts"] = sum(w["restarts"] for w in ev.worker_stats)
        stats["workers"] = len(ev.worker_stats)
    lines = sum(1 for _ in open(results_path))
    stats.update(results_recorded=lines, lost_results=stats["n"] - lines,
                 start_evaluator_rss_mb=start_rss, start_gpu_used_mb=start_gpu,
                 median_wall_s=statistics.median(stats["walls"]) if stats["walls"] else None,
                 mean_wall_s=statistics.fmean(stats["walls"]) if stats["walls"] else None)
    walls = stats.pop("walls")
    stats["total_s"] = sum(walls)
    if out:
        Path(out).write_text(json.dumps(stats, indent=1))
    return stats


def format_soak(stats: dict[str, Any]) -> str:
    first, last = stats["samples"][0], stats["samples"][-1]
    return "\n".join([
        f"evaluations: {stats['n']} ({sum(stats['faults'].values())} faulty: "
        + ", ".join(f"{k} {v}" for k, v in sorted(stats["faults"].items())) + ")",
        "statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(stats["statuses"].items())),
        f"evaluator exceptions: {stats['evaluator_exceptions']} (must be 0)",
        f"lost results: {stats['lost_results']} of {stats['n']} (must be 0)",
        f"worker restarts: {stats['worker_restarts']}",
        f"time per evaluation: median {stats['median_wall_s']:.3f}s, mean {stats['mean_wall_s']:.3f}s, "
        f"{stats['elapsed_s']:.0f}s elapsed on {stats['workers']} worker(s)",
        f"evaluator RSS: {first['evaluator_rss_mb']:.0f} MB at start -> {last['evaluator_rss_mb']:.0f} MB at end",
        f"worker RSS: {first['worker_rss_mb'] or 0:.0f} MB -> {last['worker_rss_mb'] or 0:.0f} MB "
        f"(max {max((s['worker_rss_mb'] or 0) for s in stats['samples']):.0f} MB)",
        f"GPU memory in use between evaluations: {first['gpu_used_mb']} MB -> {last['gpu_used_mb']} MB",
    ])
