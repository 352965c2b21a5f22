"""One evaluation in the judge: load the reference, hand the candidate to a fresh runner, check, time.

The judge holds everything that decides a verdict (the reference model, the seeds and inputs, the
comparison, the baseline's timing, the clock that is believed, the channel to the evaluator) and
never imports candidate code: the candidate runs in a one-use runner process (runner.py) that
holds none of it. Returns plain data.
"""

from __future__ import annotations

import gc
import hashlib
import hmac
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from kb_gym.file_tree import remove_tree
from kb_gym.worker import (
    build_cache,
    load_forward,
    memory_history,
    neighbours,
    pch,
    triton_cache,
    triton_launchers,
)
from kb_gym.worker.checks import flatten_outputs
from kb_gym.worker.clock import CacheFlusher
from kb_gym.worker.correctness import TrialSetup, is_input, run_trials
from kb_gym.worker.gpu_activity import GpuActivity
from kb_gym.worker.inputs import DTYPES, clone_inputs, init_model, make_inputs
from kb_gym.worker.judge_timing import (
    SOL_MARGIN,
    compiled_baseline,
    spare_calibration,
    timed_chunk_bytes,
    timing_stage,
)
from kb_gym.worker.kernel_checks import dataflow_check, knockout_check
from kb_gym.worker.loading import (
    OUT_OF_DEVICE_MEMORY,
    StageError,
    load_module,
    out_of_device_memory,
    sticky_cuda_error,
    trim_traceback,
)
from kb_gym.worker.output_size import predicted_output_bytes
from kb_gym.worker.probe_clock import ProbeClock
from kb_gym.worker.protocol import encode
from kb_gym.worker.runner_pool import RunnerPool
from kb_gym.worker.timing import Calibration, gauged_inputs, harness_cpu

STAGE_MARGIN = 2.0  # seconds the judge keeps of a stage's limit to report a runner's timeout itself
# What one result may take on the wire: results are tens of kB; the protocol allows 8 MB a message
RESULT_BYTES = 1 << 20
# The build cache's hold after a load waits this long for the tree to stand still; a tree that does not (a thread
# in a long system call: GPU drivers' threads, or a candidate's on purpose) has its build kept once it is gone.
# 0.25 s was tried (session 17): round 2's calibration poison then got through in 2 of 3 local runs against 0 of 3
# at 2 s, for a reason not yet found, so the hold keeps its 2 s.
KEEP_SETTLE_SECONDS = 2.0
HARNESS_CALLS = 8  # timed reference calls in a candidate's runner before it loads the candidate (the first 2 warm up)


class WorkerContext:
    """What one judge keeps warm between evaluations."""

    def __init__(self, device: str, scratch_root: Path, send: Callable[[dict], None],
                 receive: Callable[[], dict | None] | None = None, runners: bool = True) -> None:
        self.device = torch.device(device)
        self.scratch_root = scratch_root
        self.receive = receive
        self.send = send
        self.flusher = CacheFlusher(self.device)
        self.jobs_done = 0
        self.compiled_baselines: dict[str, Any] = {}
        # (problem code, numerics) -> (time.monotonic() measured, Calibration): one spare calibration serves
        # every candidate of a problem for CALIBRATION_TTL_S (an RL batch meets each problem many times)
        self.calibrations: dict[tuple[str, str, bool, int], tuple[float, Calibration]] = {}
        self.peak_bytes_per_s, self.peak_flops = _device_peaks(self.device)
        self.secret = os.urandom(32)  # inputs' seeds are derived with it: never sent to a runner
        self.pool = RunnerPool(device, scratch_root) if runners else None
        # the device's other judges' calibrations of the job's problem, as the evaluator had them at the last grant
        self.granted_calibrations: list[dict[str, Any]] = []
        if self.pool is not None:
            self.pool.prestart()
        self.probe = start_probe(self.device, scratch_root) if self.pool is not None else None
        self.probe_restarts = 0
        self.harness_shares: dict[Any, Any] = {}  # probe_check.SpareReading per problem and path: the lowest share's
        self.output_bytes: dict[tuple[str, str], int] = {}  # (problem code, dtype): output_size's estimate
        # the job's runner stopped while another judge measures the device and this job does not hold it
        self.watcher: neighbours.PauseWatcher | None = None
        self.paused_waiting_s = 0.0  # of the job's pauses, the time it was waiting for the device anyway
        self.gpu_owner_check: tuple[GpuActivity | None, str] | None = None  # opened at the first watch

    def gpu_activity(self) -> GpuActivity | None:
        """NVML's per-process reading of the device for the pause watchers (gpu_activity.py), opened once; None where
        it cannot attribute work to this judge's runners (``gpu_owner_check[1]`` says why)."""
        if self.gpu_owner_check is None:
            self.gpu_owner_check = GpuActivity.open(self.device)
        return self.gpu_owner_check[0]

    def usable_probe(self) -> ProbeClock | None:
        """The judge's probe, a fresh one where the last failed (a reply late by 10 s, the process gone): up to
        PROBE_RESTARTS times in the judge's life, so that one failure does not leave every later candidate's short
        claim to the envelope alone. Past them the failure stands, and the check says so."""
        if self.probe is not None and self.probe.note and self.probe_restarts < PROBE_RESTARTS:
            self.probe.close()
            self.probe_restarts += 1
            self.probe = start_probe(self.device, self.scratch_root)
        return self.probe

    def predicted_output_bytes(self, problem_code: str, ref_mod: Any, dtype: torch.dtype) -> int:
        """output_size.predicted_output_bytes, once per problem and precision (0, unknown, is kept too: a forward
        the meta device cannot run in its budget is not tried again)."""
        key = (problem_code, str(dtype))
        if key not in self.output_bytes:
            self.output_bytes[key] = predicted_output_bytes(ref_mod, dtype)
        return self.output_bytes[key]

    def seed(self, job_seed: int, purpose: str, k: int = 0) -> int:
        digest = hmac.new(self.secret, f"{job_seed}:{purpose}:{k}".encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF

    def acquire_device(self, exclusive: bool = True) -> None:
        """Wait until the evaluator grants this judge the device (several judges share it: the
        stages that run on it, correctness and timing, take turns; loading and compiling do not).
        ``exclusive=False``: held beside other judges' stages that measure nothing, never beside a measurement
        (device_lock.py); asked again, the hold changes mode."""
        paused = 0.0
        if self.watcher is not None:  # the runner waits with the job: paused for the device's measurements meanwhile
            paused = self.watcher.paused_seconds()
            self.watcher.watch()
        self.send({"type": "acquire", "exclusive": exclusive})
        granted = self.receive() if self.receive is not None else None
        if self.watcher is not None:
            self.watcher.unwatch()
            self.paused_waiting_s += self.watcher.paused_seconds() - paused
            if self.watcher.verdict:
                raise StageError("runtime_error", self.watcher.verdict)
        if not granted or granted.get("type") != "granted":
            raise StageError("crash", f"expected the device grant from the evaluator, got {granted!r}", restart=True)
        shared = granted.get("calibrations")
        self.granted_calibrations = shared if isinstance(shared, list) else []

    def speed_of_light_ms(self, inputs: list[Any], outputs: Any, model: Any, flops: int | None) -> float | None:
        """A time no correct kernel can beat on this device, with a 25% margin: every input and
        parameter read once and every output written once at peak bandwidth, or the reference's
        operation count at peak dense-matrix throughput, whichever is longer."""
        if self.peak_bytes_per_s is None:
            return None
        tensors = [x for x in inputs if isinstance(x, torch.Tensor)] + flatten_outputs(outputs)
        tensors += list(model.parameters()) if isinstance(model, torch.nn.Module) else []
        moved = sum(t.numel() * t.element_size() for t in tensors)
        seconds = max(moved / self.peak_bytes_per_s, (flops or 0) / self.peak_flops)
        return SOL_MARGIN * seconds * 1e3


PROBE_RESTARTS = 3


def start_probe(device: torch.device, scratch_root: Path) -> ProbeClock | None:
    """The judge's probe process (probe_clock.py), started now so that it is ready by the first timing stage; on a
    GPU only, and not where KB_GYM_PROBE_CLOCK=0."""
    if device.type != "cuda" or os.environ.get("KB_GYM_PROBE_CLOCK", "1") == "0":
        return None
    try:
        return ProbeClock(str(device), scratch_root / "probe.log")
    except OSError:
        return None


# Dense tensor-core peaks (FLOP/s) by compute capability: the fastest arithmetic any kernel could
# use, so the floor stays below every honest candidate. Unknown GPUs get the largest.
_PEAK_FLOPS = MappingProxyType({(8, 0): 312e12, (8, 6): 150e12, (8, 9): 360e12, (9, 0): 990e12, (10, 0): 2250e12})


def _device_peaks(device: torch.device) -> tuple[float | None, float]:
    """Measured copy bandwidth (bytes/s, read + write) and the tabled peak FLOP/s; None on the CPU,
    where the interpreter makes any floor meaningless."""
    if device.type != "cuda":
        return None, 0.0
    props = torch.cuda.get_device_properties(device)
    flops = _PEAK_FLOPS.get((props.major, props.minor), max(_PEAK_FLOPS.values()))
    src = torch.empty(256 << 20, dtype=torch.float32, device=device)  # 1 GiB: far beyond L2
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    # The best observed copy, plus 20%: a kernel may beat a plain copy a little, never by much.
    return 2 * (1 << 30) / best * 1.2, flops


_WARM_UP_PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0

def get_inputs():
    return [torch.randn(64, 64)]

def get_init_inputs():
    return []
"""


def headers_root(device: torch.device, extensions: Path | None = None) -> Path | None:
    """The precompiled headers' folder for builds on ``device`` beside the build cache ``extensions`` (this
    judge's by default; pch.root_for), None where there is none."""
    extensions = extensions if extensions is not None else build_cache.extensions_root()
    return pch.root_for(extensions, build_cache.toolchain(device), device.type)


def warm_up(ctx: WorkerContext, config: dict[str, Any]) -> None:
    """One job before the first real one (with a candidate through a runner, where the judge has them),
    then freeze the heap.

    The first job imports hundreds of modules lazily (the flop counter pulls in sympy and dynamo);
    paying that at start-up keeps it out of the first candidate's stage times. Freezing what is
    alive afterwards takes it out of the collector's sight, so the full collection after every job
    costs ~1 ms instead of ~170 ms. A CUDA judge also starts the machine's precompiled header for CUDA
    candidates' builds, once (pch.prebuild)."""
    source = _WARM_UP_PROBLEM.replace("class Model(", "class ModelNew(") if ctx.pool is not None else None
    job = {"job_id": 0, "problem_code": _WARM_UP_PROBLEM, "problem_key": "warm_up", "source": source, "seed": 0,
           "config": {**config, "trials": 1, "timing_warmup": 1, "timing_min_reps": 3, "timing_max_reps": 3}}
    memory_history.start(ctx.device)
    send, ctx.send = ctx.send, lambda message: None  # the evaluator waits for "ready", not stages
    try:
        run_job(ctx, job)
    finally:
        ctx.send = send
    if ctx.pool is not None:
        pch.prebuild(headers_root(ctx.device), ctx.device.type)
    ctx.jobs_done = 0
    gc.collect()
    gc.freeze()


def run_job(ctx: WorkerContext, job: dict[str, Any]) -> dict[str, Any]:
    """Evaluate one job; never raises. The dict holds EvalResult fields plus ``restart``."""
    job_dir = ctx.scratch_root / f"job_{ctx.jobs_done}"
    job_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"stage_seconds": {}, "flags": [], "restart": False}
    state: dict[str, Any] = {}
    try:
        _pipeline(ctx, job, job_dir, result, state)
    except StageError as exc:
        _record_failure(ctx, exc, result, state)
    except Exception as exc:  # noqa: BLE001 - the judge's own failure: report it, start a fresh judge
        _judge_failed(result, exc)
    finally:
        teardown = time.perf_counter()
        watcher = state.pop("watcher", None)
        ctx.watcher = None
        if watcher is not None:
            watcher.unwatch()
            result["stage_seconds"]["paused_for_neighbours"] = watcher.paused_s
            # the pauses that held its load back (the rest fell in its wait for the device, counted there too)
            result["stage_seconds"]["paused_loading"] = max(0.0, watcher.paused_s - ctx.paused_waiting_s)
            # whether the pauses looked at the runner's queued GPU work ("on"), or why not
            result["neighbour_gpu_check"] = ctx.gpu_owner_check[1] if ctx.gpu_owner_check else ""
        runner = state.pop("runner", None)
        if runner is not None:
            calibration = state.get("calibration")
            launchers = getattr(runner, "launchers", {})  # (a stand-in runner of the tests has none)
            result["runner"] = {"rtt_ms": runner.rtt_ms, "forked": runner.forked,
                                "overhead_ms": calibration.overhead_ms if calibration else None,
                                "zygote_error": ctx.pool.zygote_error if ctx.pool else "",
                                "sandbox": runner.info.get("sandbox", {}),
                                "launch_shim": runner.launch_shim,
                                "startup_seconds": runner.info.get("startup_seconds"),
                                "startup_phases": runner.info.get("startup_phases"),
                                "build_cached": bool(result.get("build_cached")),
                                "triton_cached": int(result.get("triton_cached") or 0),
                                # launchers the judges built, copied in; of those its calls asked for, how many
                                # were there (seeded or in its own cache by then) and how many it had to build
                                "triton_launchers": {"seeded": int(result.get("triton_launchers") or 0),
                                                     "hits": sum(launchers.values()),
                                                     "misses": sum(not h for h in launchers.values())},
                                "build_reused": result.get("build_reused"),
                                "build_kept": state.get("build_kept"),
                                "shm_payloads": runner.shm_payloads,
                                "device_payloads": runner.device_payloads,
                                "payload_pinned": bool(runner.payload and runner.payload.pinned_maps),
                                "payload_seconds": runner.payload_seconds,
                                "payload_premap_s": runner.premap_seconds,
                                # the first evaluation's outputs, predicted before the runner was taken (output_size)
                                "predicted_output_bytes": state.get("predicted_output_bytes"),
                                "digest": "device" if runner.device_digest else "host",
                                "digest_note": runner.digest_note,
                                "pch": {**runner.pch, "removed": state.get("pch_removed", [])},
                                "headers": runner.headers}
            state["runner_gone"] = runner.kill(keep=_keeper(ctx, job, state))
            if launchers and _confined(runner):  # the misses built for the next runners, in the background
                store = triton_launchers.store_root()
                triton_launchers.note_hits(store, [signature for signature, hit in launchers.items() if hit])
                triton_launchers.start_build(store, [signature for signature, hit in launchers.items() if not hit])
            # teardown's share that must end before the device is free: the candidate's tree gone
            result["stage_seconds"]["runner_kill"] = time.perf_counter() - teardown
            parts = getattr(runner, "kill_seconds", {})  # (a stand-in runner of the tests has none)
            result["stage_seconds"].update({f"kill_{part}": s for part, s in parts.items()})
        after_exit = state.pop("after_exit", None)
        if after_exit is not None and "status" not in result:  # a timing verdict waiting for the tree to be gone
            measuring = neighbours.Measuring(neighbours.pause_files(job))  # a reading: the neighbours stopped
            try:
                measuring.begin()
                after_exit(bool(state.get("runner_gone")))
            except Exception as exc:  # noqa: BLE001 - the judge's own failure, as in the pipeline
                _judge_failed(result, exc)
            finally:
                measuring.end()
        state.clear()
        ctx.jobs_done += 1
        _cleanup(ctx, job_dir, result)
        # The runner's tree killed and waited for, and the judge's clean-up: held with the device (workers.py).
        result["stage_seconds"]["teardown"] = time.perf_counter() - teardown
    _bounded(result)
    return result


def _record_failure(ctx: WorkerContext, exc: StageError, result: dict[str, Any], state: dict[str, Any]) -> None:
    """A stage's failure as the job's verdict. A function of its own so that no frame of run_job names the error:
    its traceback holds the failed stage's frames and their tensors (a GPU-size problem's inputs and answers), and
    a name for it in run_job's frame, which the traceback holds too, made a cycle that the clean-up's collection
    could not free while run_job ran, so the next job's judge started with them (benchmarks.md 1p: 12-14 GiB)."""
    failure = exc
    watcher = state.get("watcher")
    if watcher is not None and watcher.verdict:  # killed while paused for a neighbour: whatever failed after
        failure = StageError("runtime_error", watcher.verdict)
    result.update(status=failure.status, error=failure.message)
    result["flags"] += [f for f in failure.flags if f not in result["flags"]]
    if failure.status in ("crash", "timeout") and "runner" in state:
        result["failed_stage"] = state.get("stage", "load")
    if failure.restart:  # a runner's CUDA error is the runner's: the judge goes on if its own context works
        result["restart"] = sticky_cuda_error(ctx.device)
    if failure.status == "runtime_error" and OUT_OF_DEVICE_MEMORY in failure.message:
        result["device_oom"] = "runner"  # the evaluator runs it again with the device to itself (device_turns)


def _keeper(ctx: WorkerContext, job: dict[str, Any], state: dict[str, Any]) -> Callable[[Path], None] | None:
    """What to keep of the runner's scratch folder once its tree is gone: a build not kept at load (build_cache), the
    kernels Triton compiled (triton_cache, where on); None where nothing."""
    tools = build_cache.toolchain(ctx.device)
    build = state.get("build_kept") == "at_exit"
    seeded = state.get("triton_seeded")  # set where the Triton cache is on and nothing was restored
    if not build and seeded is None:
        return None

    def keep(scratch: Path) -> None:
        if build:
            build_cache.keep(job["source"], scratch / "ext", tools)
        if seeded is not None:
            triton_cache.keep(job["source"], scratch / "triton", tools, seeded)
    return keep


def _confined(runner: Any) -> bool:
    """Whether Landlock keeps the runner's writes in its scratch folder (its report at start, before any candidate
    code ran): only such runners get, and inform, what the judges build for all (triton_launchers.py)."""
    sandbox = runner.info.get("sandbox") if isinstance(getattr(runner, "info", None), dict) else None
    abi = sandbox.get("landlock") if isinstance(sandbox, dict) else None
    return isinstance(abi, int) and not isinstance(abi, bool) and abi > 0  # the ABI it enforced; 0: none


def _judge_failed(result: dict[str, Any], exc: Exception) -> None:
    """The judge's own failure as the job's verdict (a fresh judge follows). Out of the device's memory, it says so
    and the evaluator runs the job again with the device to itself (device_turns.py): beside another job's judge and
    runner, an honest candidate's comparison ran out of an H100's 80 GB (session 38)."""
    if out_of_device_memory(exc):
        result.update(status="crash", restart=True, device_oom="judge",
                      error="the judge ran out of the device's memory: " + trim_traceback(exc, ""))
    else:
        result.update(status="crash", error="the judge failed: " + trim_traceback(exc, ""), restart=True)


def _bounded(result: dict[str, Any]) -> None:
    """A result too large to send whole (RESULT_BYTES) loses its largest parts and becomes a ``crash`` that says so.
    Much of a result is what the runner reported (errors, the dataflow report, launch and build records): a report
    the judge did not bound would otherwise make a result past the protocol's limit, which the evaluator reads as the
    judge's failure and answers with a restart (round 19)."""
    size = len(encode(result))
    if size <= RESULT_BYTES:
        return
    parts = sorted(((len(encode({key: value})), key) for key, value in result.items()
                    if isinstance(value, (dict, list, str)) and key not in ("status", "flags")), reverse=True)
    dropped = []
    for part_size, key in parts:
        if len(encode(result)) <= RESULT_BYTES // 2:
            break
        result[key] = {"dropped_bytes": part_size} if isinstance(result[key], dict) else type(result[key])()
        dropped.append(key)
    result.update(status="crash", correct=False,
                  error=f"the judge's result came to {size:,} bytes, over the {RESULT_BYTES:,} a result may take: "
                        f"{', '.join(dropped)} dropped")


def _stage(ctx: WorkerContext, state: dict[str, Any], name: str) -> None:
    state["stage"] = name
    if "runner" in state:
        state["runner"].stage = name
    ctx.send({"type": "stage", "stage": name})


def _memory_mark(device: torch.device, result: dict[str, Any], stage: str, job: dict[str, Any]) -> None:
    """The judge's own device memory at the end of ``stage`` (MiB): held by tensors, reserved by the caching
    allocator, and the most held since the last mark; what a GPU-size problem's judge needs, stage by stage
    (benchmarks.md 1m: one judge reached 49.5 GB for 6.4 GB outputs). With KB_GYM_MEMORY_HISTORY, the allocations
    so far and their stacks too (memory_history.py)."""
    if device.type != "cuda":
        return
    memory_history.dump(device, str(job.get("problem_key", "")), int(job.get("job_id", 0)), stage)
    mib = 1 << 20
    marks = result.setdefault("correctness", {}).setdefault("judge_memory_mib", {})
    marks[stage] = [torch.cuda.memory_allocated(device) // mib, torch.cuda.memory_reserved(device) // mib,
                    torch.cuda.max_memory_allocated(device) // mib]
    torch.cuda.reset_peak_memory_stats(device)


def _deadline(cfg: dict[str, Any], stage: str) -> float:
    limit = float(cfg.get(f"{stage}_timeout", 300.0))
    return time.monotonic() + max(1.0, limit - STAGE_MARGIN)


def _pipeline(ctx: WorkerContext, job: dict[str, Any], job_dir: Path, result: dict[str, Any],
              state: dict[str, Any]) -> None:
    cfg = job["config"]
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(cfg.get("tf32", False))
    device, dtype = ctx.device, DTYPES[cfg["precision"]]
    seed = int(job["seed"])
    atol, rtol = float(cfg["atol"]), float(cfg["rtol"])
    stages = result["stage_seconds"]
    has_candidate = job.get("source") is not None

    # --- load: the reference here, the candidate in a pristine runner ---------------------------
    _stage(ctx, state, "load")
    if device.type == "cuda":  # the load mark's most held is this job's (not the last one's checks and clean-up)
        torch.cuda.reset_peak_memory_stats(device)
        # where the job's allocation history begins (KB_GYM_MEMORY_HISTORY; scripts/memory_peak.py's load window)
        memory_history.dump(device, str(job.get("problem_key", "")), int(job.get("job_id", 0)), "start")
    t0 = time.perf_counter()
    ref_path = job_dir / "reference.py"
    ref_path.write_text(job["problem_code"])
    try:
        ref_mod = load_module(ref_path, f"kb_reference_{ctx.jobs_done}")
        ref_model = init_model(ref_mod, ref_mod.Model, seed, device, dtype)
    except Exception as exc:  # noqa: BLE001
        raise StageError("runtime_error", f"the reference problem failed to load: {trim_traceback(exc, '')}") from None
    if cfg["timing"] and cfg["baseline"] == "compile":
        compiled_baseline(ctx, job, ref_mod, ref_model, dtype)
    if has_candidate:
        if ctx.pool is None:
            raise StageError("crash", "this judge runs no candidates (started without runners)")
        deadline = _deadline(cfg, "load")
        # this problem's output bytes, as the evaluator learnt them from any worker's evaluations: the runner maps its
        # memfd for them as it prepares, and the spare started in place of it at its start-up
        hint = job.get("payload_hint")
        hint = hint if isinstance(hint, int) and hint > 0 else 0
        if not hint:  # a problem's first evaluation: its outputs' size from a forward on the meta device
            hint = state["predicted_output_bytes"] = ctx.predicted_output_bytes(job["problem_code"], ref_mod, dtype)
        ctx.pool.payload_hint = hint
        runner = ctx.pool.take()
        state["runner"] = runner
        ctx.send({"type": "runner", "pid": runner.pid})  # whose memory the watchdog holds against the limit
        own_clock = runner.cpu_clock and bool(cfg["timing"])  # the CPU clock's harness, read in this very process
        runner.prepare(job["problem_code"], seed, cfg["precision"], bool(cfg.get("tf32", False)),
                       timeout=deadline - time.monotonic(), payload_bytes=hint, reference_model=own_clock)
        if own_clock:
            state["harness_gauge"] = {}
            state["harness_cpu"] = _own_harness(ctx, runner, seed, deadline, ref_mod, ref_model, dtype, atol, rtol,
                                                state["harness_gauge"])
        tools = build_cache.toolchain(device)
        headers = headers_root(device)
        if headers is not None and build_cache.may_build(job["source"]):
            state["pch_removed"] = pch.verify(headers)
        if triton_cache.uses_triton(job["source"]) and _confined(runner):
            # Triton's launchers the judges built (triton_launchers.py): before the kept kernels are looked for, so
            # that the Triton cache keeps neither as this source's own
            result["triton_launchers"] = triton_launchers.seed(triton_launchers.store_root(), runner.scratch / "triton")
        if triton_cache.enabled() and triton_cache.uses_triton(job["source"]):
            # the kernels an earlier runner compiled for this very source; kept at exit where there were none
            result["triton_cached"] = triton_cache.restore(job["source"], runner.scratch / "triton", tools)
            if not result["triton_cached"]:
                state["triton_seeded"] = triton_cache.folders(runner.scratch / "triton")
        files = neighbours.pause_files(job)
        if files is not None:  # stopped from now until the device is granted, whenever another judge measures it
            # From the candidate's load on, not before: until then the runner ran only the judge's code (prepare's
            # populate and page-locking of a 6.4 GB memfd is seconds in the kernel, with sleeps; watched, an honest
            # runner was killed for it on an H100 with three and four workers), as a spare does at its start.
            ctx.paused_waiting_s = 0.0
            ctx.watcher = state["watcher"] = neighbours.PauseWatcher(files, runner, notify=ctx.send,
                                                                     gpu=ctx.gpu_activity())
            runner.paused = ctx.watcher.paused_seconds  # its waits for the runner leave out the time it was paused
            ctx.watcher.watch()
            deadline += ctx.watcher.paused_seconds()  # a measurement it waited out first (neighbours.py)
        with build_cache.building(job["source"], tools, timeout=deadline - time.monotonic() - 10):
            result["build_cached"] = build_cache.restore(job["source"], runner.scratch / "ext", tools)
            restored = build_cache.libraries(runner.scratch / "ext") if result["build_cached"] else {}
            # first calls' compiles and library start-ups before the device is held, where switched on (load_forward.py)
            forward = load_forward.spec(device, ctx.seed(seed, "load_forward"), hint)
            used = runner.load(job["source"], seed, timeout=deadline - time.monotonic(), forward=forward,
                               during_forward=ctx.watcher.forward if ctx.watcher is not None else None)
            if runner.load_forward is not None:
                # and how long other judges' measurements waited for it (neighbours.PauseWatcher.forward): its cost
                waited = ctx.watcher.forward_waits_s if ctx.watcher is not None else 0.0
                result["load_forward"] = {**runner.load_forward, "measurements_waited_s": round(waited, 4)}
            if restored:  # False: the load built it again (a hit that saved nothing)
                result["build_reused"] = build_cache.libraries(runner.scratch / "ext") == restored
            result["compiled"] = True
            if headers is not None:  # what its builds wanted, built in the background for the next (pch.py)
                for variant in used["wanted"]:
                    pch.start_build(headers, variant)
            if not result["build_cached"] and not build_cache.libraries(runner.scratch / "ext"):
                if build_cache.may_build(job["source"]):
                    # nothing built yet: a build in its first call (a JIT load in forward) is kept at exit (round 32:
                    # an honest lazy build was rebuilt at every evaluation); build_cache.keep keeps built libraries only
                    state["build_kept"] = "at_exit"
            elif not result["build_cached"]:  # kept now, so that a judge waiting for this source gets it
                try:
                    with runner.frozen(settle=KEEP_SETTLE_SECONDS, refuse=False, asleep_is_stopped=False) as still:
                        if still:
                            build_cache.keep(job["source"], runner.scratch / "ext", tools)
                            state["build_kept"] = "at_load"
                        else:  # kept once the tree is gone instead (run_job), at no further wait of the judge
                            state["build_kept"] = "at_exit"
                except StageError:  # its processes ran during the copy: what was copied is not kept
                    build_cache.discard(job["source"], tools)
                    raise
    stages["load"] = time.perf_counter() - t0

    # Correctness and the kernel checks measure nothing: held shared where the evaluator allows it for this problem
    # (job["share_device"]), the timing stage exclusively (device_lock.py)
    locked = bool(job.get("device_lock")) and (has_candidate or cfg["timing"])
    shared = locked and has_candidate and bool(job.get("share_device"))
    if locked:
        ctx.acquire_device(exclusive=not shared)
    _memory_mark(device, result, "load", job)

    # --- correctness: fresh secret-seeded inputs per trial ----------------------------------------
    if has_candidate:
        _stage(ctx, state, "correctness")
        t0 = time.perf_counter()
        setup = TrialSetup(device, dtype, ref_mod, ref_model, state["runner"], atol, rtol,
                           _deadline(cfg, "correctness"))
        trials = int(cfg["trials"])
        # Trial seeds follow the job's seed (reproducible; KernelBench's order). A candidate that knows them
        # gains nothing: trials are not timed, and every timed call gets a seed from the OS at its start.
        seeds = [seed + 1 + k for k in range(trials)]
        try:
            run_trials(setup, seeds, seed + 1 + trials, result, state, ctx.speed_of_light_ms)
        finally:
            if state.get("ref_out_bytes"):  # for the evaluator's next jobs of this problem (payload_hint)
                result.setdefault("correctness", {})["output_bytes"] = int(state["ref_out_bytes"])
        stages["correctness"] = time.perf_counter() - t0
        _memory_mark(device, result, "correctness", job)
        if result.get("status") == "incorrect":
            return
    else:
        result["compiled"] = True

    # --- timing ---------------------------------------------------------------------------------
    if not cfg["timing"]:
        _kernel_checks(ctx, job, ref_mod, ref_model, dtype, atol, rtol, result, state)
        _memory_mark(device, result, "checks", job)
        result.setdefault("status", "correct")
        return
    if shared:
        ctx.acquire_device(exclusive=True)
    _stage(ctx, state, "timing")
    t0 = time.perf_counter()
    timed_from = time.time()  # wall clock: the judges of one host compare their timing stages (device_timeline.py)
    deadline = _deadline(cfg, "timing")  # settling, calibration and the loop share it
    measuring = neighbours.Measuring(neighbours.pause_files(job))  # the device's waiting runners stopped meanwhile
    try:
        measuring.begin()
        result["stage_seconds"]["neighbour_pause_wait"] = measuring.waited_s
        # The spare finishes starting before the loop: a process importing torch beside it would take CPU
        # time from the host side of every timed call.
        spare = ctx.pool.pristine(timeout=max(1.0, 0.25 * (deadline - time.monotonic()))) if ctx.pool else None
        result["stage_seconds"]["spare_wait"] = time.perf_counter() - t0 - measuring.waited_s
        if state.get("runner") is not None:
            state["chunk_bytes"] = timed_chunk_bytes(job["config"], state, result)
            began = time.perf_counter()
            state["calibration"] = spare_calibration(ctx, job, ref_mod, ref_model, state["runner"], spare, dtype,
                                                deadline, state["chunk_bytes"], widen=bool(state.get("widen")))
            # the timing stage's split (with spare_wait, timing_loop, second_opinion, probe_check): where it goes
            result["stage_seconds"]["calibration"] = time.perf_counter() - began
            _memory_mark(device, result, "calibration", job)  # the spare's calls; the timing mark: the loop's
        timing_stage(ctx, job, ref_mod, ref_model, state.get("runner"), dtype, atol, rtol, result, state, deadline)
    finally:  # a timing cut short by a verdict still held the device
        measuring.end()
        stages["timing"] = time.perf_counter() - t0
        result["timed_at"] = [timed_from, time.time()]
        _memory_mark(device, result, "timing", job)
    if shared and state.get("after_exit") is None:  # a reading after the exit is a measurement: still exclusive
        ctx.acquire_device(exclusive=False)
    _kernel_checks(ctx, job, ref_mod, ref_model, dtype, atol, rtol, result, state)
    _memory_mark(device, result, "checks", job)


def _own_harness(ctx: WorkerContext, runner: Any, seed: int, deadline: float, ref_mod: Any, ref_model: Any,
                 dtype: torch.dtype, atol: float, rtol: float, gauges: dict[str, float]
                 ) -> dict[str, tuple[float, float] | None]:
    """The CPU clock's harness share, read in the candidate's runner before it loads the candidate
    (timing.harness_cpu): "plain" on the problem's own inputs and, where those make the output the input (the
    correctness stage may then widen every timed call's inputs: correctness._widened_trial), "widened" on 3 x randn
    inputs too, which cost more to build. None where a call failed: the judge's own reading, not the candidate's
    doing, so the spare's share stands in. A timeout is raised: the call still runs, and the runner's next reply
    would be its. ``gauges`` gets the judge's load gauge beside each share (timing.harness_cpu's ``build``)."""
    shares: dict[str, tuple[float, float] | None] = {"plain": None, "widened": None}
    kinds = ["plain"] + (["widened"] if _output_is_input(ctx, ref_mod, ref_model, seed, dtype, atol, rtol) else [])
    try:
        for kind in kinds:
            seeds = [ctx.seed(seed, f"harness_cpu_{kind}", k) for k in range(HARNESS_CALLS)]
            built: list[float] = []  # the host's load as the share was read: the loop's builds are held to it
            shares[kind] = harness_cpu(runner, seeds, timeout=max(1.0, 0.25 * (deadline - time.monotonic())),
                                       widen=kind == "widened",
                                       build=lambda s, w=kind == "widened", g=built: gauged_inputs(
                                           ref_mod, s ^ 1, ctx.device, dtype, w, g))
            if built:
                gauges[kind] = min(built)  # the least, as the share's own reading and the loop's (load_factor)
    except StageError as exc:
        if exc.status == "timeout":
            raise
    finally:
        runner.forget_calls()
    return shares


def _output_is_input(ctx: WorkerContext, ref_mod: Any, ref_model: Any, seed: int, dtype: torch.dtype, atol: float,
                     rtol: float) -> bool:
    """Whether the reference's output is its input on the problem's own inputs (correctness.is_input), from one
    forward here: then the timed calls may take widened inputs. A reference that fails here fails its trials too."""
    inputs = make_inputs(ref_mod, ctx.seed(seed, "harness_cpu_identity"), ctx.device, dtype)
    try:
        with torch.no_grad():
            out = ref_model(*clone_inputs(inputs))
    except Exception:  # noqa: BLE001 - the correctness stage gives the verdict
        return False
    return is_input(inputs, out, atol, rtol)


def _kernel_checks(ctx: WorkerContext, job: dict[str, Any], ref_mod: Any, ref_model: Any, dtype: torch.dtype,
                   atol: float, rtol: float, result: dict[str, Any], state: dict[str, Any]) -> None:
    """Whether the candidate's kernels did the work: the dataflow trace, then the knockout. Stages of their own, each
    with its own limit: in the timing stage's leftover a candidate that spent that stage's clock in its first call
    (warm-up calls are neither sampled nor seen by the envelope) skipped the knockout (round 13). Their limit is
    the correctness stage's (EvalConfig.stage_limit): they are correctness calls. The trace runs first: it runs
    the kernels, so the knockout, which may leave the candidate's state spoiled, stays the runner's last call."""
    cfg, stages = job["config"], result["stage_seconds"]
    for name, check in (("dataflow", dataflow_check), ("knockout", knockout_check)):
        _stage(ctx, state, name)
        t0 = time.perf_counter()
        check(ctx, job, ref_mod, ref_model, dtype, atol, rtol, result, state, _deadline(cfg, "correctness"))
        stages[name] = time.perf_counter() - t0


def _cleanup(ctx: WorkerContext, job_dir: Path, result: dict[str, Any]) -> None:
    for name in [n for n in sys.modules if n.startswith("kb_reference_")]:
        del sys.modules[name]
    gc.collect()
    if ctx.device.type == "cuda":
        try:
            torch.cuda.synchronize(ctx.device)
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            result["restart"] = True
    remove_tree(job_dir)


__all__ = ["WorkerContext", "run_job", "warm_up"]
