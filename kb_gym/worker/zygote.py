"""Zygote: ``python -m kb_gym.worker.zygote --fd N``, a pristine process that forks runners.

Starting a runner from scratch costs an interpreter, ``import torch`` and Triton (5-6 s on the
H200 machine, 1-2 s here). The zygote pays that once: it imports everything a runner needs, never
initialises CUDA and never runs candidate code, and forks a runner per request in milliseconds. The
child drops every descriptor but the three it was handed, enters fresh PID, network and mount
namespaces (then forks once more, so the runner is the first process of its PID namespace, with
its own /proc), and from there is an ordinary runner: private /dev/shm, Landlock, seccomp, CUDA
initialised in the child itself.

Requests arrive on a UNIX socket the judge made before starting the zygote (no socket is ever made
after a runner exists): one JSON line with the device, scratch folder and environment, and the
runner's stdin, stdout and stderr as passed descriptors. The reply is the forked child's pid.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import importlib
import json
import os
import signal
import socket
import sys
from typing import Any

_CLONE_NEWNS, _CLONE_NEWPID, _CLONE_NEWNET, _CLONE_NEWIPC = 0x00020000, 0x20000000, 0x40000000, 0x08000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
_PR_SET_PDEATHSIG = 1


def _preload() -> None:
    """Everything a runner imports, imported once here (CUDA stays uninitialised: a forked child must
    create its own context)."""
    # torch._dynamo: a dispatch mode's first entry imports it, 1.3 s of every runner's first traced call (dataflow.py)
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.nn.functional  # noqa: F401
    import torch.utils.cpp_extension  # noqa: F401

    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        pass
    else:
        _triton_key()
    import kb_gym.worker.clock  # noqa: F401
    import kb_gym.worker.inputs  # noqa: F401
    import kb_gym.worker.launches  # noqa: F401
    import kb_gym.worker.loading  # noqa: F401
    import kb_gym.worker.runner  # noqa: F401
    import kb_gym.worker.seccomp  # noqa: F401
    import kb_gym.worker.tensors  # noqa: F401


def _triton_key() -> None:
    """Triton keys its compiled kernels by a hash of its own sources and of libtriton (``triton_key``, cached per
    process): 0.27 s on this CPU, paid by each runner at its first kernel, which a spare's start-up loads (the device
    digest's, runner.serve). Reading files only, it is computed once here and every forked runner inherits it."""
    for module in ("triton.runtime.cache", "triton.compiler.compiler"):  # where Triton 3.x versions keep it
        try:
            key = getattr(importlib.import_module(module), "triton_key", None)
        except ImportError:
            continue
        if callable(key):
            try:
                key()
            except Exception:  # noqa: BLE001 - a layout this does not know: each runner computes it, as before
                pass
            return


def _enter_namespaces(libc: ctypes.CDLL) -> bool:
    """New mount, network, PID and IPC namespaces for the child (without IPC where only that is refused);
    False where the OS refuses. The IPC namespace takes SysV shared memory, semaphores and message queues
    with the runner when it ends: a segment left in the host's namespace outlived the runner and the
    evaluator, memory nobody counted and a channel to the next candidate (round 4)."""
    base = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID
    return libc.unshare(base | _CLONE_NEWIPC) == 0 or libc.unshare(base) == 0


def _mount_private_proc(libc: ctypes.CDLL) -> None:
    # Mounts made here must not propagate back to the judge's namespace; /proc must show this PID
    # namespace only, or the runner would see (and could read) the judge's processes.
    libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None)
    libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)


# stdin, stdout, stderr, and the payload memfd and the device buffer's handle where a judge passes them
MAX_FDS = 5


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the runner. Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        # stdin, stdout, stderr, the payload memfd and the device buffer's handle where there are: moved out of the
        # way first, so that no dup2 overwrites a descriptor a later one still has to move
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 256) for fd in fds]
        for target, fd in enumerate(moved):
            os.dup2(fd, target)
        os.closerange(len(fds), 1 << 16)
        os.environ.clear()
        os.environ.update(request["env"])
        libc = ctypes.CDLL(None, use_errno=True)
        isolated = request.get("namespaces", True) and _enter_namespaces(libc)
        if isolated:
            pid = os.fork()  # the first child in the new PID namespace is its init
            if pid:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _, status = os.waitpid(pid, 0)
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the waiting parent killed: the runner goes too
            _mount_private_proc(libc)
            os.environ["KB_GYM_RUNNER_PRIVATE_SHM"] = "1"
        from kb_gym.worker.process import bind_scratch
        from kb_gym.worker.runner import serve

        # Every runner sees its scratch folder at the host's one mount point (build_cache.mount_point).
        scratch = bind_scratch(request["scratch"], request.get("fixed_scratch")) if isolated else request["scratch"]

        sys.argv = ["kb_gym.worker.runner"]
        serve(request["device"], scratch, namespaces=bool(isolated))
    except BaseException:  # noqa: BLE001 - whatever happens, the child never returns into the zygote's loop
        import traceback

        traceback.print_exc()
    os._exit(70)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kb_gym.worker.zygote")
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args()
    sock = socket.socket(fileno=args.fd)
    _preload()
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    import torch

    if torch.cuda.is_initialized():  # a forked child could not use CUDA: say so instead of forking
        sock.sendall(b'{"type": "error", "error": "CUDA was initialised while preloading"}\n')
        os._exit(3)
    sock.sendall(json.dumps({"type": "ready", "pid": os.getpid()}).encode() + b"\n")
    buffer = b""
    while True:
        try:
            data, fds, flags, _ = socket.recv_fds(sock, 1 << 16, MAX_FDS)
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:
            break
        buffer += data
        if b"\n" not in buffer:
            for fd in fds:
                os.close(fd)
            continue
        line, buffer = buffer.split(b"\n", 1)
        request = json.loads(line)
        # the request names how many descriptors it sent: one the kernel dropped (MSG_CTRUNC) would leave the runner
        # a number that names nothing, or another file (round 19: the device buffer's handle, fifth, never arrived)
        if len(fds) != request.get("fds") or not 3 <= len(fds) <= MAX_FDS or flags & socket.MSG_CTRUNC:
            for fd in fds:
                os.close(fd)
            error = f"a spawn request sent {len(fds)} of {request.get('fds')!r} descriptors (3 to {MAX_FDS})"
            sock.sendall(json.dumps({"type": "error", "error": error}).encode() + b"\n")
            continue
        pid = os.fork()
        if pid == 0:
            _child(request, fds)
        for fd in fds:
            os.close(fd)
        sock.sendall(json.dumps({"type": "spawned", "pid": pid}).encode() + b"\n")
    os._exit(0)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


if __name__ == "__main__":
    main()
