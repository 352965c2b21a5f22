"""Landlock (Linux 5.13+): the worker may write only inside the folders it is given.

Applied by the worker to itself before any candidate code runs; every process it starts inherits
it and nothing can lift it. Reads stay allowed everywhere (candidates import torch, read headers).
Where the kernel's Landlock ABI allows, the same ruleset also refuses TCP bind/connect (ABI 4) and
signals or abstract sockets aimed at processes outside the sandbox (ABI 6): a second wall behind
the network and PID namespaces, and the only one where namespaces are not permitted.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Iterable

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # same numbers on every architecture
_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_O_PATH = getattr(os, "O_PATH", 0o10000000)

_WRITE_FS = ((1 << 1)  # WRITE_FILE
             | (1 << 4) | (1 << 5)  # REMOVE_DIR, REMOVE_FILE
             | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12))  # MAKE_*
_READ_FS = (1 << 0) | (1 << 2) | (1 << 3)  # EXECUTE, READ_FILE, READ_DIR
_REFER, _TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | _TRUNCATE  # EXECUTE, WRITE_FILE, READ_FILE, TRUNCATE
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is unavailable."""
    try:
        version = _libc().syscall(_CREATE_RULESET, None, 0, _RULESET_VERSION)
    except (OSError, AttributeError):
        return 0
    return max(0, int(version))


def restrict_writes(writable: Iterable[str], max_abi: int | None = None,
                    readable: Iterable[str] | None = None) -> dict[str, object]:
    """Allow writes only beneath ``writable``; returns what was enforced (``{"landlock": 0}`` if nothing).

    ``readable``: where given, reads (and execution) are allowed only beneath these folders and the
    writable ones: deny by default, for runners of candidate code.
    ``max_abi`` caps the features used (e.g. 3: files only, no TCP or scope rules).
    Never raises: a kernel without Landlock leaves the process as it was, and the caller reports it.
    """
    abi = min(abi_version(), max_abi if max_abi is not None else 1 << 30)
    if abi < 1:
        return {"landlock": 0}
    libc = _libc()
    write_fs = _WRITE_FS | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    readable = None if readable is None else list(readable)
    fs = write_fs | (_READ_FS if readable is not None else 0)
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL) if abi >= 6 else 0
    if abi >= 6:
        attr = struct.pack("QQQ", fs, net, scoped)
    elif abi >= 4:
        attr = struct.pack("QQ", fs, net)
    else:
        attr = struct.pack("Q", fs)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(_CREATE_RULESET, buf, len(attr), 0)
    if ruleset < 0:
        return {"landlock": 0, "error": os.strerror(ctypes.get_errno())}
    allowed, read_allowed = [], []
    rules = [(p, fs, allowed) for p in writable] + [(p, _READ_FS, read_allowed) for p in readable or ()]
    try:
        for path, access, record in rules:
            try:
                fd = os.open(path, _O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a folder that does not exist cannot be written anyway
            if not os.path.isdir(path):
                access &= _FILE_RIGHTS  # a file's rule may name only rights that apply to files
            try:
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
                if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, 0) == 0:
                    record.append(path)
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return {"landlock": 0, "error": "prctl(NO_NEW_PRIVS) failed"}
        if libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
            return {"landlock": 0, "error": os.strerror(ctypes.get_errno())}
    finally:
        os.close(ruleset)
    info: dict[str, object] = {"landlock": abi, "writable": allowed, "tcp_blocked": bool(net),
                               "signals_scoped": bool(scoped)}
    if readable is not None:
        info["readable"] = read_allowed
    return info
