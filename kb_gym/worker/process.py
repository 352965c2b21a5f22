"""Start-up steps shared by the judge and the runner processes."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import signal
import sys
import threading
import time

from kb_gym.worker import cpu_clock

# Both sides of a CPU timing keep the memory they free (glibc's malloc: no allocation below 32 MB served by a fresh
# mmap, no heap trimmed back to the OS below 1 GB). Otherwise whether a call's buffers page-fault anew depends on
# the process's history: a fresh spare faulted ~1,000 times a call on 2 MB tensors, a runner after its trials none,
# ~1 ms of CPU time a call on this host, which the CPU clock (cpu_clock.py) read as the harness's and the envelope as
# noise. With the memory kept, both fault only in their first calls. Set only where the CPU clock is on.
CPU_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def cpu_malloc_env() -> dict[str, str]:
    """CPU_MALLOC_ENV where the CPU clock is on (KB_GYM_CPU_CLOCK=1), else nothing."""
    return dict(CPU_MALLOC_ENV) if cpu_clock.enabled() else {}


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


# Where the host's memory runs out faster than the watchdog polls, the kernel's OOM killer takes the process with the
# highest badness: a runner (the candidate's) first, then a judge, and the evaluator (a trainer's process, with the
# policy in it) last. Raising one's own score needs no privilege. Lowering it again does only where the process held
# CAP_SYS_RESOURCE when it raised it (the kernel keeps that value as its floor); elsewhere a hostile runner can set its
# own back to 0 (Landlock leaves its /proc/PID writable: CUDA and PyTorch write there), which is where every process
# stood before. On the H100 (session 39) a GPU-size batch with two spares a worker had a runner killed this way; any
# process of the host could have been the one.
JUDGE_OOM_SCORE = 500
RUNNER_OOM_SCORE = 1000


def set_limits(file_bytes: int = resource.RLIM_INFINITY, oom_score: int = JUDGE_OOM_SCORE) -> None:
    # No core files; the runner caps any single file a candidate writes (runner.py). The judge runs no
    # candidate code and keeps no file limit: it sizes each runner's payload memfd for the call's outputs
    # (payload.PayloadReader.reserve), twice the reference's, and a 2 GB limit here made that fail for every
    # output over 1 GB (on the H200 they all crossed the pipe, 14-48 s per correctness pass). Address-space
    # limits break CUDA's virtual reservations, so memory is policed from outside by resident size instead.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-large writes fail with EFBIG instead
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write(str(oom_score))
    except OSError:  # no /proc here: the kernel's own choice stands
        pass


_MS_NOSUID, _MS_NODEV, _MS_BIND = 2, 4, 1 << 12


def bind_scratch(scratch: str, mount_point: str | None) -> str:
    """In the runner's own mount namespace: its scratch folder bound over the host's one mount point for runners
    (build_cache.mount_point), and the environment's paths under it moved there; the path it now uses. A build
    kept in the cache names that path in its files, so it is up to date in every runner (build_cache.py). The
    folder itself where the bind is refused (no namespace, no mount point)."""
    if not mount_point or not os.path.isdir(mount_point):
        return scratch
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(scratch.encode(), mount_point.encode(), None, _MS_BIND, None) != 0:
        return scratch
    for name, value in list(os.environ.items()):
        if value == scratch or value.startswith(scratch + os.sep):
            os.environ[name] = mount_point + value[len(scratch):]
    with contextlib.suppress(OSError):
        os.chdir(mount_point)
    return mount_point


ENV_HOST_IPC = "KB_GYM_HOST_IPC_NS"  # the judge's IPC namespace, as /proc/self/ns/ipc names it
ENV_GPU = "KB_GYM_RUNNER_GPU"  # the one GPU a runner's CUDA may see (runner_start.own_gpu, runner.narrow_to_one_gpu)


def host_ipc_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/ipc")
    except OSError:
        return ""


# Message queues and semaphore sets hold kernel memory no process's RSS shows either (round 6: 32,000 queues of
# 16 KB, ~500 MB; semaphore sets more): a few of each, plenty for anything a kernel needs.
_SYSV_SMALL = (("msgmni", "16"), ("msgmnb", "65536"), ("sem", "250 4000 32 16"))


def limit_sysv_ipc(shm_mb: int) -> bool:
    """In the runner's own IPC namespace, and only there: at most ``shm_mb`` of SysV shared memory in all,
    and few message queues and semaphore sets. A segment created, filled and detached is in no process's maps,
    descriptors or resident memory, so the memory watchdog cannot see it, yet it keeps its pages while the
    namespace lives (round 5: 2.1 GB in ten segments under a 2 GB limit). The private /dev/shm has the same
    cap. Needs CAP_SYS_ADMIN (before the runner drops its capabilities); False where it is not this process's
    own namespace or not permitted."""
    host = os.environ.get(ENV_HOST_IPC, "")
    if not host or host_ipc_namespace() in ("", host):
        return False  # the judge's namespace (or unknown): its limits are the host's, never lowered from here
    total = shm_mb << 20
    try:
        for name, value in (("shmmax", str(total)), ("shmall", str(total // os.sysconf("SC_PAGE_SIZE"))),
                            *_SYSV_SMALL):
            with open(f"/proc/sys/kernel/{name}", "w") as handle:
                handle.write(value)
    except OSError:
        return False
    return True


def private_shm(size_mb: int) -> bool:
    """A fresh, size-limited tmpfs on /dev/shm, seen only by this mount namespace (the runner's own):
    nothing written there reaches the host's /dev/shm or outlives the runner. False where not permitted."""
    libc = ctypes.CDLL(None, use_errno=True)
    opts = f"size={size_mb}m,mode=1777".encode()
    return libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) == 0


def exit_when_orphaned(proto_in: int, interval: float = 0.5) -> threading.Thread:
    """Watch the protocol pipe from a daemon thread: once every writer is gone (the evaluator's process died,
    killed by a job scheduler's timeout, say) and stays gone for two looks, SIGKILL this process and all it
    started. A judge reads its pipe only between jobs, and its runners live in their own sessions, so without
    this a judge orphaned mid-job ran its job to the end on the GPU (seen on the H200: 70 GB and the device
    still held by a killed benchmark's judge when the next command started)."""
    def kill_descendants_and_exit() -> None:
        # Not sandbox.kill_tree(os.getpid()): no process group or pid number is signalled, only processes
        # found as this one's descendants, so a judge that is PID 1 of its namespace signals nothing outside it.
        try:
            import psutil

            for proc in psutil.Process().children(recursive=True):
                try:
                    proc.kill()
                except psutil.Error:
                    pass
        except Exception:  # noqa: BLE001 - psutil missing or the walk failed: exit all the same
            pass
        os._exit(1)

    def watch() -> None:
        poller = select.poll()
        poller.register(proto_in, select.POLLHUP)
        seen = 0
        while True:
            hung_up = any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, ev in poller.poll(0))
            seen = seen + 1 if hung_up else 0
            if seen >= 2:
                kill_descendants_and_exit()
            time.sleep(interval)

    thread = threading.Thread(target=watch, name="kb_gym_orphan_watch", daemon=True)
    thread.start()
    return thread
