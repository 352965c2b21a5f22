"""Evaluator: one object that serves envs, TRL reward functions, the CLI and the benchmark.

Cheap verdicts (no code block, a syntax error, text too long) are decided here in microseconds;
everything else goes through a queue to one warm worker process per device. The evaluator process
never imports candidate code.
"""

from __future__ import annotations

import ast
import atexit
import hashlib
import io
import os
import queue
import secrets
import threading
import time
import tokenize
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any

from kb_gym.baseline_cache import BaselineCache, baseline_key, measured_entry
from kb_gym.calibration_board import CalibrationBoard
from kb_gym.config import EvalConfig, resolve_config
from kb_gym.device_lock import SHARING_MODES, DeviceLock, GpuClaim
from kb_gym.device_turns import ALONE, EVICTING, SIDE_BY_SIDE, TURN_MEMORY_S, DeviceTurns
from kb_gym.extract import extract_code
from kb_gym.feedback import render_feedback
from kb_gym.integrity import Finding, get_policy, static_findings
from kb_gym.problems import Problem
from kb_gym.result import EvalResult, Status, plain_text
from kb_gym.store import ResultsStore, default_results_path
from kb_gym.worker.protocol import PAYLOAD_NOTES, PAYLOAD_PARTS
from kb_gym.workers import WorkerDied, WorkerHandle

MAX_TEXT_CHARS = 1_000_000
# After a baseline-only job's wait for quiet was cut, the problem's candidates time their own baseline this long
# instead of each waiting for a quiet again (a candidate sleeping through its load limit would stall every one)
UNQUIET_BACKOFF_S = 120.0
# Outputs up to this size let a problem's correctness stages hold the device shared (Evaluator(shared_stages=True)):
# beside another such stage they add a few GB of GPU memory at most
SHARED_STAGE_MAX_BYTES = int(float(os.environ.get("KB_GYM_SHARED_STAGE_MAX_GB", "1")) * (1 << 30))


def resolve_devices(devices: str | Sequence[str] = "auto") -> list[str]:
    """Device names, the same way in a string and in a list: ``"auto"`` (every visible GPU, else the
    CPU), ``"cuda"`` (every visible GPU), ``"cpu"``, ``"cuda:N"``, or several of those (a list, or one
    string with commas; a name given twice gets two workers). An unknown or unavailable device is a
    ValueError here, never a crash per evaluation."""
    items = devices.split(",") if isinstance(devices, str) else list(devices)
    if not items:
        raise ValueError("no device given: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    resolved: list[str] = []
    for item in items:
        name = str(item).strip().lower()
        count = _cuda_count() if name.startswith(("cuda", "auto")) else 0
        if name == "auto":
            resolved += [f"cuda:{i}" for i in range(count)] or ["cpu"]
        elif name == "cpu":
            resolved.append("cpu")
        elif name == "cuda":
            if not count:
                raise ValueError("device 'cuda' asked for, but no CUDA GPU is visible (use 'cpu' or 'auto')")
            resolved += [f"cuda:{i}" for i in range(count)]
        elif name.startswith("cuda:") and name[5:].isdigit():
            if int(name[5:]) >= count:
                raise ValueError(f"device {item!r} is not available: {count} CUDA GPU(s) visible")
            resolved.append(name)
        else:
            raise ValueError(f"unknown device {item!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return resolved


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class EvaluationAPI(ABC):
    """``evaluate`` and ``evaluate_many`` on top of a ``submit`` that returns a Future of an EvalResult: shared by
    the local :class:`Evaluator` and the Ray service's client (kb_gym.service.RayEvaluator)."""

    @abstractmethod
    def submit(self, problem: Problem, text: str, *, seed: int | None = None,
               config: EvalConfig | None = None) -> Future:
        """Start evaluating one candidate; the Future's result is its EvalResult."""

    def evaluate(self, problem: Problem, text: str, *, seed: int | None = None,
                 config: EvalConfig | None = None) -> EvalResult:
        """Evaluate one candidate (raw source or an LLM completion). Never raises for bad input."""
        return self.submit(problem, text, seed=seed, config=config).result()

    def evaluate_many(self, pairs: Iterable[tuple[Problem, str]], *, progress: bool = False,
                      config: EvalConfig | None = None) -> list[EvalResult]:
        """Evaluate many candidates concurrently across the devices; results in input order."""
        futures = [self.submit(p, s, config=config) for p, s in pairs]
        if progress:
            from concurrent.futures import as_completed

            from tqdm.auto import tqdm

            for _ in tqdm(as_completed(futures), total=len(futures), desc="evaluating", disable=None):
                pass
        return [f.result() for f in futures]


class Evaluator(EvaluationAPI):
    """Compile, check and time candidates against their reference, in sandboxed warm workers.

    Args:
        devices: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:0"`` or a list; one worker per device.
        config: an EvalConfig, or a preset's name (``"rl"``: the baseline timed once per problem and
            reused from the cache, a looser timing budget; see config.CONFIG_PRESETS); keyword
            overrides (``trials=3``, ``baseline="compile"``) apply on top.
        results_path: JSONL file every result is appended to; None = the default under the user
            cache folder, False = do not record.
        baseline_cache: a BaselineCache, None = the default file, False = none.
        workers_per_device: warm workers per device. With more than one, a device's workers load and
            compile side by side (a ``load_inline`` build no longer holds up the queue) and take
            turns on the device itself: correctness and timing never overlap on one device. A job that runs
            out of the device's memory beside the others runs again with the device to itself (device_turns.py).
        gpu_sharing: how Evaluators in other processes on this host share a GPU (device_lock.py):
            ``"wait"`` (take turns per job: two never measure on one GPU at once), ``"refuse"`` (claim the
            GPUs for this Evaluator's life; a second claimant gets a clear error), ``"off"``.
        shared_stages: the stages that measure nothing (correctness, kernel checks, the candidate's tree dying)
            of problems whose outputs are known to be at most ``SHARED_STAGE_MAX_BYTES`` hold the device shared,
            overlapping one another but never a timing stage (device_lock.py). None: ``KB_GYM_SHARED_STAGES=1``.
    """

    def __init__(self, devices: str | Sequence[str] = "auto", config: EvalConfig | str | None = None, *,
                 results_path: str | os.PathLike | None | bool = None,
                 baseline_cache: BaselineCache | None | bool = None, workers_per_device: int = 1,
                 gpu_sharing: str = "wait", shared_stages: bool | None = None, **overrides: Any) -> None:
        self.config = resolve_config(config, **overrides)  # a preset's name: "default", "rl" (CONFIG_PRESETS)
        self.devices = resolve_devices(devices)
        if results_path is False:
            self.store = None
        else:
            self.store = ResultsStore(results_path if results_path not in (None, True) else default_results_path())
        if baseline_cache is False:
            self.baselines = None
        else:
            self.baselines = baseline_cache if isinstance(baseline_cache, BaselineCache) else BaselineCache()
        self._queue: queue.Queue = queue.Queue()
        if isinstance(workers_per_device, bool) or not isinstance(workers_per_device, int) or workers_per_device < 1:
            raise ValueError(f"workers_per_device must be an integer >= 1, got {workers_per_device!r}")
        self.workers_per_device = workers_per_device
        if gpu_sharing not in SHARING_MODES:
            raise ValueError(f"gpu_sharing must be one of {SHARING_MODES}, got {gpu_sharing!r}")
        self._claim = GpuClaim(self.devices) if gpu_sharing == "refuse" else None
        self.shared_stages = (os.environ.get("KB_GYM_SHARED_STAGES", "0") == "1" if shared_stages is None
                              else bool(shared_stages))
        locks = {}
        for d in self.devices:
            host_wide = d.startswith("cuda") and gpu_sharing == "wait"
            if host_wide or workers_per_device > 1:
                locks[d] = DeviceLock(d, host_wide=host_wide)
        # the calibrations a device's judges measured, reported as measured and passed to the device's other judges
        # with each device grant (calibration_board.py, judge_timing.adopt_calibration)
        board = CalibrationBoard()
        self._workers = [WorkerHandle(d, locks.get(d), calibrations=board)
                         for d in self.devices for _ in range(workers_per_device)]
        # held by a worker's thread while it uses the worker's process, and by an alone turn stopping it (device_turns)
        self._using = {handle: threading.Lock() for handle in self._workers}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._unquiet: dict[str, float] = {}  # problem code hash -> when its baseline-only job's quiet was cut
        self._closed = False
        self._job_counter = 0
        # problem code -> its reference's output bytes, from any worker's evaluations: the judge maps a runner's
        # memfd for them before the device lock (payload.PREMAP_MIN_BYTES)
        self._output_bytes: dict[str, int] = {}
        # jobs side by side on a device, or one alone after one ran out of its memory beside others (device_turns)
        self._turns = {d: DeviceTurns() for d in self.devices}
        # problem code -> (the turn its jobs start at, since when): its judge ran out of memory at the turns before
        # it (device_turns)
        self._turn_of: dict[str, tuple[int, float]] = {}

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> Evaluator:
        """Start the worker threads (workers themselves start on first use, or now if ``warm``)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this Evaluator is closed")
            if not self._threads:
                for handle in self._workers:
                    t = threading.Thread(target=self._serve, args=(handle,), daemon=True,
                                         name=f"kb-gym-{handle.device}")
                    t.start()
                    self._threads.append(t)
        return self

    def warm(self) -> Evaluator:
        """Start every worker process now, so the first evaluation pays no start-up."""
        self.start()
        for handle in self._workers:
            if not handle.alive:
                handle.start()
        return self

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout=30)
        for handle in self._workers:
            handle.shutdown()
        for lock in {id(h.device_lock): h.device_lock for h in self._workers if h.device_lock is not None}.values():
            lock.close()
        if self._claim is not None:
            self._claim.release()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __deepcopy__(self, memo: dict) -> Evaluator:
        return self  # one set of workers; copies of configs that hold an Evaluator share it

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    @property
    def worker_stats(self) -> list[dict[str, Any]]:
        return [{"device": h.device, "alive": h.alive, "jobs": h.jobs, "restarts": h.restarts,
                 "start_failures": h.start_failures, "pid": h.proc.pid if h.proc else None} for h in self._workers]

    # --- evaluation -----------------------------------------------------------------------------
    def evaluate_reference(self, problem: Problem, *, config: EvalConfig | None = None) -> EvalResult:
        """Time the baseline alone (no candidate) and store it in the baseline cache."""
        return self._dispatch(problem, None, secrets.randbits(31), config or self.config, []).result()

    def submit(self, problem: Problem, text: str, *, seed: int | None = None,
               config: EvalConfig | None = None) -> Future:
        cfg = config or self.config
        started = time.perf_counter()
        try:
            checked = self._precheck(problem, text, cfg)
        except Exception as exc:  # noqa: BLE001 - our own failure on this text: a recorded verdict all the same
            checked = self._verdict(problem, text if isinstance(text, str) else "", Status.CRASH,
                                    f"evaluator error: {type(exc).__name__}: {str(exc)[:200]}", cfg)
        if isinstance(checked, EvalResult):
            checked.stage_seconds["precheck"] = time.perf_counter() - started
            self._finish(checked, "", cfg)
            future: Future = Future()
            future.set_result(checked)
            return future
        source, findings = checked
        return self._dispatch(problem, source, seed if seed is not None else secrets.randbits(31), cfg, findings)

    def _apply_policy(self, result: EvalResult, cfg: EvalConfig) -> None:
        policy = get_policy(cfg.integrity)
        result.integrity_policy = policy.name
        result.speed_credit = not any(policy.action(f) == "no_speed_credit" for f in result.flags)

    def _precheck(self, problem: Problem, text: str, cfg: EvalConfig) -> EvalResult | tuple[str, list[Finding]]:
        """A verdict reached without a worker, or the extracted source and its static findings."""
        if not isinstance(text, str):
            return self._verdict(problem, "", Status.FORMAT_ERROR,
                                 f"the answer must be text, got {type(text).__name__}", cfg)
        if len(text) > MAX_TEXT_CHARS:
            return self._verdict(problem, text, Status.FORMAT_ERROR,
                                 f"the answer is {len(text):,} characters; the limit is {MAX_TEXT_CHARS:,}", cfg)
        found = extract_code(text)
        if found.code is None:
            return self._verdict(problem, text, Status.FORMAT_ERROR, found.error or "no code", cfg)
        if len(found.code) > cfg.max_source_chars:
            return self._verdict(problem, found.code, Status.FORMAT_ERROR,
                                 f"the code is {len(found.code):,} characters; the limit is "
                                 f"{cfg.max_source_chars:,}", cfg)
        try:
            ast.parse(found.code)
        except SyntaxError as exc:
            line = (exc.text or "").rstrip()
            return self._verdict(problem, found.code, Status.COMPILE_ERROR,
                                 f"SyntaxError: {exc.msg} (line {exc.lineno})" + (f":\n    {line}" if line else ""),
                                 cfg)
        except (RecursionError, MemoryError, ValueError) as exc:
            # what Python's own parser gives up on (60 KB of nested operators; a lone surrogate, ValueError's
            # UnicodeEncodeError) is the answer's compile error, not the caller's exception (round 10)
            return self._verdict(problem, found.code, Status.COMPILE_ERROR,
                                 f"the code cannot be parsed: {type(exc).__name__}: {str(exc)[:200]}", cfg)
        declared = declared_encoding_error(found.code)
        if declared is not None:
            return self._verdict(problem, found.code, Status.COMPILE_ERROR, declared, cfg)
        findings = static_findings(found.code)
        rejections = get_policy(cfg.integrity).rejections(findings)
        if rejections:
            result = self._verdict(problem, found.code, Status.REJECTED,
                                   "; ".join(f.message for f in rejections), cfg)
            result.findings = [f.to_dict() for f in findings]
            result.flags = sorted({f.flag for f in findings})
            return result
        return found.code, findings

    def _verdict(self, problem: Problem, source: str, status: Status, error: str, cfg: EvalConfig) -> EvalResult:
        return EvalResult(status=status.value, error=error, baseline=cfg.baseline, precision=cfg.precision,
                          **_problem_fields(problem), source_hash=_hash(source))

    def _dispatch(self, problem: Problem, source: str | None, seed: int, cfg: EvalConfig,
                  findings: list[Finding]) -> Future:
        if self._closed:
            raise RuntimeError("this Evaluator is closed")
        self.start()
        with self._lock:
            self._job_counter += 1
            job_id = self._job_counter
        job = {"type": "eval", "job_id": job_id, "problem_code": problem.code, "problem_key": problem.key,
               "source": source, "seed": seed, "config": cfg.to_dict()}
        future: Future = Future()
        self._queue.put((job, problem, cfg, findings, future, time.perf_counter()))
        return future

    def _serve(self, handle: WorkerHandle) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, problem, cfg, findings, future, queued = item
            if not future.set_running_or_notify_cancel():  # cancelled while queued: nothing to run or record
                continue
            try:
                result = self._run_on(handle, job, problem, cfg, findings, queued)
            except Exception as exc:  # noqa: BLE001 - the caller always gets a verdict, and it is recorded
                result = self._verdict(problem, job.get("source") or "", Status.CRASH,
                                       f"evaluator error: {type(exc).__name__}: {exc}", cfg)
                try:
                    self._finish(result, "", cfg)
                except Exception:  # noqa: BLE001 - a full disk must not hang the caller
                    pass
            future.set_result(result)

    def _run_on(self, handle: WorkerHandle, job: dict, problem: Problem, cfg: EvalConfig,
                findings: list[Finding], queued: float, implicit: bool = False) -> EvalResult:
        """``implicit``: a baseline-only job the evaluator runs for itself (the cache filled, nothing stored)."""
        limits = {s: cfg.stage_limit(s) for s in ("load", "correctness", "timing", "dataflow", "knockout")}
        reuse = job["source"] is not None and self._reuses_baselines(handle, cfg)
        job["cached_baseline"] = self._cached_baseline(handle, problem, cfg) if reuse else None
        if reuse and job["cached_baseline"] is None and not self._unquiet_lately(problem):
            # The cache is filled only by baseline-only jobs, timed with no candidate's processes alive (round 4:
            # a baseline timed beside a candidate's children, which a freeze cannot stop in the kernel, was kept
            # and inflated later candidates' speedups). A miss costs one such job, once per problem and hardware.
            with self._lock:
                self._job_counter += 1
                base_job = {**job, "job_id": self._job_counter, "source": None}
            self._run_on(handle, base_job, problem, cfg, [], time.perf_counter(), implicit=True)
            job["cached_baseline"] = self._cached_baseline(handle, problem, cfg)
        started = time.perf_counter()
        with self._lock:
            job["payload_hint"] = self._output_bytes.get(problem.code, 0)
            # a problem's first evaluation, whose outputs are not yet known, holds the device exclusively throughout:
            # two large correctness stages side by side could run an honest candidate out of GPU memory
            job["share_device"] = self.shared_stages and 0 < job["payload_hint"] <= SHARED_STAGE_MAX_BYTES
        raw = self._run_turns(handle, job, problem, limits, cfg)
        output_bytes = (raw.get("correctness") or {}).get("output_bytes")
        if isinstance(output_bytes, int) and output_bytes > 0:
            with self._lock:
                self._output_bytes[problem.code] = output_bytes
        log_tail = raw.pop("log_tail", "")
        known = {k: raw[k] for k in ("status", "compiled", "correct", "speedup", "speedup_ci", "runtime_ms",
                                     "baseline_cached",
                                     "runtime_ci_ms", "ref_runtime_ms", "ref_runtime_ci_ms", "timing_reps",
                                     "host_runtime_ms", "ref_host_runtime_ms", "speed_of_light_fraction",
                                     "backend", "flags", "error", "correctness", "custom_kernel_launches",
                                     "stage_seconds") if k in raw}
        known.setdefault("status", Status.CRASH.value)
        if job["source"] is None and known["status"] == "correct":
            known["correct"] = False  # a baseline-only job has no candidate to be correct
        result = EvalResult(**known, **_problem_fields(problem), source_hash=_hash(job["source"] or ""),
                            baseline=cfg.baseline, precision=cfg.precision, device=handle.device,
                            hardware=dict(handle.info.get("hardware", {})),
                            worker=_worker_fields(handle, raw.get("runner")))
        result.stage_seconds["queue"] = started - queued
        for span in ("timed_at", "held_at"):  # the timing stage's, and the device hold's, on the wall clock
            if raw.get(span):
                result.worker[span] = raw[span]
        for key in ("alone", "evicted", "retried_alone", "device_oom"):  # device_turns: the device to itself, and why
            if raw.get(key):
                result.worker[key] = raw[key]
        if raw.get("neighbour_gpu_check"):  # whether its pauses looked at its queued GPU work (gpu_activity.py)
            result.worker["neighbour_gpu_check"] = raw["neighbour_gpu_check"]
        if isinstance(raw.get("load_forward"), dict):  # the forward after its load, where switched on (load_forward.py)
            result.worker["load_forward"] = raw["load_forward"]
        result.stage_seconds["total"] = time.perf_counter() - queued
        if raw.get("failed_stage"):
            result.correctness.setdefault("failed_stage", raw["failed_stage"])
        if findings:  # notes and speed-credit flags; rejections never reach a worker
            result.findings = [f.to_dict() for f in findings]
            result.flags = sorted(set(result.flags) | {f.flag for f in findings})
        if job["source"] is None and raw.get("timed_beside_loads"):
            # its wait for the device's loads to end was cut (workers.QUIET_WAIT_S): kept nowhere, and for a
            # while the problem's candidates time their own baseline rather than wait for a quiet again
            result.worker["timed_beside_loads"] = True
            with self._lock:
                self._unquiet[problem.code_hash] = time.monotonic()
        elif job["source"] is None:
            self._record_baseline(problem, cfg, result)
        if not implicit:
            self._finish(result, log_tail, cfg)
        return result

    def _run_turns(self, handle: WorkerHandle, job: dict, problem: Problem, limits: dict[str, float],
                   cfg: EvalConfig) -> dict[str, Any]:
        """The job's raw result from a turn on its device (device_turns.py): beside the device's other jobs
        (``SIDE_BY_SIDE``), alone once they end (``ALONE``), or alone with the device's other workers stopped
        (``EVICTING``). A job that ran out of the device's memory is run again at the next turn that can help (alone
        where another job ran beside it; evicting where another worker is alive and the memory that ran out was the
        judge's), and the last run is the verdict. A runner's out-of-memory is the candidate's footprint: it never
        stops other workers (a policy's buggy kernels ask for 1 TB often) and sets nothing for its problem. Where the
        judge's did and a retry did not run out, the problem's later jobs start at that turn for TURN_MEMORY_S."""
        turns = self._turns[handle.device]
        now = time.monotonic()
        with self._lock:
            turn, since = self._turn_of.get(problem.code, (SIDE_BY_SIDE, now))
        if now - since > TURN_MEMORY_S:  # side by side again now and then: what the company held may be gone
            turn = SIDE_BY_SIDE
        raw, overlapped = self._attempt(handle, job, limits, cfg, turns, turn)
        first, whose = "", raw.get("device_oom")
        while raw.get("device_oom"):
            if turn == SIDE_BY_SIDE and overlapped:
                turn = ALONE
            elif turn < EVICTING and whose == "judge" and self._others_alive(handle):
                turn = EVICTING
            else:
                break
            first = first or f"{raw.get('status')}: {str(raw.get('error') or '')[:300]}"
            with self._lock:
                self._job_counter += 1
                job = {**job, "job_id": self._job_counter}
            raw, overlapped = self._attempt(handle, job, limits, cfg, turns, turn)
        if first:
            raw["retried_alone"] = first
            if whose == "judge" and not raw.get("device_oom"):  # the company: the problem's jobs start here now
                with self._lock:
                    self._turn_of[problem.code] = (turn, time.monotonic())
        return raw

    def _attempt(self, handle: WorkerHandle, job: dict, limits: dict[str, float], cfg: EvalConfig,
                 turns: DeviceTurns, turn: int) -> tuple[dict[str, Any], bool]:
        with turns.turn(turn > SIDE_BY_SIDE) as held:
            evicted = self._evict_others(handle) if turn == EVICTING else 0
            try:
                with self._using[handle]:
                    raw = handle.run(job, limits, cfg.memory_limit_mb, cfg.disk_limit_mb)
            except WorkerDied as exc:
                raw = {"status": "crash", "error": str(exc), "flags": [], "stage_seconds": {}}
        if turn > SIDE_BY_SIDE:
            raw["alone"] = True
            raw["evicted"] = evicted
        return raw, held.overlapped

    def _others_alive(self, handle: WorkerHandle) -> bool:
        return any(w.alive for w in self._workers if w is not handle and w.device == handle.device)

    def _evict_others(self, handle: WorkerHandle) -> int:
        """Stop the device's other workers (idle: the turn is alone), so that what they hold on the device between
        jobs (their CUDA contexts, spares, probe, device buffers: ~37 GB of an H100's 80 beside an alone job,
        session 38) is free for this one; each starts again with its next job. Returns how many were stopped."""
        stopped = 0
        for other in self._workers:
            if other is handle or other.device != handle.device:
                continue
            with self._using[other]:  # not while its thread starts it for a job's baseline key (_reuses_baselines)
                if other.alive:
                    other.shutdown()
                    stopped += 1
        return stopped

    def _unquiet_lately(self, problem: Problem) -> bool:
        """Whether a baseline-only job of this problem was lately cut short of its quiet (loads ran on)."""
        with self._lock:
            cut = self._unquiet.get(problem.code_hash)
        return cut is not None and time.monotonic() - cut < UNQUIET_BACKOFF_S

    def _reuses_baselines(self, handle: WorkerHandle, cfg: EvalConfig) -> bool:
        if not (cfg.reuse_cached_baseline and self.baselines is not None):
            return False
        try:
            with self._using[handle]:
                handle.ensure_started()  # its hardware fingerprint keys the cache
        except WorkerDied:
            return False  # the job's own run reports it
        return bool(handle.info.get("hardware", {}).get("hash"))

    def _cached_baseline(self, handle: WorkerHandle, problem: Problem, cfg: EvalConfig) -> dict | None:
        """The cached baseline timing for this problem on this worker's hardware, when asked for.

        Called once _reuses_baselines holds (a cache, and the worker's fingerprint known). A miss runs a
        baseline-only job first (_run_on): only those fill the cache."""
        hardware = handle.info.get("hardware", {}).get("hash")  # gone only if the worker died in between
        if not hardware:
            return None
        entry = self.baselines.get(baseline_key(problem.code_hash, cfg.numerics, cfg.baseline, hardware))
        if not entry or not entry.get("ref_runtime_ms") or not entry.get("ref_runtime_ci_ms"):
            return None
        return {"ref_runtime_ms": entry["ref_runtime_ms"], "ref_runtime_ci_ms": entry["ref_runtime_ci_ms"]}

    def _record_baseline(self, problem: Problem, cfg: EvalConfig, result: EvalResult) -> None:
        measured = measured_entry(problem, cfg, result) if self.baselines is not None else None
        if measured is None:
            return
        try:
            self.baselines.put(*measured)
        except OSError:
            pass  # a read-only cache must not cost the caller its verdict

    def _finish(self, result: EvalResult, log_tail: str, cfg: EvalConfig | None = None) -> None:
        self._apply_policy(result, cfg or self.config)
        if result.error:
            result.error = plain_text(result.error)
        result.feedback = plain_text(render_feedback(result, plain_text(log_tail or "")))
        if self.store is not None:
            self.store.append(result)


def _worker_fields(handle: WorkerHandle, runner: dict[str, Any] | None) -> dict[str, Any]:
    """Where the candidate ran: its runner's sandbox when it had one (a baseline-only job has none)."""
    fields = {"pid": handle.info.get("pid"), "restarts": handle.restarts, "start_failures": handle.start_failures,
              "pid_namespace": handle.info.get("pid_namespace", False),
              "network_namespace": handle.info.get("network_namespace", False), "landlock": 0}
    box = (runner or {}).get("sandbox") or {}
    if runner:
        fields.update(pid_namespace=bool(box.get("pid_namespace")),
                      network_namespace=bool(box.get("network_namespace")), landlock=int(box.get("landlock") or 0),
                      reads_confined="readable" in box,
                      seccomp=bool(box.get("seccomp")), private_shm_mb=int(box.get("private_shm_mb") or 0),
                      sysv_shm_mb=int(box.get("sysv_shm_mb") or 0),
                      capabilities=str(box.get("capabilities") or "")[:120],
                      runner_startup_s=runner.get("startup_seconds"), overhead_ms=runner.get("overhead_ms"),
                      runner_startup_phases=runner.get("startup_phases") or {},
                      runner_forked=bool(runner.get("forked")),
                      build_cached=bool(runner.get("build_cached")),
                      # kernel folders an earlier runner's Triton compiled for this source (triton_cache.py, where on)
                      triton_cached=int(runner.get("triton_cached") or 0),
                      # Triton launchers the judges built, seeded; and of those its calls asked for, how many were in
                      # its cache and how many it built (triton_launchers.py; all 0 where Triton has none to build)
                      triton_launchers=_launcher_counts(runner.get("triton_launchers")),
                      # a cache hit whose build was up to date in the runner (False: rebuilt all the same)
                      build_reused=runner["build_reused"] if isinstance(runner.get("build_reused"), bool) else None,
                      # when a new build went into the cache: right after the load, or once the runner was gone
                      build_kept=runner["build_kept"] if runner.get("build_kept") in ("at_load", "at_exit") else None,
                      shm_payloads=int(runner.get("shm_payloads") or 0),
                      device_payloads=int(runner.get("device_payloads") or 0),  # through GPU memory (device_payload.py)
                      payload_pinned=bool(runner.get("payload_pinned")),
                      # per memfd payload: the runner's copy in, the judge's mapping, its copy out and hash
                      payload_seconds=_payload_seconds(runner.get("payload_seconds")),
                      # the runner's mapping of its memfd as the job prepared it (before the device lock)
                      payload_premap_s=float(runner.get("payload_premap_s") or 0.0),
                      # a first evaluation's outputs, from a forward on the meta device (worker/output_size.py)
                      predicted_output_bytes=int(runner.get("predicted_output_bytes") or 0),
                      digest="device" if runner.get("digest") == "device" else "host",
                      launch_shim=bool(runner.get("launch_shim")),  # own launches counted per launch (launch_shim.py)
                      pch=runner.get("pch") or {"used": [], "wanted": [], "removed": []},
                      headers=list(runner.get("headers") or []))
        if runner.get("digest_note"):  # outputs on a GPU hashed on the host: why (device_digest.py)
            fields["digest_note"] = str(runner["digest_note"])
        if runner.get("zygote_error"):
            fields["zygote_error"] = runner["zygote_error"]
    return fields


def _payload_seconds(value: Any) -> dict[str, list[float]]:
    parts = value if isinstance(value, dict) else {}
    return {k: [float(x) for x in parts.get(k) or [] if isinstance(x, int | float)][:PAYLOAD_NOTES]
            for k in PAYLOAD_PARTS}


def _launcher_counts(value: Any) -> dict[str, int]:
    got = value if isinstance(value, dict) else {}
    return {k: int(got[k]) if isinstance(got.get(k), int) and not isinstance(got.get(k), bool) else 0
            for k in ("seeded", "hits", "misses")}


def _problem_fields(problem: Problem) -> dict[str, Any]:
    return {"problem_name": problem.name, "problem_id": problem.id, "level": problem.level}


def declared_encoding_error(code: str) -> str | None:
    """Why ``code`` would not run as the text that was checked, or None. The runner imports it from a file of its
    UTF-8 bytes, and Python decodes a file by its coding declaration (PEP 263), while the parse, the static checks
    and every reader take the text: under ``# coding: utf-7`` a comment's ``+AAo-`` is a line break for Python
    (``\\u000a`` under ``unicode_escape``), and whatever follows it ran unchecked (round 12)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(code.encode("utf-8", "surrogatepass")).readline)
    except SyntaxError as exc:
        return f"the source's coding declaration cannot be used: {exc}"
    if encoding in ("utf-8", "utf-8-sig"):
        return None
    return (f"the source declares the encoding {encoding!r}, but it is run as the UTF-8 text it is: remove the "
            "coding declaration (or declare utf-8)")


def _hash(source: str) -> str:
    # surrogatepass: "replace" made a lone surrogate and "?" one program (round 10)
    return hashlib.sha256(source.encode(errors="surrogatepass")).hexdigest()[:16]


_shared: dict[tuple[str, ...], Evaluator] = {}
_shared_lock = threading.Lock()


def evaluate(problem: Problem, text: str, device: str = "auto", **overrides: Any) -> EvalResult:
    """One-shot evaluation through a shared, lazily started Evaluator per device set; keyword
    overrides (``trials=3``, ``baseline="compile"``) apply to this call only."""
    devices = tuple(resolve_devices(device))
    with _shared_lock:
        ev = _shared.get(devices)
        if ev is None:
            ev = _shared[devices] = Evaluator(list(devices))
            atexit.register(ev.close)
    return ev.evaluate(problem, text, config=ev.config.replace(**overrides) if overrides else None)
