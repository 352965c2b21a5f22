"""One GPU measures one candidate at a time, across every Evaluator on the host.

Two trainer ranks that each build an Evaluator over the same GPUs (``torchrun`` around the reward function)
would otherwise time kernels on one GPU at the same moment. A job holds its GPU's lock from its correctness
stage to its result (loading and compiling run outside it); the lock is a ``flock`` on a file named after the
physical GPU, so it holds across processes whatever ``CUDA_VISIBLE_DEVICES`` each one sees.

A hold is exclusive or shared (``DeviceHold``). Whatever measures (the timing stage: calibration, the loop, the
probe check, a reading after the candidate's exit; a baseline-only job) holds it exclusively. Stages that run on the
device but measure nothing (correctness trials, kernel checks, the candidate's tree dying at teardown) may hold it
shared where the job says so (``job["share_device"]``): several such stages then overlap one another, never a
measurement, which waits for every shared holder to leave and holds new ones back while it waits.

Sharing modes (``Evaluator(gpu_sharing=...)``):
    ``"wait"`` (default): Evaluators on one host take turns per job.
    ``"refuse"``: an Evaluator claims its GPUs for its lifetime; a second one on the same GPU is refused at
        construction with a message naming the holder.
    ``"off"``: no host lock (one Evaluator per GPU is the user's business).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import tempfile
import threading
import time
from pathlib import Path

SHARING_MODES = ("wait", "refuse", "off")
_LOCAL = itertools.count()  # locks of one process alone: their pause files' names


def lock_dir() -> Path:
    path = Path(os.environ.get("KB_GYM_GPU_LOCK_DIR", Path(tempfile.gettempdir()) / "kb_gym_gpu_locks"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def physical_gpu(device: str) -> str:
    """The host-wide name of ``cuda:N`` as this process sees it: its entry in CUDA_VISIBLE_DEVICES (an index
    or a UUID), or N where that is unset."""
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    name = visible[index] if index < len(visible) else str(index)
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


class DeviceLock:
    """Held by one measuring job at a time, or shared by stages that measure nothing: within this process (a
    condition shared by the device's workers, a waiting exclusive hold first) and, on a GPU, across the host
    (``flock``). Each job takes its own ``hold()``."""

    def __init__(self, device: str, host_wide: bool = True) -> None:
        self.device = device
        self.path = lock_dir() / f"gpu-{physical_gpu(device)}.lock" if host_wide else None
        self._turn = threading.Condition()
        self._shared = 0  # this process's shared holds
        self._exclusive = False
        self._exclusive_waiting = 0
        self._quiet_turn = threading.Condition()
        self._loads = self._quiet_waiting = 0
        self._quiet_held = False
        self._quiet_path = self.path.with_suffix(".quiet") if self.path is not None else None
        self._load_fds: list[int] = []
        self._quiet_fd: int | None = None
        # worker/neighbours.py: a measuring judge stops the device's waiting runners through these two files
        base = self.path if self.path is not None else lock_dir() / f"local-{os.getpid()}-{next(_LOCAL)}-{device}"
        self.pause_files = [str(base.with_suffix(".measure")), str(base.with_suffix(".unpaused"))]

    def hold(self) -> DeviceHold:
        return DeviceHold(self)

    def close(self) -> None:
        """Remove the pause files of a lock of this process alone (a host-wide lock's files are the host's)."""
        if self.path is None:
            for name in self.pause_files:
                with contextlib.suppress(OSError):
                    os.unlink(name)

    def _enter(self, exclusive: bool) -> None:
        with self._turn:
            if exclusive:
                self._exclusive_waiting += 1
                try:
                    while self._exclusive or self._shared:
                        self._turn.wait()
                finally:
                    self._exclusive_waiting -= 1
                self._exclusive = True
            else:  # behind a waiting exclusive hold: a measurement is not put off by a stream of shared ones
                while self._exclusive or self._exclusive_waiting:
                    self._turn.wait()
                self._shared += 1

    def _leave(self, exclusive: bool) -> None:
        with self._turn:
            if exclusive:
                self._exclusive = False
            else:
                self._shared -= 1
            self._turn.notify_all()


    # --- quiet: a baseline-only job times the reference with no candidate loading beside it ----------------
    # Loading runs outside the device lock (so compiling overlaps timing), and a candidate's import is its own
    # code: one that kept the host busy while another worker timed a baseline-only job had that baseline cached
    # 3x too slow, and every later honest copy of the reference on that problem got 3.7x (red team round 8).
    # Loads hold the quiet lock shared, from a job's start to its device grant; a baseline-only job holds it
    # exclusively, with priority over new loads (a waiting one blocks them), so it waits at most for the loads
    # already running.

    def begin_load(self) -> None:
        with self._quiet_turn:
            while self._quiet_waiting or self._quiet_held:
                self._quiet_turn.wait()
            self._loads += 1
        if self._quiet_path is not None:
            gate = flock_file(self._quiet_path.with_suffix(".gate"), fcntl.LOCK_EX)  # waits behind a quiet job
            fd = flock_file(self._quiet_path, fcntl.LOCK_SH)
            os.close(gate)
            with self._quiet_turn:
                self._load_fds.append(fd)

    def end_load(self) -> None:
        with self._quiet_turn:
            self._loads -= 1
            fd = self._load_fds.pop() if self._load_fds else None
            self._quiet_turn.notify_all()
        if fd is not None:
            os.close(fd)

    def begin_quiet(self, timeout: float | None = None) -> bool:
        """Whether the quiet was had (True: held until ``end_quiet``). False once ``timeout`` seconds passed with
        loads still running (a candidate can sleep in its import for its whole load limit): nothing is held
        then, new loads go on, and the caller's timing is not quiet (the evaluator keeps none of it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._quiet_turn:
            self._quiet_waiting += 1
            try:
                while self._loads or self._quiet_held:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._quiet_turn.wait(left)
            finally:
                self._quiet_waiting -= 1
                self._quiet_turn.notify_all()  # loads held back by this wait go on if it ends here
            self._quiet_held = True
        if self._quiet_path is not None:
            gate = flock_file(self._quiet_path.with_suffix(".gate"), fcntl.LOCK_EX, deadline)  # new loads wait
            fd = flock_file(self._quiet_path, fcntl.LOCK_EX, deadline) if gate is not None else None
            if gate is not None:
                os.close(gate)
            if fd is None:  # loads of another process outlasted the wait
                self.end_quiet()
                return False
            self._quiet_fd = fd
        return True

    def end_quiet(self) -> None:
        if self._quiet_fd is not None:
            os.close(self._quiet_fd)
            self._quiet_fd = None
        with self._quiet_turn:
            self._quiet_held = False
            self._quiet_turn.notify_all()


class DeviceHold:
    """One job's hold on its device: ``take(exclusive=...)`` changes its mode (by leaving, then waiting for the
    other: two shared holders both asking for it exclusively would otherwise wait for each other for ever), and
    ``release`` ends it. Across the host a shared hold is ``LOCK_SH`` on the GPU's file and an exclusive one
    ``LOCK_EX``; a gate file (held exclusively while an exclusive hold waits, and briefly by each shared one on
    its way in) keeps other processes' shared holds from starving it."""

    def __init__(self, lock: DeviceLock) -> None:
        self.lock = lock
        self.mode: str | None = None  # "shared", "exclusive", or None (not held)
        self._fd: int | None = None

    def take(self, exclusive: bool) -> None:
        mode = "exclusive" if exclusive else "shared"
        if self.mode == mode:
            return
        self.release()
        self.lock._enter(exclusive)
        try:
            if self.lock.path is not None:
                gate = flock_file(self.lock.path.with_suffix(".gate"), fcntl.LOCK_EX)
                try:
                    self._fd = flock_file(self.lock.path, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                finally:
                    os.close(gate)
        except BaseException:
            self.lock._leave(exclusive)
            raise
        self.mode = mode

    def release(self) -> None:
        if self.mode is None:
            return
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
        self.lock._leave(self.mode == "exclusive")
        self.mode = None


def flock_file(path: Path, how: int, deadline: float | None = None) -> int | None:
    """An open descriptor holding ``flock(how)`` on ``path``; None where ``deadline`` (time.monotonic()) passed
    first."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        while True:
            try:
                fcntl.flock(fd, how if deadline is None else how | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return None
                time.sleep(0.01)
    except BaseException:
        os.close(fd)
        raise


class GpuClaim:
    """An Evaluator's claim on its GPUs for its lifetime (``gpu_sharing="refuse"``)."""

    def __init__(self, devices: list[str]) -> None:
        self._fds: list[int] = []
        try:
            for device in dict.fromkeys(d for d in devices if d.startswith("cuda")):
                path = lock_dir() / f"gpu-{physical_gpu(device)}.owner"
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                    os.close(fd)
                    raise RuntimeError(
                        f"{device} is already claimed by another kb_gym Evaluator on this host (pid {holder}; "
                        f"{path}). Give each process its own GPUs, share one evaluator service "
                        "(docs/distributed.md), or use gpu_sharing='wait' to take turns") from None
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                self._fds.append(fd)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
