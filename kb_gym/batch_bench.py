"""``kb-gym bench --batch``: a fixed, mixed batch of candidates through the Evaluator, and the same batch
the KernelBench way (a fresh process per candidate, one after another, inputs built on the CPU), in one run.

The batch: for each of up to 16 problems (built-in problems that have a solution of ours, and official
L1/L2 problems where the official set is present), four candidates: the reference copied as
``ModelNew`` (PyTorch), our Triton or CUDA solution where there is one (CUDA only on a GPU; else the
reference again), a wrong
answer (the reference times 1.5) and one that raises in ``forward``. Reported: wall time, evaluations
per GPU-hour, the GPU's busy share (``nvidia-smi`` sampled every 100 ms; None without one), median
seconds per stage, statuses, build-cache hits, and the KernelBench way's wall beside it. The KernelBench
way runs our own candidates unsandboxed, as that harness does: it is a yardstick, never a way to run
untrusted code.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

from kb_gym.evaluator import Evaluator, resolve_devices
from kb_gym.problems import Problem, ProblemError, load_problems, reference_as_candidate
from kb_gym.problems.solutions import solution_backend, solution_files

OFFICIAL = ["level1/19_ReLU", "level1/23_Softmax", "level1/36_RMSNorm_", "level1/1_Square_matrix_multiplication_",
            "level2/1_Conv2D_ReLU_BiasAdd", "level2/12_Gemm_Multiply_LeakyReLU",
            "level2/40_Matmul_Scaling_ResidualAdd", "level2/76_Gemm_Add_ReLU"]
# Takes any init arguments, so that it fails in forward (runtime_error) on problems with init inputs too.
RAISES = ("import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self, *args, **kwargs):\n"
          "        super().__init__()\n    def forward(self, *args):\n        raise ValueError('no')\n")


EXPECTED = {"wrong": "incorrect", "raises": "runtime_error"}  # the others: correct


def build_batch(size: str, problems: int = 16, device: str = "cuda") -> list[tuple[Problem, str, str]]:
    """(problem, kind, source) for the batch: four candidates per problem; our solutions are Triton or CUDA
    (kind "triton" or "cuda"), the CUDA ones only where ``device`` is a GPU."""
    builtin = {p.key: p for p in load_problems("builtin", size=size)}
    files = {f"{f.parent.name}/{f.stem}": f for f in solution_files(device)}
    solved = sorted(files)
    chosen = [builtin[k] for k in solved if k in builtin][: problems // 2]
    try:
        official = {p.key: p for p in load_problems("official")}
        chosen += [official[k] for k in OFFICIAL if k in official]
    except ProblemError:  # no official set here: built-in problems only
        pass
    chosen += [builtin[k] for k in solved if k in builtin][problems // 2:]
    batch = []
    for p in chosen[:problems]:
        copy = reference_as_candidate(p)
        solution = files.get(p.key) if p.key in builtin else None
        second = (p, solution_backend(solution), solution.read_text()) if solution else (p, "reference", copy)
        batch += [(p, "reference", copy), second, (p, "wrong", _scaled(copy)), (p, "raises", RAISES)]
    return batch


def _scaled(copy: str) -> str:
    return copy + ("\n\n_forward = ModelNew.forward\n"
                   "def _wrong(self, *args):\n"
                   "    out = _forward(self, *args)\n"
                   "    floating = hasattr(out, 'is_floating_point') and out.is_floating_point()\n"
                   "    return out * 1.5 if floating else out + 1\n"
                   "ModelNew.forward = _wrong\n")


class BusySampler:
    """The GPU's utilisation, sampled by ``nvidia-smi`` every 100 ms while running (None without a GPU)."""

    def __init__(self, index: int = 0) -> None:
        self.samples: list[float] = []
        self._proc = None
        if shutil.which("nvidia-smi"):
            self._proc = subprocess.Popen(["nvidia-smi", f"--id={index}", "--query-gpu=utilization.gpu",
                                           "--format=csv,noheader,nounits", "-lms", "100"],
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                self.samples.append(float(line.strip()))
            except ValueError:
                pass

    def stop(self) -> float | None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=5)
        return statistics.mean(self.samples) / 100 if self.samples else None


_KB_WAY = r'''
import json, sys, time, torch
problem_path, candidate_path, device = sys.argv[1:4]
trials, reps = int(sys.argv[4]), int(sys.argv[5])
out = {"status": "correct"}
try:
    ns_ref, ns_new = {}, {}
    exec(open(problem_path).read(), ns_ref)
    try:
        exec(open(candidate_path).read(), ns_new)
    except Exception as exc:
        out.update(status="compile_error", error=repr(exc)[:200]); raise SystemExit
    torch.manual_seed(42)
    init = ns_ref["get_init_inputs"]()
    ref = ns_ref["Model"](*init).to(device)
    torch.manual_seed(42)
    new = ns_new["ModelNew"](*init).to(device)
    with torch.no_grad():
        for t in range(trials):
            torch.manual_seed(t)
            inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ns_ref["get_inputs"]()]
            if not torch.allclose(ref(*inputs), new(*inputs), atol=1e-2, rtol=1e-2):
                out.update(status="incorrect"); raise SystemExit
        times = []
        for _ in range(reps):
            if device.startswith("cuda"):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(); new(*inputs); end.record(); torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter(); new(*inputs); times.append((time.perf_counter() - t0) * 1e3)
        out["runtime_ms"] = sorted(times)[len(times) // 2]
except SystemExit:
    pass
except Exception as exc:
    out.update(status="runtime_error", error=repr(exc)[:200])
print(json.dumps(out))
'''


def kernelbench_way(problem: Problem, source: str, device: str, trials: int, reps: int,
                    timeout: float = 600.0) -> dict[str, Any]:
    """One candidate the KernelBench way: a fresh interpreter, the problem's inputs built on the CPU and
    copied to the device, ``trials`` allclose checks, ``reps`` timed calls with CUDA events."""
    folder = Path(tempfile.mkdtemp(prefix="kb_gym_kbway_"))
    (folder / "problem.py").write_text(problem.code)
    (folder / "candidate.py").write_text(source)
    t0 = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", _KB_WAY, str(folder / "problem.py"), str(folder / "candidate.py"),
                               device, str(trials), str(reps)], capture_output=True, text=True, timeout=timeout,
                              cwd=folder, env={**os.environ, "TORCH_EXTENSIONS_DIR": str(folder / "ext")})
        lines = done.stdout.strip().splitlines()
        row = json.loads(lines[-1]) if lines else {"status": "crash", "error": done.stderr[-200:]}
    except subprocess.TimeoutExpired:
        row = {"status": "timeout"}
    row["wall_s"] = time.perf_counter() - t0
    shutil.rmtree(folder, ignore_errors=True)
    return row


def run_batch(device: str = "auto", size: str = "gpu", problems: int = 16, kernelbench_way_too: bool = True,
              out: str | None = None, backend: str = "local", workers_per_device: int = 1) -> dict[str, Any]:
    """``backend="ray"``: the same batch through the Ray service (a local cluster, one worker per device),
    to compare its wall with the local backend's (docs/distributed.md). ``workers_per_device`` (local): 2 lets
    one worker load and compile while the other holds the device (the pipeline of docs/evaluation.md)."""
    on_gpu = all(d.startswith("cuda") for d in resolve_devices(device))
    batch = build_batch(size, problems, "cuda" if on_gpu else "cpu")
    report: dict[str, Any] = {"candidates": len(batch), "problems": len({p.key for p, _, _ in batch}), "size": size,
                              "backend": backend, "workers_per_device": workers_per_device}
    with _evaluator(backend, device, workers_per_device) as ev:
        ev.warm()
        trials = ev.config.trials
        sampler = BusySampler()
        t0 = time.perf_counter()
        futures = [ev.submit(p, s) for p, _, s in batch]
        # A line per result as it lands: a run cut by a time limit still leaves what it measured.
        for n, future in enumerate(as_completed(futures), 1):
            (p, kind, _), r = batch[futures.index(future)], future.result()
            surprise = r.status != EXPECTED.get(kind, "correct")  # why, for a verdict the kind should not get
            stages = " ".join(f"{k} {v:.2f}" for k, v in r.stage_seconds.items() if k != "total")
            print(f"[{n}/{len(batch)} {time.perf_counter() - t0:.1f}s] {p.key} {kind}: {r.status} speedup "
                  f"{r.speedup} stages: {stages} shm {r.worker.get('shm_payloads')} "
                  f"pinned {r.worker.get('payload_pinned')}"
                  + (f" flags {r.flags} error {(r.error or '')[:400]!r}" if surprise else ""), flush=True)
        results = [f.result() for f in futures]
        wall = time.perf_counter() - t0
        busy = sampler.stop()
        devices = ev.devices
    stages: dict[str, list[float]] = {}
    for r in results:
        for stage, seconds in r.stage_seconds.items():
            stages.setdefault(stage, []).append(seconds)
    report.update(wall_s=wall, per_candidate_s=wall / len(batch), gpu_busy=busy, devices=devices,
                  evaluations_per_gpu_hour=3600 * len(batch) / (wall * max(1, len(devices))),
                  stage_median_s={k: statistics.median(v) for k, v in stages.items()},
                  statuses={kind: sorted(r.status for (_, k, _), r in zip(batch, results, strict=True) if k == kind)
                            for kind in ("reference", "triton", "wrong", "raises")},
                  build_cache_hits=sum(bool(r.worker.get("build_cached")) for r in results),
                  rows=[{"problem": p.key, "kind": k, "status": r.status, "speedup": r.speedup,
                         "total_s": r.stage_seconds.get("total")} for (p, k, _), r in zip(batch, results, strict=True)])
    if kernelbench_way_too:
        dev = devices[0]
        started = time.perf_counter()
        rows = []
        for n, (p, kind, s) in enumerate(batch, 1):  # a line per candidate: a run cut short still says how far
            rows.append(kernelbench_way(p, s, dev, trials, reps=100))
            print(f"[KernelBench way {n}/{len(batch)} {time.perf_counter() - started:.1f}s] {p.key} {kind}: "
                  f"{rows[-1]['status']} in {rows[-1]['wall_s']:.1f} s", flush=True)
        kb_wall = time.perf_counter() - started
        report["kernelbench_way"] = {"wall_s": kb_wall, "per_candidate_s": kb_wall / len(batch),
                                     "statuses": sorted(r["status"] for r in rows), "rows": rows}
        report["speedup_over_kernelbench_way"] = kb_wall / wall
    if out:
        Path(out).write_text(json.dumps(report, indent=1, default=str))
    return report


def _evaluator(backend: str, device: str, workers_per_device: int = 1) -> Any:
    if backend == "local":
        return Evaluator(device, results_path=False, workers_per_device=workers_per_device)
    if backend != "ray":
        raise ValueError(f"backend must be 'local' or 'ray', got {backend!r}")
    from kb_gym.evaluator import resolve_devices
    from kb_gym.service import RayEvaluator, require_ray

    ray = require_ray()
    devices = resolve_devices(device)
    if not ray.is_initialized():
        gpus = sum(d.startswith("cuda") for d in devices)
        ray.init(num_cpus=max(2, len(devices) + 1), num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    gpus = 1.0 if all(d.startswith("cuda") for d in devices) else 0.0
    return RayEvaluator(address=None, name="kb_gym_batch_bench", workers=len(devices), results_path="",
                        gpus_per_worker=gpus)


def format_batch(report: dict[str, Any]) -> str:
    def f(v: Any, spec: str = ".2f") -> str:
        return format(v, spec) if isinstance(v, int | float) else "-"

    lines = [f"{report['candidates']} candidates on {report['problems']} problems ({report['size']} size), "
             f"devices {', '.join(report['devices'])}",
             f"Evaluator: {f(report['wall_s'], '.1f')} s, {f(report['per_candidate_s'])} s per candidate, "
             f"{f(report['evaluations_per_gpu_hour'], '.0f')} evaluations per GPU-hour, GPU busy "
             f"{f(report['gpu_busy'], '.0%')}, build-cache hits {report['build_cache_hits']}",
             "stage medians (s): " + ", ".join(f"{k} {v:.3f}" for k, v in report["stage_median_s"].items()),
             "statuses: " + "; ".join(f"{k}: {','.join(sorted(set(v)))}" for k, v in report["statuses"].items())]
    kb = report.get("kernelbench_way")
    if kb:
        lines.append(f"KernelBench way: {f(kb['wall_s'], '.1f')} s, {f(kb['per_candidate_s'])} s per candidate; "
                     f"the Evaluator is {f(report['speedup_over_kernelbench_way'])}x faster")
    return "\n".join(lines)
