"""How worker processes are isolated, and how they are killed with everything they started.

Where the OS allows it, each worker runs in fresh PID, network and mount namespaces (util-linux
``unshare``; as root directly, otherwise inside a user namespace). In a PID namespace the worker
cannot see or signal the evaluator, ``os.getppid()`` is 0, and killing the namespace's first
process kills every process the candidate started, even ones that called ``setsid``. The new
network namespace has only a loopback device, which is down: no network. Where namespaces are not
permitted, workers run in their own session and process group, and ``describe()`` says so.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

_BASE = ["--pid", "--net", "--mount", "--fork", "--mount-proc", "--kill-child"]
_VARIANTS = (("root", _BASE), ("user", ["--user", "--map-root-user", *_BASE]))


@functools.cache
def namespace_prefix() -> tuple[str, ...]:
    """The command prefix that starts a process in new namespaces here, or () if none works."""
    if os.environ.get("KB_GYM_SANDBOX", "").lower() in ("0", "off", "none"):
        return ()
    unshare = shutil.which("unshare")
    if not unshare or not os.path.exists("/proc/self/ns/pid"):
        return ()
    for _, flags in _VARIANTS:
        if _starts((unshare, *flags)):
            return (unshare, *flags)
    return ()


def _starts(prefix: tuple[str, ...]) -> bool:
    """Whether a process started with ``prefix`` runs here."""
    try:
        return subprocess.run([*prefix, "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.cache
def runner_namespace_prefix() -> tuple[str, ...]:
    """namespace_prefix() for a runner started as a fresh interpreter, with an IPC namespace too where one can
    be made: SysV memory then goes with the runner and is capped there (process.limit_sysv_ipc)."""
    prefix = namespace_prefix()
    return (*prefix, "--ipc") if prefix and _starts((*prefix, "--ipc")) else prefix


def describe() -> dict[str, Any]:
    """What isolation workers get on this machine (goes into every EvalResult's ``worker``)."""
    prefix = namespace_prefix()
    return {"pid_namespace": bool(prefix), "network_namespace": bool(prefix),
            "user_namespace": "--user" in prefix, "process_group": True}


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid``, its process group and every descendant still visible; returns the pids signalled."""
    signalled = [pid]
    try:
        import psutil

        try:
            root = psutil.Process(pid)
            victims = root.children(recursive=True) + [root]
        except psutil.Error:
            victims = []
        for proc in victims:
            try:
                proc.kill()
                signalled.append(proc.pid)
            except psutil.Error:
                pass
    except ImportError:
        signalled += descendants(pid) or []
        for child in signalled[1:]:
            try:
                os.kill(child, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    return sorted(set(signalled))


def kill_and_wait(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """``kill_tree`` the process, reap it, and wait until every process of its tree is gone: a SIGKILL lands
    when a process leaves the kernel, and one inside a long system call (MAP_POPULATE of gigabytes) ran on beside
    what the judge did next (round 4, for a runner; round 9's pass, for a judge killed with its runners). A
    process that outlives the wait is left to the OS."""
    deadline = time.monotonic() + timeout
    tree = kill_tree(proc.pid)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    wait_gone(tree, timeout=max(0.0, deadline - time.monotonic()))


def descendants(pid: int) -> list[int] | None:
    """``pid``'s descendants from /proc/<pid>/task/<tid>/children (only its own subtree is read: cheap
    beside a scan of every process); None where the kernel does not provide the files."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{current}/task/{tid}/children") as fh:
                    kids = [int(x) for x in fh.read().split()]
            except FileNotFoundError:
                return None if current == pid else found
            except (OSError, ValueError):
                continue
            found += kids
            todo += kids
    return found


def freeze_tree(pid: int) -> list[int]:
    """SIGSTOP ``pid`` and every descendant, repeating until no new process appears (a process that forks
    while the first pass runs is caught by the next). Returns the pids to hand to ``thaw``."""
    stopped: set[int] = set()
    for _ in range(8):
        tree = descendants(pid)
        if tree is None:  # no children files: psutil's scan of every process instead
            try:
                import psutil

                tree = [p.pid for p in psutil.Process(pid).children(recursive=True)]
            except Exception:  # noqa: BLE001 - gone
                tree = []
        fresh = [p for p in (pid, *tree) if p not in stopped]
        if not fresh:
            break
        for target in fresh:
            try:
                os.kill(target, signal.SIGSTOP)
                stopped.add(target)
            except (ProcessLookupError, PermissionError):
                pass
    return sorted(stopped)


def unstopped(pids: list[int], timeout: float = 1.0, asleep_is_stopped: bool = True,
              also: tuple[str, ...] = ()) -> list[int]:
    """Those of ``pids`` with a thread still running after ``timeout``. SIGSTOP lands when a thread next
    leaves the kernel, so one inside a long system call (a write, a MAP_POPULATE of 16 GB: ~0.5 s) runs on
    after os.kill returns; and a process's state in /proc/PID/stat is its first thread's only. A thread asleep
    (S) counts as stopped unless ``asleep_is_stopped`` is False: it uses no CPU, and when it wakes it stops
    before running anything of its own (an idle runner, asleep in its read, would otherwise cost each freeze a
    trip through the scheduler); but a system call it sleeps in may still finish first (a write)."""
    done = ("T", "t", "Z", "X", None) + (("S", "I") if asleep_is_stopped else ()) + also  # ``also``: more states
    deadline = time.monotonic() + timeout
    pause = 1e-4
    pending = list(pids)
    while True:
        pending = [p for p in pending if not _all_threads_in(p, done)]
        if not pending or time.monotonic() > deadline:
            return pending
        time.sleep(pause)
        pause = min(2 * pause, 5e-3)


def wait_gone(pids: list[int], timeout: float = 10.0) -> bool:
    """Whether every one of ``pids`` has exited (or is a zombie) within ``timeout``."""
    deadline = time.monotonic() + timeout
    pending = list(pids)
    while pending:
        pending = [p for p in pending if _state(p) not in ("Z", "X", None)]
        if not pending:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _all_threads_in(pid: int, states: tuple[str | None, ...]) -> bool:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True  # gone
    return all(_state(f"{pid}/task/{tid}") in states for tid in tids)


_PF_EXITING = 0x4  # a task's flags (/proc/PID/stat, field 9): it is in its exit


class ProcessUsage(NamedTuple):
    cpu_ns: int  # its live threads' time on a CPU (schedstat, exact)
    ticks: int  # utime, stime, cutime, cstime (stat: keeps exited threads and reaped children, at 10 ms grain)
    gone: bool  # exited: a zombie
    exiting: bool  # gone, or in its exit (PF_EXITING)
    system_ticks: int = 0  # stime and cstime of ``ticks``: its time in the kernel, on its own behalf
    voluntary: int = 0  # its live threads' voluntary context switches: each stop, and each sleep, adds one


def process_usage(pid: int) -> dict[int, ProcessUsage]:
    """Per process of ``pid``'s tree, what it has used so far. Compared process by process, one that leaves cannot
    take its history off another's use, as a tree's sum lets it (tree_usage)."""
    usage: dict[int, ProcessUsage] = {}
    for proc in (pid, *(descendants(pid) or [])):
        try:
            tids = os.listdir(f"/proc/{proc}/task")
            with open(f"/proc/{proc}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            ticks = sum(int(v) for v in fields[11:15])
            system_ticks = int(fields[12]) + int(fields[14])
            gone = fields[0] in (b"Z", b"X")
            exiting = gone or bool(int(fields[6]) & _PF_EXITING)
        except (OSError, IndexError, ValueError):
            continue
        cpu_ns = voluntary = 0
        for tid in tids:
            try:
                with open(f"/proc/{proc}/task/{tid}/schedstat", "rb") as handle:
                    cpu_ns += int(handle.read().split()[0])
                with open(f"/proc/{proc}/task/{tid}/status", "rb") as handle:
                    voluntary += _voluntary_switches(handle.read())
            except (OSError, IndexError, ValueError):
                continue
        usage[proc] = ProcessUsage(cpu_ns, ticks, gone, exiting, system_ticks, voluntary)
    return usage


def _voluntary_switches(status: bytes) -> int:
    at = status.find(b"\nvoluntary_ctxt_switches:")
    return int(status[at + 26:status.index(b"\n", at + 1)]) if at >= 0 else 0


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (a zombie has)."""
    return _state(pid) not in ("Z", "X", None)


def _state(pid: int | str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class TreeUsage:
    """CPU a process tree had used at one moment: nanoseconds on a CPU summed over its live threads
    (schedstat, exact), clock ticks summed over its processes and the children they reaped (stat, which keeps
    exited threads too, at 10 ms grain), and which processes it had."""

    cpu_ns: int
    ticks: int
    pids: frozenset[int]  # alive: not exited (a zombie is not counted as a process that could go)


# A stopped tree uses no CPU; a thread asleep when it was stopped wakes only to stop (microseconds). More than
# this, or a process that was not there before, means something of the tree ran while it was held stopped: a
# POSIX timer that sends SIGCONT resumes a process every half millisecond, whoever stopped it (round 5).
RAN_NS = 5_000_000
RAN_TICKS = 3  # ticks charge a whole 10 ms to whatever runs when they fire: three is more than a wake-up


def tree_usage(pid: int) -> TreeUsage:
    """``pid``'s and its descendants' CPU use so far (compare two with ``ran_between``)."""
    procs = process_usage(pid)
    return TreeUsage(sum(u.cpu_ns for u in procs.values()), sum(u.ticks for u in procs.values()),
                     frozenset(p for p, u in procs.items() if not u.gone))


def ran_between(before: TreeUsage, after: TreeUsage) -> bool:
    """Whether the tree ran between two readings taken while it was held stopped: it used CPU, started a
    process, or lost one (a stopped process cannot exit; one that ran and exited unreaped takes its CPU time
    with it: round 6)."""
    return (after.cpu_ns - before.cpu_ns > RAN_NS or after.ticks - before.ticks >= RAN_TICKS
            or after.pids != before.pids)


def thaw(pids: list[int]) -> None:
    for target in pids:
        try:
            os.kill(target, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass
