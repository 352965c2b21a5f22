"""Start-up steps shared by the judge and the runner processes."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys


def take_protocol_fds() -> tuple[int, int]:
    """Move the protocol off stdin/stdout: fd 1 and 2 then both go to the stderr pipe, so whatever a
    candidate prints lands in a bounded log the parent drains, never in the protocol stream."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    for fd in (proto_in, proto_out):
        os.set_inheritable(fd, False)  # children of a candidate must not hold the protocol pipe
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    return proto_in, proto_out


def set_limits(file_bytes: int = 2 << 30) -> None:
    # No core files; cap any single file a candidate writes. Address-space limits break CUDA's
    # virtual reservations, so memory is policed from outside by resident size instead.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-large writes fail with EFBIG instead


_MS_NOSUID, _MS_NODEV = 2, 4


def private_shm(size_mb: int) -> bool:
    """A fresh, size-limited tmpfs on /dev/shm, seen only by this mount namespace (the runner's own):
    nothing written there reaches the host's /dev/shm or outlives the runner. False where not permitted."""
    libc = ctypes.CDLL(None, use_errno=True)
    opts = f"size={size_mb}m,mode=1777".encode()
    return libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) == 0
