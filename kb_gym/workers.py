"""The evaluator's side of a worker: start it, feed it a job, watch the clock and memory, kill it."""

from __future__ import annotations

import collections
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kb_gym import sandbox
from kb_gym.calibration_board import CalibrationBoard, problem_hash
from kb_gym.device_lock import DeviceHold, DeviceLock
from kb_gym.file_tree import remove_tree
from kb_gym.host_memory import candidate_memory_bytes
from kb_gym.scratch_disk import tree_disk_usage
from kb_gym.store import cache_dir
from kb_gym.worker.process import cpu_malloc_env
from kb_gym.worker.protocol import LANDLOCK_BREAKS_CUDA, MessageReader, ProtocolError, write_message

LOG_TAIL_BYTES = 16 * 1024
STARTUP_TIMEOUT = 300.0
START_RETRY_PAUSE_S = 1.0
POLL_SECONDS = 0.25
DISK_POLL_SECONDS = 1.0  # a walk of the scratch folder: cheap, but not every memory poll
# A baseline-only job waits at most this long for the device's running loads to end (device_lock.py, quiet):
# most honest loads end well within it (a cold CUDA build may not: that baseline is then timed paired); one that
# sleeps through its load limit holds the device's baseline-only jobs and new loads no longer
QUIET_WAIT_S = 30.0
JUDGE_GRACE = 10.0  # seconds past a stage's limit before the judge itself is taken for hung



def extensions_dir() -> Path:
    """The build cache the judges of this process's Evaluators share (``KB_GYM_EXTENSIONS_DIR``, else under
    kb_gym's cache folder; worker/build_cache.py)."""
    return Path(os.environ.get("KB_GYM_EXTENSIONS_DIR") or cache_dir() / "torch_extensions")

class WorkerDied(RuntimeError):
    pass


class _LandlockBreaksCuda(WorkerDied):
    """The GPU worker's CUDA did not start under Landlock (KB_GYM_LANDLOCK=auto): start it unconfined."""


# device -> CUDA's error under Landlock, for devices whose workers run unconfined in this process
_LANDLOCK_BREAKS_CUDA: dict[str, str] = {}


class LogDrain(threading.Thread):
    """Reads the worker's stdout+stderr continuously, keeping only the tail: a candidate that
    prints 50 MB neither blocks on a full pipe nor fills our memory."""

    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True, name="kb-gym-worker-log")
        self.stream = stream
        self.tail: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.total = 0
        self.lock = threading.Lock()

    def run(self) -> None:
        fd = self.stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            with self.lock:
                self.total += len(chunk)
                self.tail.append(chunk)
                self.size += len(chunk)
                while self.size - len(self.tail[0]) >= LOG_TAIL_BYTES:
                    self.size -= len(self.tail.popleft())

    def mark(self) -> int:
        with self.lock:
            return self.total

    def text_since(self, mark: int) -> str:
        with self.lock:
            data = b"".join(self.tail)
            new = self.total - mark
        data = data[-min(new, LOG_TAIL_BYTES):] if new > 0 else b""
        return data.decode(errors="replace")


def _memory_hint(rss_mb: float) -> str:
    """Why a worker may have vanished without a word: the kernel's out-of-memory killer."""
    import psutil

    total_mb = psutil.virtual_memory().total / 2**20
    if rss_mb > 0.7 * total_mb:
        return (f"; it used up to {rss_mb / 1024:.1f} of the machine's {total_mb / 1024:.1f} GB, so the kernel's "
                "out-of-memory killer is the likely cause (the problem's tensors do not fit in host memory)")
    return ""


class WorkerHandle:
    """One warm worker process bound to one device.

    ``device_lock``: shared by the workers of one device (and, on a GPU, by every Evaluator on the host:
    device_lock.py). A worker holds it from its correctness stage to its result, so that loading and
    compiling (nvcc can take a minute) overlap while kernels never run side by side, and timing sees
    the device alone.
    """

    def __init__(self, device: str, device_lock: DeviceLock | None = None,
                 calibrations: CalibrationBoard | None = None) -> None:
        self.device = device
        self.device_lock = device_lock
        self.calibrations = calibrations  # shared by the Evaluator's workers: what each judge measured, for the others
        self.lock_intervals: collections.deque[tuple[float, float]] = collections.deque(maxlen=64)
        self.proc: subprocess.Popen | None = None
        self.reader: MessageReader | None = None
        self.drain: LogDrain | None = None
        self.info: dict[str, Any] = {}
        self.restarts = 0
        self.start_failures = 0  # starts that failed and were tried again
        self.jobs = 0
        self.runner_pid: int | None = None  # the job's runner as the judge names it (the memory measure's files)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        try:
            self._start(unconfined=self.device in _LANDLOCK_BREAKS_CUDA)
        except _LandlockBreaksCuda as exc:
            # Remembered per device for this process: later restarts go straight to an unconfined worker.
            _LANDLOCK_BREAKS_CUDA[self.device] = str(exc)
            self._start(unconfined=True)
        if self.device in _LANDLOCK_BREAKS_CUDA:
            self.info["landlock_unusable"] = _LANDLOCK_BREAKS_CUDA[self.device]

    def _command(self) -> list[str]:
        return [*sandbox.namespace_prefix(), sys.executable, "-P", "-m", "kb_gym.worker", "--device", self.device]

    def _start(self, unconfined: bool) -> None:
        env = dict(os.environ)
        if unconfined:
            env["KB_GYM_LANDLOCK"] = "0"
        env.update(PYTHONUNBUFFERED="1", TORCHINDUCTOR_COMPILE_THREADS="1",
                   PYTHONDONTWRITEBYTECODE="1")
        if self.device == "cpu":
            # One intra-op thread, as in its runners (runner_start.runner_env): the judge's OpenMP pool
            # must not spin on the cores its runner's call needs right after.
            env.update(TRITON_INTERPRET="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                       **cpu_malloc_env())
        else:
            env.pop("TRITON_INTERPRET", None)  # a caller's interpreter setting must not reach a GPU worker
        env.setdefault("KB_GYM_EXTENSIONS_DIR", str(extensions_dir()))
        # -P and a neutral working directory: whatever folder the caller runs in (a clone's root
        # holds a kb_gym/ source folder) must not shadow the installed package in the worker.
        self.proc = subprocess.Popen(self._command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, start_new_session=True,
                                     close_fds=True, cwd=tempfile.gettempdir())
        self.reader = MessageReader(self.proc.stdout.fileno())
        self.drain = LogDrain(self.proc.stderr)
        self.drain.start()
        mark = 0
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            try:
                msg = self.reader.read(max(0.0, deadline - time.monotonic()))
            except ProtocolError:
                msg = None
            if msg is not None and msg.get("type") == "ready":
                break
            log = self.drain.text_since(mark)
            self.kill()
            if msg is not None and msg.get("type") == LANDLOCK_BREAKS_CUDA:
                raise _LandlockBreaksCuda(msg.get("error", ""))
            raise WorkerDied(f"worker for {self.device} failed to start: {log[-2000:]}")
        self.info = {**msg, **sandbox.describe()}

    def kill(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None  # forgotten first: nothing below may leave a dead worker in use
        sandbox.kill_and_wait(proc)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        scratch = self.info.get("scratch")
        if scratch and os.path.basename(scratch).startswith("kb_gym_worker_"):
            remove_tree(scratch)  # what its runners left in it may have any shape (file_tree.py)

    def shutdown(self) -> None:
        if self.alive:
            try:
                write_message(self.proc.stdin.fileno(), {"type": "shutdown"})
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def _rss_mb(self) -> float:
        """The host memory held against the job's candidate, in MB (host_memory.candidate_memory_bytes): the tree's
        but the judge's own pages and the spares' premapped memfds; the runner as the judge named it (a "runner"
        message, sent before the runner loads the candidate)."""
        return candidate_memory_bytes(self.proc.pid, self.info.get("pid"), self.runner_pid) / 2**20

    def ensure_started(self) -> None:
        """A live worker: started on first use, started again (a restart) after one died.

        A start that fails is tried once more before it becomes the job's verdict: no candidate has run yet, so
        the failure is the evaluator's, and a policy must not be charged a ``crash`` for it (found on the H200:
        one of eight judges failed to restart during a GPU-size audit)."""
        if not self.alive:
            if self.proc is not None:
                self.kill()
            if self.jobs:
                self.restarts += 1
            try:
                self.start()
            except WorkerDied:
                self.start_failures += 1
                time.sleep(START_RETRY_PAUSE_S)
                self.start()

    def run(self, job: dict[str, Any], stage_limits: dict[str, float], memory_limit_mb: float,
            disk_limit_mb: float = 0.0) -> dict[str, Any]:
        """Send a job and wait for its result; a dead, hung or bloated worker becomes a verdict.

        After any verdict that is not the worker's own result, the worker is killed; the next
        call starts a fresh one.
        """
        self.ensure_started()
        self.jobs += 1
        lock = self.device_lock
        if lock is not None:
            job = {**job, "device_lock": True}
            if os.environ.get("KB_GYM_NEIGHBOUR_PAUSE", "1") != "0":  # its runner stopped while another job measures
                job["pause_files"] = lock.pause_files  # the device, and theirs while it does (worker/neighbours.py)
        held_since: list[float] = []
        hold = lock.hold() if lock is not None else None
        # A baseline-only job is timed with no candidate loading beside it; a candidate's job counts as loading
        # until its device grant (device_lock.py, quiet).
        baseline_only = lock is not None and job.get("source") is None
        loading = [lock is not None and not baseline_only]
        quiet = baseline_only and lock.begin_quiet(QUIET_WAIT_S)
        if loading[0]:
            lock.begin_load()
        try:
            result = self._run(job, stage_limits, memory_limit_mb, disk_limit_mb, held_since, loading, hold)
            if baseline_only and not quiet:  # timed beside loads that outlasted the wait: not kept (evaluator)
                result["timed_beside_loads"] = True
            return result
        finally:
            if loading[0]:
                lock.end_load()
            if quiet:
                lock.end_quiet()
            if held_since:
                self.lock_intervals.append((held_since[0], time.monotonic()))
            if hold is not None:
                hold.release()

    def _run(self, job: dict[str, Any], stage_limits: dict[str, float], memory_limit_mb: float,
             disk_limit_mb: float, held_since: list[float], loading: list[bool],
             hold: DeviceHold | None = None) -> dict[str, Any]:
        mark = self.drain.mark()
        stage = "load"
        stage_started = time.monotonic()
        token = secrets.token_hex(16)
        self.runner_pid = None
        peak_rss = 0.0
        device_wait = 0.0  # seconds this job waited for the shared device's grant
        disk_checked = time.monotonic()
        try:
            write_message(self.proc.stdin.fileno(), {**job, "token": token})
        except OSError as exc:
            return self._fail("crash", f"could not send the job to the worker ({exc})", mark, stage)
        paused_since: float | None = None  # a pause of its runner going on (worker/neighbours.py)
        problem = problem_hash(job["problem_code"]) if isinstance(job.get("problem_code"), str) else ""
        pause_cap = stage_limits.get("timing", 300.0) + JUDGE_GRACE  # what one pause may take off: a measurement's
        while True:
            # The judge ends a runner's overrun itself a little before the limit; this is the backstop. A pause stops
            # the clock, for as long as a measurement may last at most (then it runs again).
            limit = stage_limits.get(stage, 300.0) + JUDGE_GRACE
            now = time.monotonic()
            paused = min(now - paused_since, pause_cap) if paused_since is not None else 0.0
            remaining = stage_started + paused + limit - now
            if remaining <= 0:
                return self._fail("timeout", f"the {stage} stage exceeded its {limit:g} s limit", mark, stage)
            try:
                msg = self.reader.read(min(POLL_SECONDS, remaining))
            except ProtocolError as exc:
                code = self._exit_code()
                why = f"the worker process died (exit code {code})" if code is not None else str(exc)
                return self._fail("crash", f"{why} during the {stage} stage{_memory_hint(peak_rss)}", mark, stage)
            if msg is not None and msg.get("token") != token:
                fail = self._fail("incorrect", "a message without this job's token reached the evaluator: the "
                                               "candidate wrote to the worker's result channel", mark, stage)
                fail["flags"] = ["tampering"]
                return fail
            if msg is None:
                rss = self._rss_mb()
                peak_rss = max(peak_rss, rss)
                if rss > memory_limit_mb:
                    return self._fail("crash", f"host memory use {rss:.0f} MB exceeded the "
                                               f"{memory_limit_mb:.0f} MB limit during the {stage} stage", mark, stage)
                if disk_limit_mb and time.monotonic() - disk_checked >= DISK_POLL_SECONDS:
                    disk_checked = time.monotonic()
                    over = self._over_disk(disk_limit_mb)
                    if over:
                        return self._fail("crash", f"{over} during the {stage} stage", mark, stage)
                continue
            if msg.get("type") == "stage":
                stage = str(msg.get("stage"))
                stage_started = time.monotonic()
                paused_since = stage_started if paused_since is not None else None
                continue
            if msg.get("type") == "pause":
                # its runner stopped for another job's measurement (worker/neighbours.py): not this stage's time
                if msg.get("state") == "begin":
                    paused_since = time.monotonic()
                elif paused_since is not None:
                    stage_started += min(time.monotonic() - paused_since, pause_cap)
                    paused_since = None
                continue
            if msg.get("type") == "calibration":  # a spare's fresh calibration, for the device's other judges
                if self.calibrations is not None:
                    self.calibrations.keep(self.device, msg.get("entry"))
                continue
            if msg.get("type") == "runner" and isinstance(msg.get("pid"), int):
                self.runner_pid = msg["pid"]
                continue
            if msg.get("type") == "acquire":
                if loading[0]:  # its load is over: a baseline-only job waiting to time may start
                    loading[0] = False
                    self.device_lock.end_load()
                if hold is not None:
                    # exclusive unless the judge asks for a stage that measures nothing (device_lock.py, modes)
                    asked = time.monotonic()
                    hold.take(exclusive=msg.get("exclusive", True) is not False)
                    if not held_since:
                        held_since.append(time.monotonic())
                    device_wait += time.monotonic() - asked  # the waits are not the worker's time
                grant: dict[str, Any] = {"type": "granted"}
                if self.calibrations is not None and problem:  # measured by the device's judges up to now
                    grant["calibrations"] = self.calibrations.for_problem(self.device, problem)
                try:
                    write_message(self.proc.stdin.fileno(), grant)
                except OSError as exc:
                    return self._fail("crash", f"could not grant the device to the worker ({exc})", mark, stage)
                stage_started, paused_since = time.monotonic(), None  # granted: no pause of its runner goes on
                continue
            if msg.get("type") == "result" and msg.get("job_id") == job["job_id"]:
                msg["log_tail"] = self.drain.text_since(mark)
                if held_since and isinstance(msg.get("stage_seconds"), dict):
                    # Where a shared device's time goes: the wait for it, and how long the job held it.
                    msg["stage_seconds"]["device_wait"] = device_wait
                    held = msg["stage_seconds"]["device_held"] = time.monotonic() - held_since[0]
                    now = time.time()  # on the wall clock: a batch's holds laid side by side (batch_report)
                    msg["held_at"] = [now - held, now]
                if msg.get("restart"):
                    self.kill()
                return msg

    def _over_disk(self, disk_limit_mb: float) -> str:
        """Why the worker tree's disk use is over its limit (scratch_disk.py), or "" when it is not."""
        scratch = self.info.get("scratch")
        if not scratch or self.proc is None:
            return ""
        usage = tree_disk_usage(self.proc.pid, scratch)
        if usage.too_many_entries:
            return f"its scratch folder held more than {usage.max_entries:,} files and folders"
        if usage.nbytes > disk_limit_mb * 2**20:
            held = f", {usage.held_removed / 2**20:.0f} MB of it in removed files still held open" \
                if usage.held_removed else ""
            return f"disk use {usage.nbytes / 2**20:.0f} MB{held} exceeded the {disk_limit_mb:.0f} MB limit"
        return ""

    def _exit_code(self) -> int | None:
        """The worker's exit status; its pipe closes a moment before the kernel reports the exit."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return None

    def _fail(self, status: str, error: str, mark: int, stage: str) -> dict[str, Any]:
        log = self.drain.text_since(mark) if self.drain else ""
        self.kill()
        return {"type": "result", "status": status, "error": error, "log_tail": log, "failed_stage": stage,
                "flags": [], "stage_seconds": {}, "restart": True}
