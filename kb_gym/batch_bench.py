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

import hashlib
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

from kb_gym.batch_report import summarize
from kb_gym.evaluator import Evaluator, resolve_devices
from kb_gym.problems import Problem, ProblemError, load_problems, reference_as_candidate
from kb_gym.problems.solutions import solution_backend, solution_files
from kb_gym.worker import neighbours

OFFICIAL = ["level1/19_ReLU", "level1/23_Softmax", "level1/36_RMSNorm_", "level1/1_Square_matrix_multiplication_",
            "level2/1_Conv2D_ReLU_BiasAdd", "level2/12_Gemm_Multiply_LeakyReLU",
            "level2/40_Matmul_Scaling_ResidualAdd", "level2/76_Gemm_Add_ReLU"]
# Takes any init arguments, so that it fails in forward (runtime_error) on problems with init inputs too.
RAISES = ("import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self, *args, **kwargs):\n"
          "        super().__init__()\n    def forward(self, *args):\n        raise ValueError('no')\n")


EXPECTED = {"wrong": "incorrect", "raises": "runtime_error"}  # the others: correct


def build_batch(size: str, problems: int = 16, device: str = "cuda") -> list[tuple[Problem, str, str]]:
    """(problem, kind, source) for the batch: four candidates per problem; our solutions are Triton or CUDA
    (kind "triton" or "cuda"), the CUDA ones only where ``device`` is a GPU. Half the problems are built-in
    ones with a solution of ours, spread over the levels and backends (_spread), half official ones."""
    builtin = {p.key: p for p in load_problems("builtin", size=size)}
    files = {key: f for f in solution_files(device) if (key := f"{f.parent.name}/{f.stem}") in builtin}
    ours = _spread(files)
    chosen = [builtin[k] for k in ours[: problems // 2]]
    try:
        official = {p.key: p for p in load_problems("official")}
        chosen += [official[k] for k in OFFICIAL if k in official]
    except ProblemError:  # no official set here: built-in problems only
        pass
    chosen += [builtin[k] for k in ours[problems // 2:]]
    batch = []
    for p in chosen[:problems]:
        copy = reference_as_candidate(p)
        solution = files.get(p.key) if p.key in builtin else None
        second = (p, solution_backend(solution), solution.read_text()) if solution else (p, "reference", copy)
        batch += [(p, "reference", copy), second, (p, "wrong", _scaled(copy)), (p, "raises", RAISES)]
    return batch


def _spread(files: dict[str, Path]) -> list[str]:
    """The solved problems in an order that takes turns over (level, backend) groups: on a GPU the first eight
    are four CUDA and four Triton solutions over all three levels (sorted by name they were eight level-1
    Triton ones, and the batch had no CUDA candidate)."""
    groups: dict[tuple[str, bool], list[str]] = {}
    for key in sorted(files):
        groups.setdefault((key.split("/")[0], solution_backend(files[key]) != "cuda"), []).append(key)
    order, queues = [], [groups[g] for g in sorted(groups)]
    while any(queues):
        order += [q.pop(0) for q in queues if q]
    return order


def batch_part(batch: list[tuple[Problem, str, str]], part: tuple[int, int]) -> list[tuple[Problem, str, str]]:
    """Part ``i`` of ``n`` of the batch, whole problems dealt out in turn (``kb-gym bench --batch --part i/n``):
    the KernelBench way of the full batch takes longer than one 10-minute call on the device, so each call
    measures both ways on one part, and ``merge_parts`` adds the parts up."""
    i, n = part
    if not 1 <= i <= n:
        raise ValueError(f"part must be i/n with 1 <= i <= n, got {i}/{n}")
    keys = list(dict.fromkeys(p.key for p, _, _ in batch))
    mine = set(keys[i - 1::n])
    return [row for row in batch if row[0].key in mine]


def fingerprint(batch: list[tuple[Problem, str, str]]) -> str:
    """Which batch this is: the parts of one batch carry the same fingerprint."""
    digest = hashlib.sha256()
    for p, kind, source in batch:
        digest.update(f"{p.key}|{p.size}|{kind}|{hashlib.sha256(source.encode()).hexdigest()}\n".encode())
    return digest.hexdigest()[:16]


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
import importlib.util, json, sys, time, torch
problem_path, candidate_path, device = sys.argv[1:4]
trials, reps = int(sys.argv[4]), int(sys.argv[5])
out = {"status": "correct"}

def load(path, name):  # a module from its file, as KernelBench loads Triton candidates (@triton.jit reads the source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return vars(module)

try:
    ns_ref = load(problem_path, "kb_problem")
    try:
        ns_new = load(candidate_path, "kb_candidate")
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


def _probe_note(r: Any) -> str:
    """The probe check's reading in a progress line: forward / claim (ms), gaps, charged."""
    probe = ((r.correctness or {}).get("envelope") or {}).get("probe")
    if not probe:
        return ""
    if "skipped" in probe:
        return f" probe skipped ({probe['skipped'][:80]})"
    return (f" probe {probe['forward_ms']:.4f}/{probe['claimed_ms']:.4f} ms gaps {probe['gaps']:.0f}"
            f"/{probe['spare_gaps']:.0f} tol {probe['tolerance_ms']:.4f}"
            + (f" CHARGED {probe['charged_ms']:.4f} {probe.get('unverified', '')}" if probe["counted"] else ""))


def run_batch(device: str = "auto", size: str = "gpu", problems: int = 16, kernelbench_way_too: bool = True,
              out: str | None = None, backend: str = "local", workers_per_device: int = 1,
              part: tuple[int, int] | None = None, warm_builds: bool = False) -> dict[str, Any]:
    """``backend="ray"``: the same batch through the Ray service (a local cluster, one worker per device),
    to compare its wall with the local backend's (docs/distributed.md). ``workers_per_device`` (local): 2 lets
    one worker load and compile while the other holds the device (the pipeline of docs/evaluation.md).
    ``part`` (i, n): only part i of n of the batch, both ways (batch_part); batch_report.merge_parts adds the
    parts' reports up. After the timed batch, the CUDA and Triton candidates are evaluated once more, untimed by the
    wall: their loads then come from the build cache (``cuda_again``), their kernels from Triton's kept ones where
    those are on (``triton_again``). ``warm_builds``: the CUDA candidates are
    built (evaluated once) before the clock starts, so that two runs compared with each other (local against
    Ray) do not differ by nvcc's own variation; the cold-build figures are then absent."""
    on_gpu = all(d.startswith("cuda") for d in resolve_devices(device))
    whole = build_batch(size, problems, "cuda" if on_gpu else "cpu")
    batch = batch_part(whole, part) if part else whole
    report: dict[str, Any] = {"candidates": len(batch), "problems": len({p.key for p, _, _ in batch}), "size": size,
                              "backend": backend, "workers_per_device": workers_per_device,
                              "batch": fingerprint(whole), "part": f"{part[0]}/{part[1]}" if part else None,
                              "builds_warmed": warm_builds}
    with _evaluator(backend, device, workers_per_device) as ev:
        ev.warm()
        report["headers_wait_s"] = _wait_for_headers(ev.devices)
        if warm_builds:
            for f in [ev.submit(p, s) for p, k, s in batch if k == "cuda"]:
                f.result()
        trials = ev.config.trials
        sampler = BusySampler()
        report["started_at"] = time.time()  # the wall clock of the rows' held_at
        t0 = time.perf_counter()
        futures = [ev.submit(p, s) for p, _, s in batch]
        # A line per result as it lands: a run cut by a time limit still leaves what it measured.
        for n, future in enumerate(as_completed(futures), 1):
            (p, kind, _), r = batch[futures.index(future)], future.result()
            surprise = r.status != EXPECTED.get(kind, "correct")  # why, for a verdict the kind should not get
            stages = " ".join(f"{k} {v:.2f}" for k, v in r.stage_seconds.items() if k != "total")
            print(f"[{n}/{len(batch)} {time.perf_counter() - t0:.1f}s] {p.key} {kind}: {r.status} speedup "
                  f"{r.speedup} stages: {stages} shm {r.worker.get('shm_payloads')} "
                  f"dev {r.worker.get('device_payloads')} pinned {r.worker.get('payload_pinned')}{_probe_note(r)}"
                  + (f" alone (stopped {r.worker.get('evicted', 0)}"
                     + (", after running out of memory beside another job)" if r.worker.get("retried_alone") else ")")
                     if r.worker.get("alone") else "")
                  + (f" flags {r.flags} error {(r.error or '')[:400]!r}" if surprise else ""), flush=True)
        results = [f.result() for f in futures]
        wall = time.perf_counter() - t0
        busy = sampler.stop()
        devices = ev.devices
        # our CUDA and Triton solutions once more, outside the wall: a source seen before (the build cache; Triton's
        # kept kernels where KB_GYM_TRITON_CACHE=1)
        again = [(p, k, ev.submit(p, s)) for p, k, s in batch if k in ("cuda", "triton")]
        again_rows = [row_of(p, k, f.result()) for p, k, f in again]
    report.update(wall_s=wall, gpu_busy=busy, devices=devices,
                  rows=[row_of(p, k, r) for (p, k, _), r in zip(batch, results, strict=True)],
                  cuda_again=[r for r in again_rows if r["kind"] == "cuda"],
                  triton_again=[r for r in again_rows if r["kind"] == "triton"])
    if kernelbench_way_too:
        dev = devices[0]
        started = time.perf_counter()
        rows = []
        for n, (p, kind, s) in enumerate(batch, 1):  # a line per candidate: a run cut short still says how far
            rows.append(kernelbench_way(p, s, dev, trials, reps=100))
            print(f"[KernelBench way {n}/{len(batch)} {time.perf_counter() - started:.1f}s] {p.key} {kind}: "
                  f"{rows[-1]['status']} in {rows[-1]['wall_s']:.1f} s", flush=True)
        report["kernelbench_way"] = {"wall_s": time.perf_counter() - started, "rows": rows}
    report = summarize(report)
    if out:
        Path(out).write_text(json.dumps(report, indent=1, default=str))
    return report


def _wait_for_headers(devices: list[str], timeout: float = 240.0) -> float | None:
    """Seconds waited for the precompiled header the judges start at warm-up (pch.prebuild), so that the
    batch's cold CUDA builds are those of a machine set up once, as a trainer's are after its first minute;
    None where the judges build without one (a CPU batch, ``KB_GYM_PCH=0``, no build cache)."""
    if not devices or not devices[0].startswith("cuda"):
        return None
    import torch

    from kb_gym.worker import pch
    from kb_gym.worker.job import headers_root
    from kb_gym.workers import extensions_dir

    root = headers_root(torch.device(devices[0]), extensions_dir())
    if root is None:
        return None
    t0 = time.perf_counter()
    pch.wait_ready(root, "cuda", timeout)
    return time.perf_counter() - t0


FLOAT64_KEYS = ("float64", "judged_against_float64")
ERROR_CHARS = 300  # of a verdict's message, in its row


def row_of(problem: Problem, kind: str, r: Any) -> dict[str, Any]:
    return {"problem": problem.key, "kind": kind, "status": r.status, "speedup": r.speedup,
            "stages": dict(r.stage_seconds), "total_s": r.stage_seconds.get("total"),
            "build_cached": bool(r.worker.get("build_cached")), "build_reused": r.worker.get("build_reused"),
            "triton_cached": r.worker.get("triton_cached", 0),  # kept Triton kernels restored (triton_cache.py)
            "triton_launchers": r.worker.get("triton_launchers"),  # judge-built launchers (triton_launchers.py)
            "worker_pid": r.worker.get("pid"), "runner_startup": r.worker.get("runner_startup_phases") or {},
            # where the correctness stage and the outputs' crossings went (correctness.run_trials, runner_client)
            "correctness_seconds": (r.correctness or {}).get("seconds") or {},
            # the judge's device memory by stage, MiB: [held, reserved, most held during it] (job._memory_mark)
            "judge_memory_mib": (r.correctness or {}).get("judge_memory_mib") or {},
            "payload_seconds": r.worker.get("payload_seconds") or {}, "flags": list(r.flags),
            "shm_payloads": r.worker.get("shm_payloads"), "device_payloads": r.worker.get("device_payloads"),
            "probe": ((r.correctness or {}).get("envelope") or {}).get("probe"),
            "device": r.device, "held_at": r.worker.get("held_at"),
            # device_turns: run with the device to itself (and why), the device's other workers it stopped
            "alone": bool(r.worker.get("alone")), "retried_alone": r.worker.get("retried_alone"),
            "evicted": r.worker.get("evicted", 0),
            # paused for another worker's measurement: whether its queued GPU work was read (gpu_activity.py), and
            # whether that reading killed it
            "neighbour_gpu_check": r.worker.get("neighbour_gpu_check") or "",
            "gpu_killed": r.status == "runtime_error" and neighbours.GPU_KILLED in (r.error or ""),
            # the float64 opinion's share of a held correctness stage: how often, where, and on the quick path
            "float64": {k: v for k, v in (r.correctness or {}).items() if k.startswith(FLOAT64_KEYS)},
            "load_forward": r.worker.get("load_forward"),  # the forward after the load (load_forward.py), if on
            "error": (r.error or "")[:ERROR_CHARS]}


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
