"""Red team, round 28: the neighbour pause (kb_gym/worker/neighbours.py; git 64fabec, cc6aa17, ec58937, 9d0be8d).

What it does: with two workers on one device, every job whose runner is alive while it does not hold the device is
watched (``PauseWatcher``, from ``ctx.pool.take()`` to the device grant); a judge that measures (the timing stage, a
reading after the exit) takes the device's ``measure`` file, every watcher SIGSTOPs its runner's whole tree, and the
measurement begins once all have let go of ``unpaused`` (at most WAIT_S). A paused tree that uses more than RAN_NS
(20 ms) of CPU or has a process it did not have is killed (``runtime_error``). Since ec58937 the reading is lenient: a
thread asleep in the kernel, even in D, counts as stopped, a tree not seen stopped within SETTLE_S is not killed for
that, and a process the tree *lost* while paused was not counted. The time paused moves the load's deadline.

Tried from the policy's side (a GRPO group: a candidate that lowers its siblings' rewards raises its own advantage)
and the maintainer's (honest imports that are busy), on the CPU device with two workers, and on plain processes
against ``PauseWatcher``/``Measuring`` directly.

GOT THROUGH at ec58937, fixed in 9d0be8d (the plain tests below pin the fixes):

- round 6's bank, back through the lenient reading: ``_ran`` compares the tree's *summed* CPU (schedstat of live
  threads, ticks of live processes), so a process that vanishes while paused takes its whole history off the sum.
  The runner ignores SIGCHLD (the kernel reaps its children: no cutime), "bank" children burn while the tree may run
  (its load), and burners with round 5's SIGCONT timers, once the watcher has read the tree, SIGKILL a bank and burn
  up to its history. The burners ran ~0.5-0.8 s of CPU inside every sibling's timing stage, never killed; the
  siblings' speedups fell from ~1.0 to ~0.7. Now a lost process that was in T at the reading counts as a run.
- the wait in ``PauseWatcher.watch`` (a job that starts during a measurement waits it out) was the candidate's load
  time: a neighbour with a long timing stage (a slow but correct forward) ran an honest sibling started meanwhile out
  of its load limit. Now that wait is a pause, and ``runner.load`` gets it back (but see below).
- the evaluator moved its stage clock by a pause only at its end ("paused"): one pause longer than the load limit's
  rest plus JUDGE_GRACE was the evaluator's ``timeout`` mid-pause ("the load stage exceeded its 15 s limit"). Now a
  pause's begin stops the clock.
- a false positive: a child forked as the stop lands was never stopped (the parent inside fork() takes the SIGSTOP
  on its way out; the child never gets it; freeze_tree's second read comes before the child is attached): an honest
  tree whose compile driver forks short busy workers was killed for its child's CPU, on ~20% of pauses with a 1 GB
  parent. Now the tree is stopped again once it settled (``RunnerProcess.restop``).

GOT THROUGH at 9d0be8d, fixed in the commit after it (the plain tests below pin the fixes):

- the bank, asleep: a lost process counts only where it was in T at the reading. A bank that waits in
  clone(CLONE_VFORK) without CLONE_VM (a fork whose parent waits, killable, until the child exits or execs) for a
  child that sleeps for ever is in D: the settle counts it as stopped, the lost-process check does not, and its
  SIGKILL still takes its history off the sums. Burners ran 4.8-5.7 s of CPU inside the siblings' timing stages,
  never killed; the siblings' speedups 0.64-0.91. Now the paused tree is read process by process
  (``sandbox.process_usage``): CPU over the processes it kept, and any process lost that was not already exiting
  (PF_EXITING) when it was read, counts as having run.
- the watch's wait is a pause now, but ``runner.prepare`` (and the CPU clock's harness calls, and the build cache's
  wait, by reading the code) still take ``deadline - time.monotonic()`` with the deadline set before the wait: after a
  wait longer than the load limit, prepare's timeout is negative and the honest sibling is ``timeout`` ("ran on for
  the -6 s left of it") before its candidate is even sent. Now every wait for a watched runner's reply leaves out the
  time it was paused (``RunnerProcess.paused``), and the load's deadline moves by the watch's first wait.

HELD (plain tests): an honest import that sleeps, runs torch on two threads, threads, file IO and a short busy
subprocess is paused through its siblings' timing and judged correct; a double-forked, setsid'd burner with round 5's
timer is re-parented to the runner (PID 1 of its namespace) and killed (or, where the stop dropped its timers'
pending SIGCONTs, stays stopped through the measurements); the runner cannot open the device's lock files (Landlock
confines its reads: /tmp is not among them); a burner under 20 ms per look is killed for the sum; a bank that is a
*thread* is caught by its process's ticks (they keep exited threads); after all of it the pause files are free, no
process of the evaluator is left stopped, and the next honest pair is judged as on a fresh Evaluator.

Seen on the way (not a finding of the pause): a SIGSTOP drops a POSIX timer's SIGCONT still pending, and a periodic
timer is re-armed only when its signal is delivered, so round 5's timer dies on a loaded host; the attacks here arm
three.
"""
from __future__ import annotations

import ast
import contextlib
import fcntl
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from device import DEVICE
from test_redteam_round5 import UNFREEZABLE

from kb_gym import EvalConfig, Evaluator, get_problem, load_problems, sandbox
from kb_gym.device_lock import lock_dir
from kb_gym.worker import neighbours
from kb_gym.worker.runner_client import RunnerProcess

CONFIG = EvalConfig(trials=2, timing_warmup=3, timing_min_reps=200, timing_max_reps=200, integrity="off")
HONEST = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
FORWARD = "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
# correct, but each forward sleeps: a timing stage as long as timing_max_seconds (the neighbour's own loss is small
# beside what its siblings lose)
SLOW = ("import time, torch\ntime.sleep(SLEEP_S)\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
        "        time.sleep(0.02)\n        return torch.relu(x)\n")


@pytest.fixture(scope="module")
def relu():
    return get_problem(load_problems("builtin"), name="level1/1_ReLU")


@pytest.fixture(scope="module")
def ev():
    """One device, two workers: the pause's setting. Shared by the Evaluator-level tests, in order; the last one reads
    what the earlier ones left behind."""
    with Evaluator(DEVICE, config=CONFIG, results_path=False, workers_per_device=2) as e:
        e.warm()
        yield e


def _pause_files(ev: Evaluator) -> tuple[Path, Path]:
    lock = next(h.device_lock for h in ev._workers if h.device_lock is not None)
    return Path(lock.pause_files[0]), Path(lock.pause_files[1])


def _wait_measuring(ev: Evaluator, timeout: float = 60.0) -> None:
    """Until a judge of ``ev`` holds the device's ``measure`` file (a timing stage is under way)."""
    fd = os.open(_pause_files(ev)[0], os.O_RDWR | os.O_CREAT, 0o666)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            fcntl.flock(fd, fcntl.LOCK_UN)
            time.sleep(0.02)
    finally:
        os.close(fd)
    raise AssertionError("no measurement began")


def _siblings_beside(ev: Evaluator, relu, neighbour: str, n: int = 3, head_start: float = 0.0):
    ev.warm()  # both workers up (one an earlier test's timeout killed starts again now, not beside the test)
    first = ev.submit(relu, neighbour)
    time.sleep(head_start)
    siblings = [ev.submit(relu, HONEST) for _ in range(n)]
    return first.result(), [s.result() for s in siblings]


def _timed_windows(siblings) -> list[list[float]]:
    return [s.worker["timed_at"] for s in siblings if s.status == "correct" and s.worker.get("timed_at")]


def _inside(spans, windows) -> float:
    """Seconds of ``spans`` (start, end) inside the ``windows``."""
    return sum(max(0.0, min(b, w[1]) - max(a, w[0])) for a, b in spans for w in windows)


# --- 1. round 6's bank, back: a process lost while paused takes its CPU history off the tree's sum -------------------
#
# neighbours._ran: ``after.cpu_ns - before.cpu_ns > RAN_NS or after.ticks - before.ticks >= RAN_TICKS or new pids``,
# both sums over the processes alive at each reading. A bank that is SIGKILLed (by a burner a timer keeps running)
# and reaped by the kernel at once (its parent ignores SIGCHLD) leaves both sums, with everything it ever used. Since
# 9d0be8d a process lost while paused counts as a run where it was in T at the reading (``stopped - after.pids``);
# one in D was "stopped" for the settle but is not in that set, and a process can wait in D, killable, for as long as
# it likes: clone(CLONE_VFORK) without CLONE_VM is a fork whose parent waits until the child exits or execs.

BANKS, BURNERS = 12, 2


def banker(asleep: bool) -> str:
    """Banks that burn CPU while the tree may run (its load), and burners with round 5's SIGCONT timers that, once the
    watcher has read the paused tree, SIGKILL a bank (reaped by the kernel: the runner ignores SIGCHLD) and burn up to
    its history, then the next; they write when they burned. ``asleep``: each bank, after 2.5 s of burning, waits in
    ``clone(CLONE_VFORK)`` for a child that sleeps for ever: in D (killable), which the watcher counts as stopped, but
    not as a stopped process whose loss means that the tree ran."""
    return UNFREEZABLE + f'''
import ctypes, os, signal, time, torch
RUNNER = os.getpid()  # 1: the first process of the runner's PID namespace
ASLEEP = {asleep}
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its children reaped by the kernel as they exit: no cutime


def _state(pid):
    try:
        with open(f"/proc/{{pid}}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return None


def _history(pid):
    # what the tree's sums lose when ``pid`` goes (ns, the lesser of its schedstat and its ticks)
    try:
        with open(f"/proc/{{pid}}/schedstat") as fh:
            ns = int(fh.read().split()[0])
        with open(f"/proc/{{pid}}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return min(ns, sum(int(v) for v in fields[11:15]) * 10_000_000)
    except (OSError, ValueError, IndexError):
        return 0


banks = []
for _ in range({BANKS}):
    pid = os.fork()
    if pid == 0:
        _end = time.time() + 2.5
        while not ASLEEP or time.time() < _end:  # history to spend later (stopped with the tree when it is paused)
            pass
        # clone(CLONE_VFORK | SIGCHLD), no CLONE_VM: a fork whose parent waits, killable, until the child exits
        if ctypes.CDLL(None).syscall(56, 0x4000 | signal.SIGCHLD, 0, 0, 0, 0) == 0:
            while True:
                time.sleep(3600)
        os._exit(0)
    banks.append(pid)
_rd, _wr = os.pipe()
for k in range({BURNERS}):
    if os.fork() == 0:
        os.close(_rd)
        mine = banks[k::{BURNERS}]
        for _period in (7_000_000, 10_000_000, 13_000_000):  # resumed within 10 ms of any stop; three timers,
            _unfreezable(_period)  # as a SIGSTOP drops a timer's SIGCONT still pending, and that timer fires no more
        try:
            while True:
                if _state(RUNNER) != b"T":
                    time.sleep(0.002)
                    continue
                time.sleep(0.2)  # asleep while the watcher settles and reads the tree's use
                began, budget, spent = time.time(), 0, time.process_time_ns()
                while _state(RUNNER) == b"T":
                    if time.process_time_ns() - spent + 40_000_000 > budget:
                        ready = [b for b in mine if _state(b) == (b"D" if ASLEEP else b"T")]
                        if not ready:
                            time.sleep(0.005)
                            continue
                        mine.remove(ready[0])
                        budget += _history(ready[0]) - 20_000_000
                        os.kill(ready[0], signal.SIGKILL)  # gone from the sums, history and all,
                        while _state(ready[0]) is not None:  # once its exit (which the sums see) is over
                            time.sleep(0.001)
                        continue
                    end = time.perf_counter() + 0.002
                    while time.perf_counter() < end:
                        pass
                os.write(_wr, (repr((began, time.time())) + "\\n").encode())
        finally:
            os._exit(0)
os.close(_wr)
_end = time.time() + 14
while time.time() < _end:
    time.sleep(0.05)
os.set_blocking(_rd, False)
try:
    _spans = os.read(_rd, 1 << 16).decode()
except BlockingIOError:
    _spans = ""
raise RuntimeError("RAN " + repr([eval(line) for line in _spans.splitlines()]))
''' + FORWARD


def _banked(ev: Evaluator, relu, asleep: bool) -> tuple[str, float, list]:
    """The banker beside three honest siblings: its status, the seconds its burners ran inside the siblings' timing
    stages (by their own record), the siblings' speedups."""
    rogue, siblings = _siblings_beside(ev, relu, banker(asleep), head_start=3.0)  # the banks' history: its load's CPU
    assert [s.status for s in siblings] == ["correct"] * 3, [s.error for s in siblings]
    found = re.search(r"RAN (\[.*?\])", rogue.error or "")
    spans = ast.literal_eval(found.group(1)) if found else []
    return rogue.status, _inside(spans, _timed_windows(siblings)), [s.speedup for s in siblings]


def test_a_stopped_bank_lost_while_paused_counts_as_the_tree_running(ev, relu):
    """Got through before 9d0be8d (the burners ran ~0.5-0.8 s of CPU in each sibling's timing stage; the siblings'
    speedups fell from ~1.0 to ~0.7); now a process seen stopped at the tree's reading that is gone later is a run."""
    status, ran, speedups = _banked(ev, relu, asleep=False)
    # sound: it ran beside a measurement, so it is killed; or it never ran inside one
    assert status == "runtime_error" or ran < 0.05, (status, f"ran {ran:.2f} s in the windows", speedups)


# Fixed after 9d0be8d: the paused tree is read process by process; a lost process that was not exiting counts.
def test_a_bank_asleep_in_a_vfork_wait_does_not_pay_for_burners(ev, relu):
    status, ran, speedups = _banked(ev, relu, asleep=True)
    assert status == "runtime_error" or ran < 0.05, (status, f"ran {ran:.2f} s in the windows", speedups)


# --- 2. a job that starts during a measurement: its wait, and its load's first steps ------------------------------------
#
# PauseWatcher.watch waits out a measurement in progress before the candidate's runner gets anything. Before 9d0be8d
# that wait was the candidate's load time (the deadline is set before ``ctx.pool.take()``); now it is a pause
# (paused_s, the evaluator's clock stopped), and ``runner.load`` is given its time back. But ``runner.prepare`` (and
# the CPU clock's harness calls, and the build cache's wait) still read ``deadline - time.monotonic()``: after a wait
# longer than the load limit, prepare's timeout is negative, and the honest sibling is ``timeout`` before its
# candidate was even sent.

WAIT_CONFIG = CONFIG.replace(timing_min_reps=10, timing_max_reps=100_000, timing_target_rel_ci=1e-9,
                             timing_max_seconds=9.0, load_timeout=5.0, timing_timeout=40.0)


# Fixed after 9d0be8d: every wait for a watched runner's reply leaves out the time it was paused.
def test_a_job_that_starts_during_a_long_measurement_keeps_its_load_time(ev, relu):
    ev.warm()
    slow = ev.submit(relu, SLOW.replace("SLEEP_S", "0"), config=WAIT_CONFIG)
    _wait_measuring(ev)
    honest = ev.submit(relu, HONEST, config=WAIT_CONFIG).result()
    assert slow.result().status == "correct"
    alone = ev.submit(relu, HONEST, config=WAIT_CONFIG).result()  # the control: no measurement under way
    assert alone.status == "correct", (alone.status, alone.error)
    assert honest.stage_seconds.get("paused_for_neighbours", 0) > 3.0, honest.stage_seconds  # the wait, a pause
    assert honest.status == "correct", (honest.status, honest.error, honest.stage_seconds)


# --- 3. one long pause, and the evaluator's backstop ---------------------------------------------------------------------
#
# Got through before 9d0be8d: the evaluator moved its stage clock by a pause only when a "paused" message came at the
# pause's end, so one pause longer than the rest of the load limit plus JUDGE_GRACE was the evaluator's ``timeout``
# mid-pause (the worker killed: "the load stage exceeded its 15 s limit"). Now a "pause begin" stops the clock.

BACKSTOP_CONFIG = CONFIG.replace(timing_min_reps=10, timing_max_reps=100_000, timing_target_rel_ci=1e-9,
                                 timing_max_seconds=17.0, load_timeout=5.0, timing_timeout=40.0)
LOADING = "import time, torch\ntime.sleep(2.0)\n" + FORWARD  # 2 s of its 3 s load: fine alone


def test_an_honest_load_paused_through_a_long_measurement_is_not_timed_out(ev, relu):
    ev.warm()
    slow = ev.submit(relu, SLOW.replace("SLEEP_S", "0.5"), config=BACKSTOP_CONFIG)  # its timing: 17 s from ~0.7 s
    honest = ev.submit(relu, LOADING, config=BACKSTOP_CONFIG)  # its import under way when that begins
    honest, slow = honest.result(), slow.result()
    assert slow.status == "correct", (slow.status, slow.error)
    assert honest.status == "correct", (honest.status, honest.error, honest.stage_seconds)
    assert honest.stage_seconds.get("paused_for_neighbours", 0) > 10.0, honest.stage_seconds


# --- 4. HELD: an honest import that does busy, legitimate things is paused, not killed -------------------------------

BUSY_HONEST = '''
import os, subprocess, sys, threading, time, torch
torch.set_num_threads(2)  # intra-op threads too
_end = time.time() + 9


def _matmuls():
    a = torch.randn(192, 192)
    while time.time() < _end:
        (a @ a).sum()


def _sleeper():
    while time.time() < _end:
        time.sleep(0.03)


_threads = [threading.Thread(target=f) for f in (_matmuls, _matmuls, _sleeper)]
for t in _threads:
    t.start()
_child = "import time\\nt = time.process_time() + 0.3\\nwhile time.process_time() < t:\\n    pass\\n"
for _ in range(2):  # a compile-like busy child
    subprocess.run([sys.executable, "-c", _child], check=True, timeout=60)
while time.time() < _end:
    with open("blob.bin", "wb") as fh:
        fh.write(os.urandom(8 << 20))
    with open("blob.bin", "rb") as fh:
        assert len(fh.read()) == 8 << 20
    os.remove("blob.bin")
    time.sleep(0.2)
for t in _threads:
    t.join()
''' + FORWARD


def test_an_honest_busy_import_is_paused_through_its_siblings_timing_not_killed(ev, relu):
    busy, siblings = _siblings_beside(ev, relu, BUSY_HONEST)
    assert [s.status for s in siblings] == ["correct"] * 3, [s.error for s in siblings]
    assert busy.status == "correct", (busy.status, busy.error)
    assert busy.stage_seconds.get("paused_for_neighbours", 0) > 0.1, busy.stage_seconds
    assert all(s.stage_seconds["neighbour_pause_wait"] < 2.5 for s in siblings), [s.stage_seconds for s in siblings]


# --- 5. HELD: a double-forked, setsid'd burner; the lock files; what is left behind ----------------------------------

ORPHAN = UNFREEZABLE + '''
import os, time, torch
_rd, _wr = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # an orphan: re-parented to the runner, the first process of its PID namespace
        for _period in (500_000, 700_000, 1_300_000):
            _unfreezable(_period)
        _gaps, _last = [], time.time()
        _end = _last + 10
        while time.time() < _end:  # burns, and records each stretch of more than 20 ms it did not run
            _now = time.time()
            if _now - _last > 0.02:
                _gaps.append((_last, _now))
            _last = _now
        os.write(_wr, repr(_gaps).encode())
    os._exit(0)
os.close(_wr)
_record = b""
while _chunk := os.read(_rd, 1 << 16):  # until the orphan has gone
    _record += _chunk
raise RuntimeError("GAPS " + _record.decode())
''' + FORWARD

GRABBER = '''
import fcntl, os, time
_seen = {}
try:
    for _name in os.listdir(LOCK_DIR):
        try:
            _fd = os.open(os.path.join(LOCK_DIR, _name), os.O_RDWR)
            fcntl.flock(_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ``unpaused``: every measurement waits WAIT_S for it
            _seen[_name] = "held"
        except OSError as exc:
            _seen[_name] = type(exc).__name__
except OSError as exc:
    _seen["dir"] = type(exc).__name__
if "held" in _seen.values():
    time.sleep(8)
raise RuntimeError("LOCKS " + repr(_seen))
'''


def _stopped_processes() -> list[str]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_STOPPED:
                found.append(f"{proc.pid} {proc.name()}")
    return found


def test_an_orphaned_burner_is_killed_and_the_pause_leaves_nothing_behind(ev, relu):
    rogue, siblings = _siblings_beside(ev, relu, ORPHAN)
    assert [s.status for s in siblings] == ["correct"] * 3, [s.error for s in siblings]
    windows = [[a + 0.1, b - 0.1] for a, b in _timed_windows(siblings) if b - a > 0.3]
    if rogue.status != "runtime_error":  # on a loaded host a SIGSTOP can drop its timers' pending SIGCONTs: stopped
        found = re.search(r"GAPS (\[.*?\])", rogue.error or "")
        assert found, (rogue.status, rogue.error)
        gaps = ast.literal_eval(found.group(1))
        assert all(any(a <= w[0] and b >= w[1] for a, b in gaps) for w in windows), (windows, gaps)
    else:
        assert "another candidate's measurement" in rogue.error, rogue.error

    grabber, siblings = _siblings_beside(ev, relu, GRABBER.replace("LOCK_DIR", repr(str(lock_dir()))) + FORWARD, n=1)
    assert siblings[0].status == "correct", siblings[0].error
    if grabber.worker.get("reads_confined"):  # unconfined (no Landlock), it could: neighbours.py says so (Open)
        # Landlock: /tmp is not the runner's to read, so it cannot hold ``unpaused`` against every measurement
        assert "'dir': 'PermissionError'" in (grabber.error or ""), grabber.error
        assert siblings[0].stage_seconds["neighbour_pause_wait"] < 2.5, siblings[0].stage_seconds

    # what is left: nothing stopped, the pause files free, and the next pair judged as on a fresh Evaluator
    assert not _stopped_processes()
    for path in _pause_files(ev):
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a watcher or a measurement still holds it
        finally:
            os.close(fd)
    ev.warm()
    pair = [ev.submit(relu, HONEST) for _ in range(2)]
    pair = [f.result() for f in pair]
    assert [r.status for r in pair] == ["correct"] * 2, [r.error for r in pair]
    assert all(r.stage_seconds.get("neighbour_pause_wait", 0) < 1.0 for r in pair), [r.stage_seconds for r in pair]
    assert all(r.stage_seconds.get("paused_for_neighbours", 0) < 5.0 for r in pair), [r.stage_seconds for r in pair]


# --- plain processes against PauseWatcher and Measuring ---------------------------------------------------------------


class Tree:
    """A process running ``code`` (it prints a line once ready), with the counted stops PauseWatcher needs."""

    stop = RunnerProcess.stop
    restop = RunnerProcess.restop
    resume = RunnerProcess.resume

    def __init__(self, code: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
        self.proc.stdout.readline()
        self.pid = self.proc.pid
        self._stops, self._stopped, self._stop_lock = 0, set(), threading.Lock()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.pid, 9)
        sandbox.kill_tree(self.pid)
        self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def files(tmp_path):
    return tmp_path / "cpu.measure", tmp_path / "cpu.unpaused"


def _running(pid: int) -> list[int]:
    """Processes of ``pid``'s tree with a thread running (R) now."""
    running = []
    for proc in (pid, *(sandbox.descendants(pid) or [])):
        with contextlib.suppress(OSError):
            if any(sandbox._state(f"{proc}/task/{tid}") == "R" for tid in os.listdir(f"/proc/{proc}/task")):
                running.append(proc)
    return running


# --- 6. a child forked as the stop lands ------------------------------------------------------------------------------
#
# An honest compile driver the size of a torch runner (1 GB of heap: fork copies its page tables, ~10 ms) forks
# a short busy worker, waits for it, forks the next. freeze_tree stops the parent inside fork(); its second read of
# the tree comes before copy_process has attached the child, and a SIGSTOP sent to the parent alone is not the
# child's: it ran through the measurement, and the watcher killed the honest tree for its 30 ms (~20% of pauses
# here; the first try on its first run). Held since 9d0be8d: the tree is stopped again (``restop``) once it settled.

FORKING = '''
import os, time
heap = bytearray(1 << 30)
for i in range(0, len(heap), 4096):
    heap[i] = 1
print("ready", flush=True)
while True:
    pid = os.fork()
    if pid == 0:
        end = time.process_time() + 0.03
        while time.process_time() < end:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
'''


def test_an_honest_forking_tree_is_wholly_stopped_and_not_killed(files):
    tree = Tree(FORKING)
    watcher = neighbours.PauseWatcher(files, tree)
    escaped: list[list[int]] = []
    try:
        watcher.watch()
        for k in range(60):  # ~20% of stops land in a fork here; 60 misses: < 1e-5
            time.sleep(0.05 + (k % 7) * 0.007)
            measuring = neighbours.Measuring(files)
            assert measuring.begin()
            time.sleep(0.05)
            escaped.append(_running(tree.pid))
            time.sleep(0.07)
            measuring.end()
            if watcher.verdict or escaped[-1]:
                break
    finally:
        watcher.unwatch()
        tree.close()
    assert not watcher.verdict, (watcher.verdict, f"running through the measurement: {escaped[-1]}", len(escaped))
    assert not any(escaped), escaped


# --- 7. HELD: under 20 ms per poll, but not in sum ---------------------------------------------------------------------

DUTY = UNFREEZABLE + '''
import time
for _period in (500_000, 700_000, 1_300_000):  # three: a SIGSTOP drops a timer's pending SIGCONT, and that timer
    _unfreezable(_period)  # fires no more (on a loaded host, often)
print("ready", flush=True)
while True:  # 8 ms of every 50: under RAN_NS in any one of the watcher's looks
    end = time.perf_counter() + 0.008
    while time.perf_counter() < end:
        pass
    time.sleep(0.042)
'''


def _paused_once(files, code: str) -> tuple[str, int]:
    """``code``'s tree watched through one measurement of up to 3 s: the watcher's verdict, and the clock ticks the
    tree used meanwhile (its processes' utime + stime, exited threads' included)."""
    tree = Tree(code)
    watcher = neighbours.PauseWatcher(files, tree)
    try:
        watcher.watch()
        time.sleep(0.2)
        measuring = neighbours.Measuring(files)
        assert measuring.begin()
        before = sandbox.tree_usage(tree.pid).ticks
        deadline = time.monotonic() + 3.0
        while not watcher.verdict and time.monotonic() < deadline:
            time.sleep(0.05)
        used = sandbox.tree_usage(tree.pid).ticks - before
        measuring.end()
    finally:
        watcher.unwatch()
        tree.close()
    return watcher.verdict, used


def test_a_resumer_under_the_budget_of_each_look_is_killed_for_the_sum(files):
    verdict, used = _paused_once(files, DUTY)
    # sound: killed, or it did not run (its timers' SIGCONTs all dropped by the stop: it stayed stopped)
    assert "ran while they were stopped" in verdict or used < 3, (verdict, used)


# --- 8. HELD: a bank that is a thread --------------------------------------------------------------------------------
#
# A thread's schedstat leaves the sum when it exits, as a process's does; but its process's ticks (utime + stime in
# /proc/PID/stat) keep what its exited threads used, so the burn shows at RAN_TICKS (50 ms).

THREAD_BANK = UNFREEZABLE + '''
import os, threading, time
_go = threading.Event()


def _bank():
    end = time.process_time() + 1.5
    while time.process_time() < end and not _go.is_set():
        pass
    _go.wait()


_sentinel = os.fork()
if _sentinel == 0:  # no timer: stopped with the tree, and seen so
    while True:
        time.sleep(1)
_thread = threading.Thread(target=_bank)
_thread.start()
for _period in (7_000_000, 10_000_000, 13_000_000):
    _unfreezable(_period)
time.sleep(1.0)
print("ready", flush=True)
while True:
    with open(f"/proc/{_sentinel}/stat", "rb") as fh:
        paused = fh.read().rsplit(b")", 1)[1].split()[0] == b"T"
    if not paused:
        time.sleep(0.002)
        continue
    time.sleep(0.2)  # the watcher has read the tree
    _go.set()
    _thread.join()  # the bank's schedstat leaves the sum
    end = time.process_time() + 0.5
    while time.process_time() < end:
        pass
    time.sleep(3600)
'''


def test_a_thread_bank_does_not_hide_a_burn(files):
    verdict, used = _paused_once(files, THREAD_BANK)
    # the burn it would hide is 0.5 s (50 ticks); under a loaded host the tree's way into the stop took 3 ticks in a
    # clean-clone CI run (session 44), so 10 is the line between the stop's latency and a hidden burn
    assert "ran while they were stopped" in verdict or used < 10, (verdict, used)
