"""Large outputs from a runner to its judge through shared memory instead of the protocol pipe.

On the H200 a 1 GB output cost 0.93 s per correctness call through the pipe (2.2 GB/s out of it, plus the
wait for the runner's write; docs/measurements/wire-profile-h200-2026-12-01.log), and a 1 ms memory-bound
kernel there moves ~5 GB. So each runner gets a memfd from its judge at birth: the runner copies an
output of at least SHM_MIN_BYTES into it after reporting "done" (the clock stops on "done", as before),
then says "payload"; the judge copies the bytes out to its own memory (decode) and checks them against
the commitment "done" carried, as it does for bytes from the pipe.

What the runner (candidate code) can do with the memfd, and why it gains nothing:
- write into it at any time: the judge judges its own copy, and that copy must match the commitment made
  before "done" (a late or changed write is `tampering`), exactly as for late bytes in the pipe;
- shrink it under the judge's reading (a SIGBUS in the judge): the judge seals it against shrinking
  before the runner exists, and checks its size before mapping;
- grow it without bound: only the pages it writes use memory, charged to the runner; the judge maps only
  the bytes the outputs' description announced (within the byte limit the reference's outputs set);
- add seals or close it: its own copy into it then fails, and the runner sends the same bytes through the
  pipe instead (checked the same way; a memfd that fails for any other reason costs only speed).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import mmap
import os
import threading
import time
import warnings
from typing import Any

import torch

from kb_gym.worker.tensors import flatten_bytes

SHM_MIN_BYTES = 1 << 20  # smaller payloads cross the pipe: one write, no mapping
PIN_MIN_BYTES = 64 << 20  # mappings this large are page-locked for the GPU's copies (pin_wanted)
# A spare's memfd is sized, populated and (on a GPU) page-locked at its start, before any candidate, for outputs of
# the size its problem's last evaluations had, between these bounds (RunnerPool.payload_hint): on the H200 a 6.4 GB
# output's first copy into a fresh memfd took 3.9-4.4 s (3.5 s of it allocating and zeroing pages, the rest
# page-locking them) against 0.12 s for each later one, all of it inside the device lock (docs/benchmarks.md 0u)
PREMAP_MIN_BYTES = PIN_MIN_BYTES
PREMAP_MAX_BYTES = int(float(os.environ.get("KB_GYM_PAYLOAD_PREMAP_GB", "8")) * (1 << 30))


def premap_size(nbytes: int) -> int:
    """``nbytes`` where outputs that large are mapped before the device lock (the PREMAP bounds), else 0."""
    return nbytes if PREMAP_MIN_BYTES <= nbytes <= PREMAP_MAX_BYTES else 0

ENV_FD = "KB_GYM_PAYLOAD_FD"  # the memfd's number in the runner (set by the judge)
_HOST_REGISTER_PORTABLE, _HOST_REGISTER_READ_ONLY = 0x01, 0x08  # CU_MEMHOSTREGISTER_*
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def enabled() -> bool:
    """``KB_GYM_PAYLOAD=pipe`` sends every output through the pipe (to measure one against the other)."""
    return os.environ.get("KB_GYM_PAYLOAD", "shm") != "pipe" and hasattr(os, "memfd_create")


def create() -> int | None:
    """A memfd for one runner's payloads, sealed against shrinking; None where memfds or seals are missing."""
    if not enabled():
        return None
    try:
        fd = os.memfd_create("kb_gym_payload", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return None
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    except OSError:
        os.close(fd)
        return None
    return fd


def pin_wanted(device: str) -> bool:
    """Whether the mappings of a runner on ``device`` and of its judge are page-locked: on a GPU, unless
    ``KB_GYM_PAYLOAD_PIN=0``. The copy between a GPU and pageable memory is staged by the driver at ~6 GB/s
    (the H200: 1.0 s for a 6.4 GB host-to-device copy, docs/benchmarks.md 0c); from page-locked memory the
    copy engines read and write it directly."""
    return device.startswith("cuda") and os.environ.get("KB_GYM_PAYLOAD_PIN", "1") != "0"


@functools.cache
def _driver() -> Any:
    """The CUDA driver library, or None. Its cuMemHostRegister, not the runtime's cudaHostRegister: a failed
    runtime call leaves a "last error" that the next kernel launch's check would report as its own."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


class _Mapping:
    """One shared mapping of the memfd, remapped when a payload needs more bytes than it covers; page-locked
    where ``pin`` and large enough (registered with the driver for the mapping's life, unregistered before
    it is unmapped). A registration that fails leaves the mapping pageable: only slower."""

    writable = True

    def __init__(self, fd: int, pin: bool = False) -> None:
        self.fd = fd
        self.map: mmap.mmap | None = None
        self.pin = pin
        self._pinned: torch.Tensor | None = None  # the whole mapping, while registered
        self.pinned_maps = 0

    def bytes(self, nbytes: int) -> torch.Tensor:
        if self.map is None or len(self.map) < nbytes:
            self.close()
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if self.writable else 0)
            # every page mapped in one call instead of one fault per 4 KB (a 1 GB memfd on a 2-core CPU: 0.14 s to
            # map and zero against 0.20-0.24 s); the bytes are all written or read right after
            self.map = mmap.mmap(self.fd, nbytes, mmap.MAP_SHARED | _POPULATE, prot)
            if self.pin and nbytes >= PIN_MIN_BYTES:
                self._register(self._tensor(None))
        return self._tensor(nbytes)

    def _tensor(self, nbytes: int | None) -> torch.Tensor:
        with warnings.catch_warnings():  # a read-only mapping: the judge's tensor is only ever read (copied out)
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            if nbytes is None:
                return torch.frombuffer(self.map, dtype=torch.uint8)
            return torch.frombuffer(self.map, dtype=torch.uint8, count=nbytes)

    def _register(self, whole: torch.Tensor) -> None:
        lib = _driver()
        if lib is None:
            return
        try:
            flags = _HOST_REGISTER_PORTABLE | (0 if self.writable else _HOST_REGISTER_READ_ONLY)
            status = lib.cuMemHostRegister_v2(ctypes.c_void_p(whole.data_ptr()), ctypes.c_size_t(whole.numel()),
                                              ctypes.c_uint(flags))
        except AttributeError:
            return
        if status == 0:
            self._pinned = whole
            self.pinned_maps += 1

    def unpin(self) -> None:
        """Undo the page-locking (a driver call for the calling thread's context: the one that registered it)."""
        if self._pinned is not None:
            lib = _driver()
            if lib is not None:
                lib.cuMemHostUnregister(ctypes.c_void_p(self._pinned.data_ptr()))
            self._pinned = None

    def close(self) -> None:
        self.unpin()
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a tensor still views it: the mapping goes when that tensor does
                pass
            self.map = None


class PayloadWriter(_Mapping):
    """The runner's side: copy outputs into the memfd, growing it as needed."""

    @classmethod
    def from_env(cls, device: str = "cpu") -> PayloadWriter | None:
        value = os.environ.pop(ENV_FD, "")
        if not value.isdigit():
            return None
        fd = int(value)
        try:
            os.fstat(fd)
        except OSError:
            return None
        os.set_inheritable(fd, False)  # a candidate's children do not get it
        return cls(fd, pin=pin_wanted(device))

    def premap(self) -> float:
        """Map (populated, page-locked where wanted) the bytes the judge sized the memfd to before this runner
        started, if within the PREMAP bounds; returns the seconds it took (0.0 where nothing was mapped)."""
        start = time.perf_counter()
        try:
            size = premap_size(os.fstat(self.fd).st_size)
            if not size:
                return 0.0
            self.bytes(size)
        except (OSError, ValueError, RuntimeError):  # no memory for it: the first copy maps it, as without
            self.close()
            return 0.0
        return time.perf_counter() - start

    def write(self, tensors: list[Any], total: int) -> None:
        if os.fstat(self.fd).st_size < total:
            os.ftruncate(self.fd, total)
        buf = self.bytes(total)
        offset = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            if n:
                buf[offset:offset + n].copy_(flatten_bytes(t))
            offset += n
        del buf


class PayloadReader(_Mapping):
    """The judge's side: the announced bytes, once the runner said they are there. Mapped read-only: the judge
    never writes them, and a writable mapping is one a runner can forbid (F_SEAL_FUTURE_WRITE made the judge's
    mmap fail, round 4)."""

    writable = False

    def __init__(self, fd: int, pin: bool = False) -> None:
        super().__init__(fd, pin)
        self._premapping: threading.Thread | None = None

    def premap(self, nbytes: int, device: torch.device | None = None) -> None:
        """Map ``nbytes`` in the background (the runner has populated them: premap above), so that the first
        payload finds the judge's mapping made and page-locked; ``view`` and ``close`` wait for it. ``device``: a
        GPU whose context the thread makes current first (the driver page-locks nothing for a thread without one)."""
        if self._premapping is not None or (self.map is not None and len(self.map) >= nbytes):
            return

        def run() -> None:
            try:
                if self.pin and device is not None and device.type == "cuda":
                    torch.cuda.synchronize(device)  # the device's primary context, current on this thread
                self.bytes(nbytes)
            except (OSError, ValueError, RuntimeError):  # the first view maps it, as without
                pass

        self._premapping = threading.Thread(target=run, name="kb-gym-premap", daemon=True)
        self._premapping.start()

    def _premapped(self) -> None:
        """Wait for the background mapping (not from within it: its own remap closes the mapping first)."""
        thread = self._premapping
        if thread is not None and thread is not threading.current_thread():
            thread.join()
            self._premapping = None

    def close(self) -> None:
        self._premapped()
        super().close()

    def reserve(self, nbytes: int) -> None:
        """Grow the memfd to ``nbytes`` before a call whose outputs may take that many. The runner cannot grow
        it past its own file-size limit (RLIMIT_FSIZE, 1 GB: runner.py), and its copy then fell back to the
        pipe: on the H200 every output over 1 GB (most GPU-size problems) crossed the pipe at ~2 GB/s.
        Writing into pages the file already has is not limited. The file stays sparse: only the pages the
        runner writes take memory, and they are charged to the runner."""
        try:
            if os.fstat(self.fd).st_size < nbytes:
                os.ftruncate(self.fd, nbytes)
        except OSError:  # no memory for the inode, say: the runner grows it itself or uses the pipe
            pass

    def view(self, nbytes: int) -> torch.Tensor:
        """The payload's bytes in the shared mapping (decode copies them out before anything reads them)."""
        self._premapped()
        size = os.fstat(self.fd).st_size
        if size < nbytes:  # sealed: it cannot shrink after this check, so mapping nbytes cannot fault
            raise ValueError(f"the runner announced {nbytes:,} bytes in shared memory but wrote {size:,}")
        return self.bytes(nbytes)


def free_later(reader: PayloadReader) -> threading.Thread:
    """Unmap and close a runner's memfd on a thread of its own, once the runner is killed: the kernel frees the
    memfd's pages as its last reference goes, ~60 ms a GB on this 2-core CPU (2 GB: 124 ms), and the judge did that
    inside its device hold (docs/benchmarks.md 1i: up to 1.4 s of ``runner_kill`` on 6.4 GB outputs). Page-locking
    is undone here first, on the caller's thread, whose CUDA context registered it; nothing else is left to use
    the mapping, and nothing waits for the thread."""
    reader._premapped()
    reader.unpin()

    def run() -> None:
        reader.close()
        with contextlib.suppress(OSError):
            os.close(reader.fd)

    thread = threading.Thread(target=run, name="kb-gym-payload-free", daemon=True)
    thread.start()
    return thread
