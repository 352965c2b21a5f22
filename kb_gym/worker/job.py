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
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from kb_gym.worker import build_cache, burst, pch
from kb_gym.worker.checks import (
    DEGENERATE_NOTE,
    compare_outputs,
    degenerate_bound,
    flatten_outputs,
    inexact,
    near_miss,
    rel_l2,
)
from kb_gym.worker.clock import CacheFlusher
from kb_gym.worker.correctness import (
    KEPT_ANSWER_ELEMENTS,
    TrialSetup,
    kernels_needed,
    pytorch_alone,
    run_trials,
    trivial_outputs,
)
from kb_gym.worker.float64 import judge
from kb_gym.worker.inputs import DTYPES, init_model, make_inputs
from kb_gym.worker.loading import StageError, load_module, sticky_cuda_error, trim_traceback
from kb_gym.worker.runner_client import RunnerProcess
from kb_gym.worker.runner_pool import RunnerPool
from kb_gym.worker.spot_check import CHUNKS_PER_CALL, SampledOutputs, chunk_size, reference_pieces
from kb_gym.worker.timing import Calibration, PairedTiming, calibrate_overhead, reference_outputs, time_pair

CALIBRATION_TTL_S = 60.0  # a problem's calibration is reused this long (the machine's load drifts)
CALIBRATION_CALLS = 10  # timed reference calls in a pristine runner: its per-call overhead (the first 2 warm up)
STAGE_MARGIN = 2.0  # seconds the judge keeps of a stage's limit to report a runner's timeout itself
# The build cache's hold after a load waits this long for the tree to stand still; a tree that does not (a thread
# in a long system call: GPU drivers' threads, or a candidate's on purpose) has its build kept once it is gone.
# 0.25 s was tried (session 17): round 2's calibration poison then got through in 2 of 3 local runs against 0 of 3
# at 2 s, for a reason not yet found, so the hold keeps its 2 s.
KEEP_SETTLE_SECONDS = 2.0
SOL_MARGIN = 0.75  # the speed-of-light floor is this share of the ideal time: no honest kernel is flagged


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
        self.measured_calibrations: list[dict[str, Any]] = []  # measured since the last result was sent (_adopt)
        if self.pool is not None:
            self.pool.prestart()

    def seed(self, job_seed: int, purpose: str, k: int = 0) -> int:
        digest = hmac.new(self.secret, f"{job_seed}:{purpose}:{k}".encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF

    def acquire_device(self) -> None:
        """Wait until the evaluator grants this judge the device (several judges share it: the
        stages that run on it, correctness and timing, take turns; loading and compiling do not)."""
        self.send({"type": "acquire"})
        granted = self.receive() if self.receive is not None else None
        if not granted or granted.get("type") != "granted":
            raise StageError("crash", f"expected the device grant from the evaluator, got {granted!r}", restart=True)

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
        result.update(status=exc.status, error=exc.message)
        result["flags"] += [f for f in exc.flags if f not in result["flags"]]
        if exc.status in ("crash", "timeout") and "runner" in state:
            result["failed_stage"] = state.get("stage", "load")
        if exc.restart:  # a runner's CUDA error is the runner's: the judge goes on if its own context works
            result["restart"] = sticky_cuda_error(ctx.device)
    except Exception as exc:  # noqa: BLE001 - the judge's own failure: report it, start a fresh judge
        result.update(status="crash", error="the judge failed: " + trim_traceback(exc, ""), restart=True)
    finally:
        teardown = time.perf_counter()
        runner = state.pop("runner", None)
        if runner is not None:
            calibration = state.get("calibration")
            result["runner"] = {"rtt_ms": runner.rtt_ms, "forked": runner.forked,
                                "overhead_ms": calibration.overhead_ms if calibration else None,
                                "zygote_error": ctx.pool.zygote_error if ctx.pool else "",
                                "sandbox": runner.info.get("sandbox", {}),
                                "launch_shim": runner.launch_shim,
                                "startup_seconds": runner.info.get("startup_seconds"),
                                "startup_phases": runner.info.get("startup_phases"),
                                "build_cached": bool(result.get("build_cached")),
                                "build_reused": result.get("build_reused"),
                                "build_kept": state.get("build_kept"),
                                "shm_payloads": runner.shm_payloads,
                                "device_payloads": runner.device_payloads,
                                "payload_pinned": bool(runner.payload and runner.payload.pinned_maps),
                                "payload_seconds": runner.payload_seconds,
                                "payload_premap_s": runner.premap_seconds,
                                "digest": "device" if runner.device_digest else "host",
                                "digest_note": runner.digest_note,
                                "pch": {**runner.pch, "removed": state.get("pch_removed", [])},
                                "headers": runner.headers}
            runner.kill(keep=(lambda scratch: build_cache.keep(job["source"], scratch / "ext",
                                                               build_cache.toolchain(ctx.device)))
                        if state.get("build_kept") == "at_exit" else None)
            # teardown's share that must end before the device is free: the candidate's tree gone
            result["stage_seconds"]["runner_kill"] = time.perf_counter() - teardown
        state.clear()
        ctx.jobs_done += 1
        _cleanup(ctx, job_dir, result)
        # The runner's tree killed and waited for, and the judge's clean-up: held with the device (workers.py).
        result["stage_seconds"]["teardown"] = time.perf_counter() - teardown
        # what this judge's pristine spares measured, for the evaluator to pass to its other judges (_adopt)
        result["calibrations"], ctx.measured_calibrations = ctx.measured_calibrations, []
    return result


def _stage(ctx: WorkerContext, state: dict[str, Any], name: str) -> None:
    state["stage"] = name
    if "runner" in state:
        state["runner"].stage = name
    ctx.send({"type": "stage", "stage": name})


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
    t0 = time.perf_counter()
    ref_path = job_dir / "reference.py"
    ref_path.write_text(job["problem_code"])
    try:
        ref_mod = load_module(ref_path, f"kb_reference_{ctx.jobs_done}")
        ref_model = init_model(ref_mod, ref_mod.Model, seed, device, dtype)
    except Exception as exc:  # noqa: BLE001
        raise StageError("runtime_error", f"the reference problem failed to load: {trim_traceback(exc, '')}") from None
    if cfg["timing"] and cfg["baseline"] == "compile":
        _compile_baseline(ctx, job, ref_mod, ref_model, dtype)
    if has_candidate:
        if ctx.pool is None:
            raise StageError("crash", "this judge runs no candidates (started without runners)")
        deadline = _deadline(cfg, "load")
        # this problem's output bytes, as the evaluator learnt them from any worker's evaluations: the runner maps its
        # memfd for them as it prepares, and the spare started in place of it at its start-up
        hint = job.get("payload_hint")
        hint = hint if isinstance(hint, int) and hint > 0 else 0
        ctx.pool.payload_hint = hint
        runner = ctx.pool.take()
        state["runner"] = runner
        runner.prepare(job["problem_code"], seed, cfg["precision"], bool(cfg.get("tf32", False)),
                       timeout=deadline - time.monotonic(), payload_bytes=hint)
        tools = build_cache.toolchain(device)
        headers = headers_root(device)
        if headers is not None and build_cache.may_build(job["source"]):
            state["pch_removed"] = pch.verify(headers)
        with build_cache.building(job["source"], tools, timeout=deadline - time.monotonic() - 10):
            result["build_cached"] = build_cache.restore(job["source"], runner.scratch / "ext", tools)
            restored = build_cache.libraries(runner.scratch / "ext") if result["build_cached"] else {}
            used = runner.load(job["source"], seed, timeout=deadline - time.monotonic())
            if restored:  # False: the load built it again (a hit that saved nothing)
                result["build_reused"] = build_cache.libraries(runner.scratch / "ext") == restored
            result["compiled"] = True
            if headers is not None:  # what its builds wanted, built in the background for the next (pch.py)
                for variant in used["wanted"]:
                    pch.start_build(headers, variant)
            if not result["build_cached"]:  # kept now, so that a judge waiting for this source gets it
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

    if job.get("device_lock") and (has_candidate or cfg["timing"]):
        ctx.acquire_device()

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
        if result.get("status") == "incorrect":
            return
    else:
        result["compiled"] = True

    # --- timing ---------------------------------------------------------------------------------
    if not cfg["timing"]:
        _kernel_checks(ctx, job, ref_mod, ref_model, dtype, atol, rtol, result, state)
        result.setdefault("status", "correct")
        return
    _stage(ctx, state, "timing")
    t0 = time.perf_counter()
    timed_from = time.time()  # wall clock: the judges of one host compare their timing stages (device_timeline.py)
    deadline = _deadline(cfg, "timing")  # settling, calibration and the loop share it
    # The spare finishes starting before the loop: a process importing torch beside it would take CPU
    # time from the host side of every timed call.
    spare = ctx.pool.pristine(timeout=max(1.0, 0.25 * (deadline - time.monotonic()))) if ctx.pool else None
    result["stage_seconds"]["spare_wait"] = time.perf_counter() - t0
    try:
        if state.get("runner") is not None:
            state["chunk_bytes"] = _chunk_bytes(job["config"], state, result)
            state["calibration"] = _calibration(ctx, job, ref_mod, ref_model, state["runner"], spare, dtype,
                                                deadline, state["chunk_bytes"], widen=bool(state.get("widen")))
        _timing(ctx, job, ref_mod, ref_model, state.get("runner"), dtype, atol, rtol, result, state, deadline)
    finally:  # a timing cut short by a verdict still held the device
        stages["timing"] = time.perf_counter() - t0
        result["timed_at"] = [timed_from, time.time()]
    _kernel_checks(ctx, job, ref_mod, ref_model, dtype, atol, rtol, result, state)


def _kernel_checks(ctx: WorkerContext, job: dict[str, Any], ref_mod: Any, ref_model: Any, dtype: torch.dtype,
                   atol: float, rtol: float, result: dict[str, Any], state: dict[str, Any]) -> None:
    """Whether the candidate's kernels did the work: the dataflow trace, then the knockout. Stages of their own, each
    with its own limit: in the timing stage's leftover a candidate that spent that stage's clock in its first call
    (warm-up calls are neither sampled nor seen by the envelope) skipped the knockout (round 13). Their limit is
    the correctness stage's (EvalConfig.stage_limit): they are correctness calls. The trace runs first: it runs
    the kernels, so the knockout, which may leave the candidate's state spoiled, stays the runner's last call."""
    cfg, stages = job["config"], result["stage_seconds"]
    for name, check in (("dataflow", _dataflow), ("knockout", _knockout)):
        _stage(ctx, state, name)
        t0 = time.perf_counter()
        check(ctx, job, ref_mod, ref_model, dtype, atol, rtol, result, state, _deadline(cfg, "correctness"))
        stages[name] = time.perf_counter() - t0


def _dataflow(ctx: WorkerContext, job: dict[str, Any], ref_mod: Any, ref_model: Any, dtype: torch.dtype, atol: float,
              rtol: float, result: dict[str, Any], state: dict[str, Any], deadline: float) -> None:
    """``token_kernel`` where PyTorch computed the whole answer and the kernels only moved it or fed it constants
    (correctness.pytorch_alone, dataflow.py): round 13's copy into an ``empty_like`` buffer, one element moved into a
    NaN-filled output, the 1.0 it is multiplied by. The knockout finds those kernels needed."""
    runner = state.get("runner")
    if (runner is None or not job["config"].get("dataflow_check", True) or not result.get("correct")
            or result.get("status") not in (None, "correct") or not result.get("custom_kernel_launches")):
        return
    widen = bool(state.get("widen"))
    seed = int(job["seed"])
    report = pytorch_alone(
        runner, (ctx.seed(seed, "dataflow", 0), ctx.seed(seed, "dataflow", 1)),
        lambda s: reference_outputs(ref_model, ref_mod, s, ctx.device, dtype, runner, widen),
        timed_output_check(ctx.device, ref_mod, ref_model, dtype, atol, rtol, result, state, widen),
        atol=atol, rtol=rtol, deadline=deadline, byte_limit=state.get("byte_limit", 1 << 30), widen=widen)
    result["correctness"]["dataflow"] = report
    if report["verdict"] == "pytorch" and "token_kernel" not in result["flags"]:
        result["flags"].append("token_kernel")


def _knockout(ctx: WorkerContext, job: dict[str, Any], ref_mod: Any, ref_model: Any, dtype: torch.dtype, atol: float,
              rtol: float, result: dict[str, Any], state: dict[str, Any], deadline: float) -> None:
    """``token_kernel`` where the candidate's kernels ran but its answer did not need them (correctness.kernels_needed):
    the job's last call, on a runner nothing else will use. Where it cannot run (under a second left) the kernels
    are not taken as needed: ``token_kernel`` too, never a silent pass."""
    runner = state.get("runner")
    left = deadline - time.monotonic()
    if (runner is None or not result.get("correct") or result.get("status") not in (None, "correct")
            or not result.get("custom_kernel_launches") or "token_kernel" in result["flags"]):
        return
    widen = bool(state.get("widen"))
    needed = left >= 1.0 and kernels_needed(
        runner, ctx.seed(int(job["seed"]), "knockout"),
        lambda s: reference_outputs(ref_model, ref_mod, s, ctx.device, dtype, runner, widen),
        timed_output_check(ctx.device, ref_mod, ref_model, dtype, atol, rtol, result, state, widen),
        timeout=min(left, 10.0), byte_limit=state.get("byte_limit", 1 << 30), chunk_bytes=state.get("chunk_bytes", 0),
        widen=widen, rtol=rtol, report=result.setdefault("correctness", {}))
    if not needed and "token_kernel" not in result["flags"]:
        result["flags"].append("token_kernel")


def _chunk_bytes(cfg: dict[str, Any], state: dict[str, Any], result: dict[str, Any]) -> int:
    """Spot-check the timed outputs (spot_check.py) when they are large, except where the float64 second
    opinion may be needed (an ill-conditioned reference: it judges whole outputs). On a degenerate problem the
    drawn chunks are held against the same chunks of the trivial outputs and the last call's answer
    (timed_output_check): whole, a 6 GB output's ten timed calls and the spare's calibration cost a minute on the
    H200 (round 13 made them whole because the chunk path skipped those checks)."""
    limit = int(cfg.get("timed_output_sample_bytes") or 0)
    if not limit or state.get("ref_out_bytes", 0) <= limit or "ill_conditioned" in result["flags"]:
        return 0
    return chunk_size(state["ref_out_bytes"])


def _calibration(ctx: WorkerContext, job: dict[str, Any], ref_mod: Any, ref_model: Any, runner: RunnerProcess,
                 spare: RunnerProcess | None, dtype: torch.dtype, deadline: float,
                 chunk_bytes: int = 0, reuse: bool = True, widen: bool = False) -> Calibration | None:
    """The candidate's runner is no longer pristine, so its per-call overhead is measured on the spare:
    a fork of the same zygote that has run no candidate code, through the same path, under the device
    lock and right before the loop, interleaved with baseline calls as the loop is, the candidate's
    runner frozen meanwhile. The spare stays pristine (it ran the reference only) and is handed to the
    next candidate as usual. Reused for the same problem for CALIBRATION_TTL_S. None where no spare
    could measure it: the envelope is then reported, not charged."""
    cfg = job["config"]
    tf32 = bool(cfg.get("tf32", False))
    # the path a call takes (whole outputs or chunks) is part of its overhead, and so is building widened inputs
    key = (hashlib.sha256(job["problem_code"].encode()).hexdigest(), cfg["precision"], tf32, chunk_bytes, widen)
    _adopt(ctx, key, job.get("calibrations"))
    kept = ctx.calibrations.get(key)
    if reuse and kept is not None and time.monotonic() - kept[0] < CALIBRATION_TTL_S:
        return kept[1]
    if spare is None:
        return None
    seed = int(job["seed"])
    seeds = [ctx.seed(seed, "calibrate", k) for k in range(CALIBRATION_CALLS)]
    if not _prepare_spare(ctx, job, spare, deadline - time.monotonic()):
        return None
    # Every thread of the candidate's tree stopped first (or the candidate's verdict): only then is what the
    # spare measures clean enough to keep for the problem's next candidates.
    with runner.frozen():
        try:
            calibration = calibrate_overhead(spare, ref_model, ref_mod, ctx.device, dtype, ctx.flusher, seeds,
                                             timeout=0.5 * (deadline - time.monotonic()), chunk_bytes=chunk_bytes,
                                             widen=widen)
        except StageError:
            ctx.pool.discard_spare()
            return None
    if calibration is not None:
        ctx.calibrations[key] = (time.monotonic(), calibration)
        if reuse:  # for the evaluator to pass to its other judges on this device (_adopt)
            ctx.measured_calibrations.append({"key": list(key), "overhead_ms": calibration.overhead_ms,
                                              "spread_ms": calibration.spread_ms,
                                              "measured_at": calibration.measured_at})
    return calibration


def _adopt(ctx: WorkerContext, key: tuple[Any, ...], shared: Any) -> None:
    """A calibration another judge of this device measured for the problem (the evaluator passes them with the job),
    kept where it is newer than this judge's own: each judge measuring its own costs 0.2-0.7 s of held device time
    per problem (docs/benchmarks.md 0u). Calibrations come from pristine spares only, in judges: what a runner says
    never reaches them. ``measured_at`` is time.monotonic(), one clock for every process of the host."""
    for entry in shared if isinstance(shared, list) else []:
        try:
            if tuple(entry["key"]) != key:
                continue
            measured = float(entry["measured_at"])
            calibration = Calibration(float(entry["overhead_ms"]), float(entry["spread_ms"]), measured)
        except (KeyError, TypeError, ValueError):
            continue
        kept = ctx.calibrations.get(key)
        if measured <= time.monotonic() and (kept is None or measured > kept[1].measured_at):
            ctx.calibrations[key] = (measured, calibration)


def _compile_baseline(ctx: WorkerContext, job: dict[str, Any], ref_mod: Any, ref_model: Any,
                      dtype: torch.dtype) -> Any:
    """``torch.compile(Model)``, compiled by one call in the load stage. Kept per problem."""
    key = job["problem_key"]
    if key not in ctx.compiled_baselines:
        ctx.compiled_baselines.clear()
        compiled = torch.compile(ref_model)
        with torch.no_grad():
            compiled(*make_inputs(ref_mod, ctx.seed(int(job["seed"]), "compile"), ctx.device, dtype))
        ctx.compiled_baselines[key] = compiled
    return ctx.compiled_baselines[key]


OutputCheck = Callable[[Any, Any, int], "str | None"]  # (candidate's outputs, reference's, seed) -> why wrong


def timed_output_check(device: torch.device, ref_mod: Any, ref_model: Any, dtype: torch.dtype, atol: float,
                       rtol: float, result: dict[str, Any], state: dict[str, Any], widen: bool = False) -> OutputCheck:
    """How a timed call's outputs are checked against the reference's on the same seed: why they are wrong, or
    None. A narrow miss gets the float64 second opinion here too, whether or not the correctness trials needed
    it: their few inputs can all fall where the fp32 reference is exact, and then a kernel more exact than the
    reference failed on a timed call (found on the H200: a float64-accumulating mat-vec at K = 65536). ``widen``: the
    calls' inputs were widened (time_pair), and so are the float64 opinion's."""

    previous: list[torch.Tensor] = []  # the last timed call's answer, on a degenerate problem (small outputs)
    last_seed: list[int] = []  # the last timed call's seed, on a degenerate problem

    def last_answer() -> list[torch.Tensor]:
        """The last timed call's answer: kept, or where it was too large to keep, computed again from its seed
        (a reference forward per call, on degenerate problems only: round 13's large near-constant answer,
        memorised once the trials were over, got 1,448-1,645x, correct, when the large ones were not checked)."""
        if previous or not last_seed:
            return previous[:]
        with torch.no_grad():
            out = ref_model(*make_inputs(ref_mod, last_seed[0], device, dtype, widen=widen))
            if device.type == "cuda":  # finished before the next timed call starts
                torch.cuda.synchronize(device)
        return [r for r in flatten_outputs(out) if inexact(r)]

    def check(cand_out: Any, ref_out: Any, seed: int) -> str | None:
        # Where another input's answer passes the tolerance (the trials found the problem degenerate), a timed
        # output is held, as a trial's, within 0.3x the distance between this answer and the last one: else
        # an answer memorised once the trials were over passed every timed call (round 7: 5-7x, correct).
        degenerate = "degenerate_problem" in result.get("flags", ())
        others = last_answer() if degenerate else []
        # ... and the trivial outputs too (zeros, the input), as a trial's: where the input is within the tolerance
        # of the answer on inputs of both signs as well (no widened trial then), returning it once the trials were
        # over passed every timed call (round 12: x + 2e-5 * tanh(3x), correct at 36-39x for a true 1x)
        inputs = make_inputs(ref_mod, seed, device, dtype, widen=widen) if degenerate else None
        if isinstance(cand_out, SampledOutputs):
            why = _check_chunks(cand_out, ref_out, atol, rtol, inputs, others)
            keep_answer(ref_out, degenerate, seed)
            return why
        trivial = trivial_outputs(ref_out, inputs) if degenerate else None
        cmp = compare_outputs(cand_out, ref_out, atol, rtol, trivial, others)
        if not cmp.ok and near_miss(cmp):  # the float64 second opinion holds it to the other answer too
            if inputs is None:
                inputs = make_inputs(ref_mod, seed, device, dtype, widen=widen)
            cmp = judge(device, ref_model, inputs, cand_out, ref_out, atol, rtol, result, state, trivial, others)
        keep_answer(ref_out, degenerate, seed)
        return None if cmp.ok else cmp.reason

    def keep_answer(ref_out: Any, degenerate: bool, seed: int) -> None:
        if degenerate:
            answers = [r for r in flatten_outputs(ref_out) if inexact(r)]
            previous[:] = answers if sum(r.numel() for r in answers) <= KEPT_ANSWER_ELEMENTS else []
            last_seed[:] = [seed]

    return check


def _check_chunks(sample: SampledOutputs, ref_out: Any, atol: float, rtol: float, inputs: list[Any] | None,
                  others: list[torch.Tensor]) -> str | None:
    """Why the chunks drawn after a timed call are wrong, or None. With ``inputs`` (a degenerate problem) each
    chunk is also held against the same elements of the trivial outputs (zeros, the inputs) and of the last
    call's answers, and the chunks together to the whole output's bound, as a whole output is: the chunks are
    drawn after the call's hashes are fixed, so an answer that returns an input, or an earlier answer, is caught
    wherever it is drawn."""
    refs = flatten_outputs(ref_out)
    ref_pieces, why = reference_pieces(refs, sample)
    if why:
        return why
    if inputs is None:
        cmp = compare_outputs([values for _, _, values in sample.chunks], ref_pieces, atol, rtol)
        return None if cmp.ok else f"on chunks drawn after the call: {cmp.reason}"
    # contiguous once: a chunk of a transposed input is then a slice, not a copy of the whole input per chunk
    trivial = [t.contiguous() for t in trivial_outputs(ref_out, inputs)]
    for (k, first, values), ref_piece in zip(sample.chunks, ref_pieces, strict=True):
        shape = refs[k].shape

        def piece(t: torch.Tensor, first: int = first, n: int = values.numel()) -> torch.Tensor:
            return t.reshape(-1)[first:first + n]

        # a chunk that is a trivial output's own elements, wherever the chunk lies (an input returned in blocks)
        cmp = compare_outputs([values], [ref_piece], atol, rtol, [piece(t) for t in trivial if t.shape == shape],
                              [piece(t) for t in others if t.shape == shape])
        if not cmp.ok:
            return f"on chunks drawn after the call: {cmp.reason}"
    # ... and the drawn chunks together held to the bound of the whole output, which a chunk alone can miss: where a
    # trivial output is within rounding of the answer on some chunks only, those chunks pass as unverifiable
    # (round 17: the input returned on 22% of the rows, correct every time); the error over the drawn chunks
    # estimates the whole output's
    for k in sorted({k for k, _, _ in sample.chunks}):
        guard = degenerate_bound(refs[k], trivial, others, atol, rtol)
        if not guard.degenerate or guard.unverifiable:
            continue
        drawn = [(values, ref_piece) for (j, _, values), ref_piece in zip(sample.chunks, ref_pieces, strict=True)
                 if j == k]
        err = rel_l2(torch.cat([v.reshape(-1) for v, _ in drawn]), torch.cat([p.reshape(-1) for _, p in drawn]))
        if not err <= guard.bound:
            label = f"output {k}" if len(refs) > 1 else "output"
            return (f"on chunks drawn after the call: {label}: relative L2 error {err:.3g} over the drawn chunks "
                    f"exceeds {guard.bound:.3g}; {DEGENERATE_NOTE}")
    return None


def _timing(ctx: WorkerContext, job: dict[str, Any], ref_mod: Any, ref_model: Any, runner: RunnerProcess | None,
            dtype: torch.dtype, atol: float, rtol: float, result: dict[str, Any], state: dict[str, Any],
            deadline: float) -> None:
    cfg = job["config"]
    baseline_fn = ref_model
    if cfg["baseline"] == "compile":
        baseline_fn = _compile_baseline(ctx, job, ref_mod, ref_model, dtype)
    cached = job.get("cached_baseline") if runner is not None else None

    # On a problem whose own inputs make the output its input, the widened trial judged a kernel against a copy; a
    # forward that tells that trial by its values (both signs) returned its input in every timed call (round 12), so
    # the timed calls get such inputs too (the burst check keeps the problem's own: it only charges time).
    widen = bool(state.get("widen"))
    check = timed_output_check(ctx.device, ref_mod, ref_model, dtype, atol, rtol, result, state, widen)

    def call_timeout() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StageError("timeout", "the timing stage exceeded its time limit")
        return left

    def timed_loop(calibration: Calibration | None) -> PairedTiming:
        return time_pair(
            None if cached else baseline_fn, ref_model, runner, ref_mod, ctx.device, dtype, ctx.flusher,
            check if cfg["check_timed_outputs"] else None,
            warmup=int(cfg["timing_warmup"]), min_reps=int(cfg["timing_min_reps"]),
            max_reps=int(cfg["timing_max_reps"]), target_rel_ci=float(cfg["timing_target_rel_ci"]),
            max_seconds=float(cfg["timing_max_seconds"]), call_timeout=call_timeout,
            byte_limit=state.get("byte_limit", 1 << 30), calibration=calibration,
            chunk_bytes=state.get("chunk_bytes", 0), widen=widen)

    try:
        timing = timed_loop(state.get("calibration"))
        if timing.hidden_work() and not timing.mismatch and runner is not None:
            _second_opinion(ctx, job, ref_mod, ref_model, runner, dtype, deadline, state, timing)
            if timing.hidden_work():
                timing = _retime(timing, timed_loop, deadline)
        if runner is not None and cfg.get("burst_check"):
            burst.confirm(runner, timing, _spare_share(ctx, job, runner, deadline, call_timeout),
                          lambda seed: reference_outputs(ref_model, ref_mod, seed, ctx.device, dtype, runner),
                          timed_output_check(ctx.device, ref_mod, ref_model, dtype, atol, rtol, result, state)
                          if widen else check,
                          int(state.get("ref_out_bytes", 0)), state.get("byte_limit", 1 << 30), ctx.device.type,
                          call_timeout)
    except StageError as exc:
        if exc.status in ("runtime_error", "incorrect"):
            exc.message = "failed while timing: " + exc.message
        raise
    except Exception as exc:  # noqa: BLE001 - the baseline itself failed: the judge's context may be gone
        raise StageError("runtime_error", "the baseline failed while timing: " + trim_traceback(exc, ""),
                         restart=sticky_cuda_error(ctx.device)) from None
    _timing_verdict(timing, cached, result, state)


def _prepare_spare(ctx: WorkerContext, job: dict[str, Any], spare: RunnerProcess, timeout: float) -> bool:
    """The spare given the problem and the reference model; False (and the spare discarded) where it failed: the
    spare's failure is not the candidate's, so nothing is measured against it this time."""
    cfg = job["config"]
    try:
        spare.prepare(job["problem_code"], int(job["seed"]), cfg["precision"], bool(cfg.get("tf32", False)),
                      timeout=timeout, reference_model=True)
    except StageError:
        ctx.pool.discard_spare()
        return False
    return True


def _spare_share(ctx: WorkerContext, job: dict[str, Any], runner: RunnerProcess, deadline: float,
                 timeout: Callable[[], float]) -> Callable[[int], float | None]:
    """What ``burst.confirm`` reads before each of the candidate's bursts: the harness's share of a K-forward burst
    on the reference in the pristine spare (prepared once), with the candidate's tree stopped as for the per-call
    calibration (_calibration). None from then on once the spare fails: the burst then charges nothing."""
    held: dict[str, Any] = {"spare": None, "failed": ctx.pool is None}

    def read(forwards: int) -> float | None:
        if held["failed"]:
            return None
        if held["spare"] is None:
            spare = ctx.pool.pristine(timeout=max(1.0, 0.25 * (deadline - time.monotonic())))
            if spare is None or not _prepare_spare(ctx, job, spare, timeout()):
                held["failed"] = True
                return None
            held["spare"] = spare
        with runner.frozen():  # the candidate's verdict if its tree will not stop, as for the per-call calibration
            try:
                reply = held["spare"].burst(burst.fresh_seeds(forwards), timeout=timeout(), target="reference")
            except StageError:
                ctx.pool.discard_spare()
                held["failed"] = True
                return None
        return burst.harness_share(reply)

    return read


def _second_opinion(ctx: WorkerContext, job: dict[str, Any], ref_mod: Any, ref_model: Any, runner: RunnerProcess,
                    dtype: torch.dtype, deadline: float, state: dict[str, Any], timing: PairedTiming) -> None:
    """An envelope over its tolerance is weighed again against a fresh spare's calibration, measured now: the
    per-call overhead of identical pristine runners drifts by up to 0.4 ms between processes and minutes on the
    H200 (docs/measurements/envelope-diag-h200-2026-12-01.log), which flagged 1 in 16 honest 7 us reference
    copies. The larger of the two overheads stands; hidden work still shows against both."""
    if ctx.pool is None:
        return
    ctx.pool.discard_spare()  # another process: the drift is between processes as much as over time
    spare = ctx.pool.pristine(timeout=max(1.0, 0.25 * (deadline - time.monotonic())))
    fresh = _calibration(ctx, job, ref_mod, ref_model, runner, spare, dtype, deadline, state.get("chunk_bytes", 0),
                         reuse=False, widen=bool(state.get("widen")))
    first = timing.calibration
    if fresh is None or first is None:
        return
    timing.calibration = Calibration(max(first.overhead_ms, fresh.overhead_ms), max(first.spread_ms, fresh.spread_ms),
                                     min(first.measured_at, fresh.measured_at))
    timing.second_calibration = True


def _retime(first: PairedTiming, timed_loop: Any, deadline: float) -> PairedTiming:
    """A flagged excess that the second calibration did not explain: the loop is timed once more (fresh inputs,
    the same calibration) and the run with the smaller excess is kept, whole. Honest excesses over the
    tolerance are one-off drifts (envelope-diag: -0.40..+0.15 ms between identical runners); hidden work shows in
    both runs, and a candidate that hides work in one run only is timed honestly in the other. Skipped where the
    stage has not time left for another loop: the first verdict stands."""
    if deadline - time.monotonic() < 1.5 * first.seconds + 1.0:
        return first
    try:
        again = timed_loop(first.calibration)
    except StageError as exc:
        if exc.status == "timeout":
            return first
        raise
    kept = again if (again.mismatch or again.excess_ms() < first.excess_ms()) else first
    kept.second_calibration, kept.retimed = first.second_calibration, True
    kept.seconds = first.seconds + again.seconds  # the stage's split counts both loops
    return kept


def _timing_verdict(timing: PairedTiming, cached: dict[str, Any] | None, result: dict[str, Any],
                    state: dict[str, Any]) -> None:
    # The stage minus this is set-up: the split tells a slow loop from slow set-up.
    result["stage_seconds"]["timing_loop"] = timing.seconds
    if timing.cand.event_ms or timing.mismatch:
        size = state.get("chunk_bytes", 0)
        result.setdefault("correctness", {})["timed_output_check"] = (
            {"chunks_per_call": CHUNKS_PER_CALL, "chunk_bytes": size} if size else "whole")
    if timing.mismatch:
        result.update(status="incorrect", correct=False,
                      error=f"outputs produced while timing differ from the reference ({timing.mismatch})")
        result["flags"].append("timing_mismatch")
        return
    summary = timing.summary(cached_ref=(cached["ref_runtime_ms"], *cached["ref_runtime_ci_ms"]) if cached else None)
    envelope = summary.pop("envelope", None)
    result.update(summary)
    if cached:
        result["baseline_cached"] = True
    if envelope is not None:
        result.setdefault("correctness", {})["envelope"] = envelope
        if envelope["counted"] and "side_stream" not in result["flags"]:
            result["flags"].append("side_stream")
        charged = envelope.get("burst") or {}
        flag = "launch_bound" if charged.get("launch_bound") else "side_stream"
        if charged.get("counted") and flag not in result["flags"]:
            result["flags"].append(flag)
    if result.get("custom_kernel_launches") and timing.cand.event_ms and timing.unlaunched:
        result["flags"].append("fallback")  # its own kernels in the trials, none in a timed call
    floor = state.get("floor_ms")
    if floor and result.get("runtime_ms"):
        result["speed_of_light_fraction"] = floor / SOL_MARGIN / result["runtime_ms"]
    if floor and result.get("runtime_ms") is not None and result["runtime_ms"] < floor:
        result["flags"].append("excessive_speedup")
        result.setdefault("correctness", {})["speed_of_light_ms"] = floor
    result["status"] = "correct"


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
    shutil.rmtree(job_dir, ignore_errors=True)


__all__ = ["WorkerContext", "judge", "run_job", "warm_up"]
