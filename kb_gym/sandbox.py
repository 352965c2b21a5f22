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
from typing import Any

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
        prefix = (unshare, *flags)
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return prefix
    return ()


def describe() -> dict[str, Any]:
    """What isolation workers get on this machine (goes into every EvalResult's ``worker``)."""
    prefix = namespace_prefix()
    return {"pid_namespace": bool(prefix), "network_namespace": bool(prefix),
            "user_namespace": "--user" in prefix, "process_group": True}


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, its process group and every descendant still visible."""
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
            except psutil.Error:
                pass
    except ImportError:
        pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def kill_and_wait(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """``kill_tree`` the process, then reap it (a process that outlives the wait is left to the OS)."""
    kill_tree(proc.pid)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


def freeze_tree(pid: int) -> list[Any]:
    """SIGSTOP ``pid`` and every descendant, repeating until no new process appears (a process that forks
    while the first pass runs is caught by the next). Returns the processes to hand to ``thaw``."""
    import psutil

    stopped: dict[int, Any] = {}
    for _ in range(8):
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            break
        fresh = [p for p in procs if p.pid not in stopped]
        if not fresh:
            break
        for proc in fresh:
            try:
                proc.suspend()
                stopped[proc.pid] = proc
            except psutil.Error:
                pass
    return list(stopped.values())


def thaw(procs: list[Any]) -> None:
    import psutil

    for proc in procs:
        try:
            proc.resume()
        except psutil.Error:
            pass
