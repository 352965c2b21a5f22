"""The CPU time a runner's process tree spent in a call, read by the judge from the kernel's own accounting.

On the CPU device the runner's reported time (its ``perf_counter`` around the forward) is the candidate's word, and
the judge's envelope around the call can only hold it to within the envelope's tolerance (3 ms on this device:
the pipe, building inputs, a loaded host). A runner that rewrote its ``timed_call`` to report 1 us kept any kernel
under that tolerance at 50-200x (round 4). The kernel counts every task's time on a CPU in nanoseconds, whatever the
task tells anyone, so the judge reads it around each timed call (before the seed goes out, and once the outputs are
the judge's and no thread of the tree is running: ``settled``):

- each process of the runner's tree: its process clock (``clock_gettime`` on ``MAKE_PROCESS_CPUCLOCK(pid)``), which
  includes the threads that exited since;
- each live thread: ``/proc/<pid>/task/<tid>/schedstat`` (a task cannot run longer than the wall time it spans);
- the PID namespace's last PID (the judge is its first process): a task made and gone inside the window is one
  whose time may be counted nowhere (a child reaped automatically takes its time with it).

What the forward must have taken on the wall clock, at least (``Window.floor_ms``): the heaviest thread's time less
the harness's share (receiving the seed, building inputs, hashing and sending outputs: read on timed reference calls
of the candidate's own runner before it loaded the candidate, timing.harness_cpu, or else of the spare), the next
heaviest thread's, the time of threads that ran and exited in it, and the tree's whole time less the harness's spread
over every CPU of the host. That is held to the candidate's claim (timing.PairedTiming.cpu_excess_ms).

The harness's share is read before the candidate loads, the loop's calls later: a neighbour's load that starts in
between and lasts raises every call's CPU time (contention for memory and caches), which the least over calls does not
remove. So the judge gauges the load in its own thread, where no candidate code runs: its CPU time building the
inputs (the harness's main work) after each call of the share's reading and in each of the loop's baseline calls,
the candidate's tree frozen (timing.gauged_inputs). The share is scaled by how much slower the least of the loop's
builds was (``load_factor``), capped at LOAD_CAP: a candidate that leaves the host slower for the judge gains at most
that much more of the share.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from kb_gym.sandbox import descendants, unstopped

_LAST_PID = "/proc/sys/kernel/ns_last_pid"
ENV_SWITCH = "KB_GYM_CPU_CLOCK"
SETTLE_CAP_S = 0.02  # how long a reading waits for the tree to stop running (settled)
# The most the harness's share is scaled by a load: beside two processes copying 64 MB arrays on the 2-core host the
# share moved 0.82 -> 1.19 ms (1.45x) and the judge's gauge 1.2-1.25x (session 32).
LOAD_CAP = 1.5


def enabled() -> bool:
    """Off by default (KB_GYM_CPU_CLOCK=1 turns it on) until honest readings are clean across the test suite: with
    it on, one honest candidate of the suite was charged under load (docs/integrity.md, round 25)."""
    return os.environ.get(ENV_SWITCH) == "1"


def _process_cpu_ns(pid: int) -> int | None:
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    except (OSError, OverflowError):
        return None


def _thread_cpu_ns(pid: int, tid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _last_pid() -> int | None:
    """The last PID handed out, where the judge is its PID namespace's first process (the count is then the
    judge's, its runners' and its spares' alone); None elsewhere."""
    if os.getpid() != 1:
        return None
    try:
        with open(_LAST_PID, "rb") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Snapshot:
    processes: dict[int, int]  # pid -> the process's CPU ns so far
    threads: dict[int, int]  # tid -> the thread's CPU ns so far
    last_pid: int | None


def snapshot(root: int) -> Snapshot:
    """Every process and thread of ``root``'s tree now (about 10 us a thread)."""
    processes, threads = {}, {}
    for pid in [root, *(descendants(root) or [])]:
        ns = _process_cpu_ns(pid)
        if ns is None:
            continue
        processes[pid] = ns
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            t = _thread_cpu_ns(pid, tid)
            if t is not None:
                threads[int(tid)] = t
    return Snapshot(processes, threads, _last_pid())


def settled(root: int, cap_s: float = SETTLE_CAP_S) -> Snapshot:
    """A snapshot once every thread of the tree is asleep or stopped, or after ``cap_s``: a runner goes on after the
    judge has its outputs (freeing them, its held-back garbage collection), and a reading taken in the middle of
    that splits the same work between two calls unevenly (the harness's share then spread 0.35-1.4 ms a call on a
    2 MB output here, against ~0.05 ms settled). Work that never stops is read at the cap, and counted."""
    unstopped([root, *(descendants(root) or [])], timeout=cap_s)
    return snapshot(root)


@dataclass(frozen=True)
class Window:
    """The tree's CPU time between two snapshots."""

    total_ms: float  # every process of the tree, exited threads included
    heaviest_thread_ms: float  # the live thread that ran longest: the harness's own, in a runner that is as built
    other_threads_ms: float  # the live thread that ran longest after it
    exited_threads_ms: float  # what threads that exited in the window ran (a process clock less its live threads)
    # a task made and gone in the window (its time may be counted nowhere), or a process of the tree gone
    unaccounted: bool
    cpus: int

    def floor_ms(self, harness_ms: float = 0.0) -> float:
        """The least wall time the window's work took beyond ``harness_ms`` of the harness's own work: no thread
        runs longer than the wall, and the harness runs on the heaviest thread (where it does not, that thread's
        time beyond the harness's share is still read, and the harness's is counted again on another: the
        candidate's loss); threads that exited are taken as one (they may have run side by side: the candidate's
        loss too), and no tree runs on more CPUs than the host has."""
        return max(self.heaviest_thread_ms - harness_ms, self.other_threads_ms, self.exited_threads_ms,
                   (self.total_ms - harness_ms) / max(1, self.cpus))


def window(before: Snapshot, after: Snapshot, cpus: int | None = None) -> Window:
    total = sum(ns - before.processes.get(pid, 0) for pid, ns in after.processes.items())
    deltas = {tid: ns - before.threads.get(tid, 0) for tid, ns in after.threads.items()}
    exited = max(0, total - sum(deltas.values()))
    gone = any(pid not in after.processes for pid in before.processes)
    heaviest = sorted(deltas.values(), reverse=True) + [0, 0]
    return Window(total_ms=total / 1e6, heaviest_thread_ms=heaviest[0] / 1e6, other_threads_ms=heaviest[1] / 1e6,
                  exited_threads_ms=exited / 1e6, unaccounted=gone or _made_and_gone(before, after),
                  cpus=cpus or os.cpu_count() or 1)


def _made_and_gone(before: Snapshot, after: Snapshot) -> bool:
    """Whether a task was made in the window and is gone at its end (PIDs are handed out in order within the
    namespace; a wrap counts as such a task: the reading proves nothing then)."""
    if before.last_pid is None or after.last_pid is None:
        return False  # no namespace of the judge's own: not read (docs/integrity.md, round 25)
    if after.last_pid < before.last_pid:
        return True
    live = set(after.threads) | set(after.processes)
    # /proc/<tid> answers for any live task of the namespace, a thread of another process too (the judge's own)
    return any(p not in live and not os.path.exists(f"/proc/{p}") for p in range(before.last_pid + 1,
                                                                                  after.last_pid + 1))


def load_factor(before_ms: float | None, after_ms: float | None) -> float:
    """How much slower the gauge's work ran (``after_ms``) than when the harness's share was read (``before_ms``),
    within [1, LOAD_CAP]: 1 where either reading is missing (the share stands as read)."""
    if not before_ms or not after_ms or before_ms <= 0:
        return 1.0
    return min(LOAD_CAP, max(1.0, after_ms / before_ms))
