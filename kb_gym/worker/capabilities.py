"""A runner gives up every Linux capability before it loads anything.

Where the evaluator runs as root (GPU hosts often do) and no user namespace is available, a runner started
in fresh PID/network/mount namespaces still holds all of root's capabilities. seccomp refuses the calls
that use the dangerous ones (round 4: mknod, adjtimex, ioperm, bpf, ...), but a capability not tied to one
refused call stays a way round file modes (CAP_DAC_OVERRIDE: read any file the mount namespace shows),
ownership (CAP_CHOWN, CAP_FOWNER) and signals (CAP_KILL). Dropped here: the bounding set (no exec can get
them back), the ambient set, then the thread's effective, permitted and inheritable sets.

Capabilities belong to threads, not processes, so this runs before the runner starts any thread (CUDA's,
Triton's, OpenMP's): every thread made later inherits the empty sets. ``drop_all`` reports what the kernel
says of every thread afterwards.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAP_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return 63


def _thread_caps() -> dict[str, int]:
    """CapEff, CapPrm and CapBnd of every thread of this process, each OR-ed over the threads."""
    found = {"CapEff": 0, "CapPrm": 0, "CapBnd": 0}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as fh:
                for line in fh:
                    name, _, value = line.partition(":")
                    if name in found:
                        found[name] |= int(value.strip(), 16)
        except OSError:
            continue
    return found


def drop_all() -> dict[str, Any]:
    """Drop every capability of this process for good; returns ``{"capabilities": "none..." | "kept ..."}``
    for the sandbox record (``kept`` names what the kernel still shows, so a failure is visible, not silent)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(_last_cap() + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last, EPERM without CAP_SETPCAP
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header, data = _Header(_CAP_VERSION_3, 0), (_Data * 2)()
    libc.capset(ctypes.byref(header), data)
    caps = _thread_caps()
    # The bounding set only an exec could draw on, and no_new_privs (set by Landlock and seccomp next) stops
    # that; an unprivileged runner cannot empty it and has nothing to give up.
    if caps["CapEff"] == caps["CapPrm"] == 0:
        return {"capabilities": "none" if caps["CapBnd"] == 0 else "none (bounding set kept: no exec gains it)"}
    return {"capabilities": "kept " + " ".join(f"{k}={v:x}" for k, v in caps.items() if v)}
