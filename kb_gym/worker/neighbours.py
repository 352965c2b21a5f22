"""A device's measurements with its neighbours' runners stopped.

Loading and compiling run outside the device lock, so that they overlap another job's timing (workers.py,
device_lock.py). But a loading candidate's import is its own code: it can launch kernels on the GPU, or keep the host's
cores busy, while another judge times an honest sibling on the same device. The probe check cannot tell whose context
a gap is (round 24), so such a neighbour voided or charged the sibling's pass: no speed credit for it, and in a GRPO
group a candidate that lowers its siblings' rewards raises its own advantage. The same holds for a job that waits for
the device with its runner alive (after its load, or between shared stages).

So every job whose runner is alive while it does not hold its device is watched (``PauseWatcher``), and a judge that
measures (the timing stage; a reading after a candidate's exit) first stops every watched runner of the device
(``Measuring``). Two lock files per device do it, across judges and across Evaluators of one host, beside the device
lock's own (``job["pause_files"]``, from ``DeviceLock.pause_files``):

- ``measure``: a measuring judge holds it exclusively for the measurement. A watcher sees it taken (a non-blocking
  shared try, every POLL_S) and stops its runner's whole tree, as ``RunnerProcess.frozen`` does;
- ``unpaused``: each watcher holds it shared while its runner may run. The measuring judge takes it exclusively, so it
  begins only once every watched runner of the device is stopped (at most WAIT_S; past that it measures as before,
  and says so in ``stage_seconds["neighbour_pause_wait"]``). A job about to start its watch waits out a measurement
  in progress first: its candidate does not begin to load beside one.

A stopped tree is watched while it is paused: one that runs all the same (a timer that sends it SIGCONT) is killed at
once, and that is its verdict (``runtime_error``): it ran beside another candidate's measurement. Its work in those
few milliseconds is what the probe check reads as another context's, and the measurement's next pass has no
neighbour left. The stop is read as RunnerProcess.frozen reads it, but leniently: a loading tree is busy (a compiler
reading headers, a GPU driver's threads), so a thread asleep in the kernel, even uninterruptibly, counts as stopped
(it runs nothing of its own until it leaves, and then stops). A tree still running after SETTLE_S (a thread inside one
long system call) keeps the measurement waiting until it stops, and is killed past STOP_LIMIT_S; once the measurement
has begun, a tree is killed where it used more than RAN_NS of CPU, or started a process, while paused. GPU work
queued before the stop still runs; the probe check's quiet interval looks for it, and where NVML attributes it
(gpu_activity.py) a tree whose work runs past the stop's grace is killed. A runner in its forward after the load
(load_forward.py) is not stopped mid-forward: the measurement waits for the forward's end (``PauseWatcher.forward``,
FORWARD_WAIT_S at most).

What it costs: a measurement waits for the watchers' next look (POLL_S) and their stops; a paused candidate's load
(its compiler too, which is part of its tree) waits for the measurement. The time paused is not the candidate's: its
load's deadline moves by it, in the judge (``paused_s``) and in the evaluator (a "paused" message, ``on_paused``),
so a neighbour that makes its own timing stage long cannot run an honest sibling's load out of its time.
Without Landlock confining reads, a candidate could open the lock files itself, as it could the device lock's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kb_gym import sandbox
from kb_gym.device_lock import flock_file
from kb_gym.worker.gpu_activity import GpuActivity

POLL_S = 0.01  # a watcher's look at the measure file: what a measurement waits for at least
RAN_POLL_S = 0.05  # a paused tree's CPU use read this often (each read is every thread's schedstat)
GPU_POLL_S = 0.1  # a paused tree's GPU work (NVML's samples, gpu_activity.py) read this often

SETTLE_S = 2.0  # the longest a measurement waits for a tree's running threads to stop (one in a long system call)
# CPU a paused tree may still use: a system call's tail as a thread that was asleep in it wakes (a compiler's read)
# and stops; round 5's SIGCONT timer spends all of a poll's 50 ms
RAN_NS = 20_000_000
RAN_TICKS = 5
SWITCHED_KERNEL_NS = 250_000_000  # kernel time forgiven a paused tree after it switched out (below, ``_ran``)
# A tree with a thread still running in the kernel after SETTLE_S (one system call: a populate of gigabytes) keeps the
# measurement waiting until it stops, for at most this long, and is killed past it: a single call of a candidate's
# (round 34: a 112 GB read-only zero-page populate, 7 s in the kernel) ran beside the measurement otherwise
STOP_LIMIT_S = 15.0
# A runner in the forward after its load (load_forward.py) is not stopped at once: a forward launches its kernels
# before it waits for them, so a stop there leaves them running beside the measurement, and an honest slow one (a
# naive matmul kernel, ~0.3 s of GPU work) past the NVML reading's grace was killed. The measurement waits for the
# forward's reply instead (the runner synchronises before it replies: its queue is empty then), for at most this long
# over the whole forward, however many measurements it meets; past that the runner is stopped as a load is.
FORWARD_WAIT_S = 5.0
# A measurement's wait for every watched runner to stop: a forward's wait, then a long system call's, and a margin,
# so that a runner still running is killed before the measurement gives up waiting and begins beside it (round 37)
WAIT_S = FORWARD_WAIT_S + STOP_LIMIT_S + 3.0
TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")  # the grain of /proc's utime and stime
DID_NOT_STOP = (f"the candidate's processes did not stop within {STOP_LIMIT_S:g} s for another candidate's measurement "
                "on the same device (a system call that long): killed")
RAN_WHILE_PAUSED = ("the candidate's processes ran while they were stopped for another candidate's measurement on "
                    "the same device (something resumed them): killed")
GPU_KILLED = "the candidate's GPU work ran on"  # how the verdict of the NVML reading begins (batch reports count it)
GPU_RAN_WHILE_PAUSED = (GPU_KILLED + " {late:.2f} s after its processes were stopped for another candidate's "
                        "measurement on the same device (work queued before the stop): killed")


def pause_files(job: dict[str, Any]) -> tuple[Path, Path] | None:
    """The device's ``measure`` and ``unpaused`` files the evaluator named in the job; None where it named none
    (one worker and no other Evaluator on the device: no neighbours)."""
    files = job.get("pause_files")
    if isinstance(files, list) and len(files) == 2 and all(isinstance(f, str) and f for f in files):
        return Path(files[0]), Path(files[1])
    return None


def _held_elsewhere(path: Path, fd: int) -> bool:
    """Whether another descriptor holds ``path`` exclusively (a shared try on ``fd`` fails); never blocks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _ran(before: dict[int, sandbox.ProcessUsage], after: dict[int, sandbox.ProcessUsage],
         switched: dict[int, int] | None = None) -> bool:
    """Whether a paused tree ran, process by process (sandbox.process_usage): more CPU over the processes it kept
    than a system call's tail, a process it did not have, or one it lost that was not already exiting when it was
    read. A stopped process, or one asleep in the kernel, leaves only if something resumed or killed it; summed over
    the tree, a process gone took its whole history off the sum (round 28: burners that SIGKILL "bank" children,
    stopped or waiting in a vfork, to hide their own CPU). A process missing from the second reading that still
    exists was missed by the walk, not lost. ``switched``: kept between the readings of one pause (below)."""
    if set(after) - set(before):
        return True
    switched = {} if switched is None else switched
    cpu = sum(max(0, u.cpu_ns - before[pid].cpu_ns) for pid, u in after.items())
    ticks = sum(max(0, u.ticks - before[pid].ticks) for pid, u in after.items())
    # Time in the kernel is a system call's that began before the stop (a stopped task takes the stop on its way back
    # to its own code): on an H100 an honest runner pinning or mapping gigabytes (a 6.4 GB output's memfd) ran there
    # past SETTLE_S and was killed for it. So only what the kernel's ticks do not cover counts: the tree's own code;
    # but a process seen to switch out of its own will since the first reading (it took the stop, or slept) is not
    # in that first call any more, or may not be: its kernel time from then on counts too (round 33: a burner
    # resumed by a timer's SIGCONT, each time straight into another long mmap, ran 1.97 s of a 2 s measurement).
    # A switch is also an honest system call's sleep (a read from a cold disk waits, then copies on in the kernel:
    # round 34's 384 MB read, ~70 ms of it), so kernel time after a switch is forgiven up to SWITCHED_KERNEL_NS.
    kernel = late = 0
    for pid, u in after.items():
        if pid not in switched and u.voluntary > before[pid].voluntary:
            switched[pid] = u.system_ticks  # counted from this reading on: the tail up to it is the old call's
        spent = max(0, u.system_ticks - before[pid].system_ticks)
        since = min(spent, max(0, u.system_ticks - switched.get(pid, u.system_ticks)))
        kernel += spent - since
        late += since
    kernel += min(late, SWITCHED_KERNEL_NS // TICK_NS)
    if cpu - kernel * TICK_NS > RAN_NS or ticks - kernel >= RAN_TICKS:
        return True
    return any(pid not in after and not u.exiting and not sandbox.alive(pid) for pid, u in before.items())


class Measuring:
    """A judge's measurement with the device's watched runners stopped: ``begin`` before it, ``end`` after."""

    def __init__(self, files: tuple[Path, Path] | None) -> None:
        self.files = files
        self._fds: list[int] = []
        self.waited_s = 0.0

    def begin(self, wait: float = WAIT_S) -> bool:
        """Whether every watched runner of the device stopped within ``wait`` seconds (True where there are none).
        Held until ``end`` either way: runners that stop later stay stopped."""
        if self.files is None or self._fds:
            return True
        began = time.monotonic()
        deadline = began + wait
        measure, unpaused = self.files
        fd = flock_file(measure, fcntl.LOCK_EX, deadline)  # only measuring judges take it: the device lock is theirs
        if fd is not None:
            self._fds.append(fd)
            fd = flock_file(unpaused, fcntl.LOCK_EX, deadline)
            if fd is not None:
                self._fds.append(fd)
        self.waited_s = time.monotonic() - began
        return len(self._fds) == 2

    def end(self) -> None:
        for fd in reversed(self._fds):  # ``unpaused`` first: a watcher resumes once ``measure`` is free
            os.close(fd)
        self._fds = []


class PauseWatcher:
    """Stops ``runner``'s tree while another judge measures the device (module docstring). ``watch`` while the job
    does not hold its device, ``unwatch`` once it does; ``verdict`` says why the runner was killed, if it was."""

    def __init__(self, files: tuple[Path, Path], runner: Any,
                 notify: Callable[[dict[str, Any]], None] | None = None, gpu: GpuActivity | None = None) -> None:
        self.measure, self.unpaused = files
        self.runner = runner
        # GPU work the tree queued before a stop runs on through the measurement: where NVML attributes it
        # (gpu_activity.py), a tree whose work runs past the stop's grace is killed, and its queue with its context
        self.gpu = gpu
        self._gpu_reading: tuple[float, int, float] | None = None  # the pause's stop, the last sample, the last look
        # told as each pause begins and ends (a "pause" message to the evaluator, whose stage clock stops meanwhile);
        # from the watcher's thread, and from ``watch`` for a wait it begins with
        self.notify = notify
        self.verdict = ""
        self.paused_s = 0.0  # pauses over
        self._pause_began: float | None = None  # the pause going on, if one is
        self.pauses = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unpaused_fd: int | None = None
        self._look_fd: int | None = None
        self._forwarding = threading.Event()  # the runner's forward after its load is going on (``forward``)
        self.forward_waits_s = 0.0  # how long measurements waited for that forward, in all

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """Around the runner's forward after its load: a measurement that begins meanwhile waits for it to end (up to
        FORWARD_WAIT_S in all) rather than stopping it between its launches and its wait."""
        self._forwarding.set()
        try:
            yield
        finally:
            self._forwarding.clear()

    def watch(self) -> None:
        """Start watching; waits out a measurement in progress first (the runner runs nothing of the candidate's
        beside it)."""
        if self._thread is not None or self.verdict:
            return
        self._look_fd = os.open(self.measure, os.O_RDWR | os.O_CREAT, 0o666)
        waits = _held_elsewhere(self.measure, self._look_fd)
        if waits:  # a pause as any other: the runner stands still meanwhile, and the time is not its load's
            self._begin_pause()
        try:
            os.close(flock_file(self.measure, fcntl.LOCK_SH))
            self._unpaused_fd = flock_file(self.unpaused, fcntl.LOCK_SH)
        finally:
            if waits:
                self._end_pause()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="kb-gym-pause-watcher", daemon=True)
        self._thread.start()

    def unwatch(self) -> None:
        """Stop watching: the runner runs again (if it was paused) and the measurers no longer wait for it."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        for fd in (self._unpaused_fd, self._look_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._unpaused_fd = self._look_fd = None

    def paused_seconds(self) -> float:
        """How long the runner has been stopped for measurements so far, the pause going on included."""
        began = self._pause_began
        return self.paused_s + (time.monotonic() - began if began is not None else 0.0)

    def _begin_pause(self) -> None:
        self._pause_began = time.monotonic()
        self.pauses += 1
        self._tell({"type": "pause", "state": "begin"})

    def _end_pause(self) -> None:
        paused = time.monotonic() - (self._pause_began or time.monotonic())
        self.paused_s += paused
        self._pause_began = None
        self._tell({"type": "pause", "state": "end", "seconds": paused})

    def _tell(self, message: dict[str, Any]) -> None:
        if self.notify is not None:
            with contextlib.suppress(OSError):
                self.notify(message)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(POLL_S):
                if _held_elsewhere(self.measure, self._look_fd):
                    self._wait_for_forward()
                    self._pause()
        except Exception as exc:  # noqa: BLE001 - the judge's own failure: measurements no longer wait for this runner
            print(f"kb_gym: the pause watcher stopped: {exc!r}", file=sys.stderr)
            if self._unpaused_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._unpaused_fd)
                self._unpaused_fd = None

    def _wait_for_forward(self) -> None:
        """Hold a measurement off (``unpaused`` still held) while the forward after the load runs, within its budget."""
        began = time.monotonic()
        while (self._forwarding.is_set() and not self._stop.is_set()
               and self.forward_waits_s + time.monotonic() - began < FORWARD_WAIT_S):
            time.sleep(POLL_S)
        self.forward_waits_s += time.monotonic() - began

    def _pause(self) -> None:
        """Stop the tree, let the measurement begin, and resume once it is over (or the job stops watching)."""
        self._begin_pause()
        stopped_at = time.time()
        self._gpu_reading = (stopped_at, int(stopped_at * 1e6), 0.0)
        procs = self.runner.stop()
        try:
            sandbox.unstopped(procs, SETTLE_S, also=("D",))
            # A child forked while the stop landed (its parent inside fork() takes the SIGSTOP only on its way out,
            # the child never gets it) shows only now: stopped too, before the tree is read (round 28).
            self.runner.restop()
            usage = sandbox.process_usage(self.runner.pid)
            switched: dict[int, int] = {}
            # A thread still inside one long system call takes the stop only when the call returns: the measurement
            # waits for it (``unpaused`` held), its own code watched meanwhile, and past STOP_LIMIT_S it is killed
            # (round 34: a 7 s populate ran beside the measurement that began after SETTLE_S)
            limit = time.monotonic() + STOP_LIMIT_S - SETTLE_S
            while not self._stop.is_set() and sandbox.unstopped(list(usage), 0.0, also=("D",)):
                if time.monotonic() > limit:
                    self._kill(DID_NOT_STOP)
                    return
                time.sleep(RAN_POLL_S)
                if self._ran_again(usage, switched):
                    return
            os.close(self._unpaused_fd)
            self._unpaused_fd = None
            looked = time.monotonic()
            while not self._stop.is_set():
                if time.monotonic() - looked >= RAN_POLL_S or not _held_elsewhere(self.measure, self._look_fd):
                    looked = time.monotonic()
                    if self._ran_again(usage, switched):
                        return
                if not _held_elsewhere(self.measure, self._look_fd) and self._rejoin():
                    return
                time.sleep(POLL_S)
        finally:
            self.runner.resume()
            self._end_pause()

    def _ran_again(self, usage: dict[int, sandbox.ProcessUsage], switched: dict[int, int]) -> bool:
        """Stop the tree again (a SIGCONT, a timer's or a child's, cancels a stop still pending in a long system call,
        so the process never takes it and never switches out: round 33; a stopped one ignores it) and kill it where
        it ran since ``usage`` was read (``_ran``); whether it was killed."""
        self.runner.restop()
        late = self._gpu_late(usage)
        if late:
            self._kill(GPU_RAN_WHILE_PAUSED.format(late=late) if sandbox.alive(self.runner.pid) else "")
            return True
        if not _ran(usage, sandbox.process_usage(self.runner.pid), switched):
            return False
        # a runner the judge killed meanwhile (its load's time was up) ran no more: no verdict
        self._kill(RAN_WHILE_PAUSED if sandbox.alive(self.runner.pid) else "")
        return True

    def _gpu_late(self, usage: dict[int, sandbox.ProcessUsage]) -> float:
        """How long after the stop the tree's GPU work was seen running (0.0: not past the grace, not yet read, or
        no reading here); NVML is read at most every GPU_POLL_S."""
        if self.gpu is None or self._gpu_reading is None:
            return 0.0
        stopped_at, since_us, looked = self._gpu_reading
        if time.monotonic() - looked < GPU_POLL_S:
            return 0.0
        try:
            late, since_us = self.gpu.busy_after(usage, stopped_at, since_us)
        except Exception as exc:  # noqa: BLE001 - NVML failed mid-run: the pause goes on without it, as before
            print(f"kb_gym: the pause's GPU reading stopped: {exc!r}", file=sys.stderr)
            self.gpu = None
            return 0.0
        self._gpu_reading = (stopped_at, since_us, time.monotonic())
        return late

    def _rejoin(self) -> bool:
        """Hold ``unpaused`` again where no measurement holds or waits for it; False where one does."""
        fd = flock_file(self.unpaused, fcntl.LOCK_SH, deadline=time.monotonic())  # one try
        if fd is None:
            return False
        if _held_elsewhere(self.measure, self._look_fd):  # one began meanwhile and waits for this runner
            os.close(fd)
            return False
        self._unpaused_fd = fd
        return True

    def _kill(self, why: str) -> None:
        """End the tree (``why``, its verdict; "" where it is gone already) and stop holding ``unpaused``."""
        self.verdict = why
        self._stop.set()
        if why:
            sandbox.kill_tree(self.runner.pid)
        if self._unpaused_fd is not None:
            os.close(self._unpaused_fd)
            self._unpaused_fd = None
