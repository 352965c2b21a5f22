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

    def close(self) -> None:
        if self._pinned is not None:
            lib = _driver()
            if lib is not None:
                lib.cuMemHostUnregister(ctypes.c_void_p(self._pinned.data_ptr()))
            self._pinned = None
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
        size = os.fstat(self.fd).st_size
        if size < nbytes:  # sealed: it cannot shrink after this check, so mapping nbytes cannot fault
            raise ValueError(f"the runner announced {nbytes:,} bytes in shared memory but wrote {size:,}")
        return self.bytes(nbytes)


# the populated bytes a kept memfd may hold (KB_GYM_PAYLOAD_KEEP_GB); a larger one is closed, its memory freed. Kept
# pages count against the judge tree's memory limit (host_memory.py, 32 GB by default) while the judge holds them;
# 8 GB keeps the largest outputs of the GPU-size problems (6.4 GB)
KEEP_BYTES = int(float(os.environ.get("KB_GYM_PAYLOAD_KEEP_GB", "8")) * (1 << 30))
_SCRUB_STEP = 1 << 30  # bytes zeroed per mapping


class PayloadPool:
    """A judge's memfds, kept from one runner to the next (zeroed between them) instead of made anew for each.

    A fresh memfd has no pages: a runner's first copy of a large output allocates and zeroes every page of it (and
    page-locks it, on a GPU), and each side maps it anew. On this project's 2-core CPU machine writing 2 GB into a
    fresh memfd took 2.98 s and into one whose pages exist 0.35 s; on the H200 a 6.4 GB-output candidate that failed
    its one trial still spent 3.4 s in the correctness stage (docs/benchmarks.md 0t). So a runner's memfd goes back
    to its judge once the runner's whole tree is gone, and the next runner started gets it, with the judge's mapping
    (page-locked where it was) kept too.

    Nothing of one candidate reaches the next through it: every byte the last runner could have written (every
    populated range of the file, found with SEEK_DATA and SEEK_HOLE) is zeroed before it is given out again; a memfd
    the runner sealed beyond the judge's own shrink seal, or whose tree was not seen gone, or holding more than
    KEEP_BYTES of pages (or grown past four times that, sparse or not), is closed instead. ``KB_GYM_PAYLOAD_KEEP=0``
    keeps none (a fresh memfd per runner)."""

    def __init__(self, pin: bool = False, keep: int = 1) -> None:
        self.pin = pin
        self.keep = keep if os.environ.get("KB_GYM_PAYLOAD_KEEP", "1") != "0" else 0
        self._ready: list[PayloadReader] = []
        self._lock = threading.Lock()

    def take(self) -> tuple[PayloadReader | None, bool]:
        """A memfd for a new runner and whether it was kept from an earlier one (None where memfds are missing)."""
        with self._lock:
            if self._ready:
                return self._ready.pop(), True
        fd = create()
        return (PayloadReader(fd, pin=self.pin) if fd is not None else None), False

    def give_back(self, reader: PayloadReader, tree_gone: bool) -> float:
        """Take back a dead runner's memfd: zeroed and kept, or closed. Returns the seconds spent zeroing (0.0 when
        it was closed)."""
        seconds, kept = 0.0, False
        try:
            with self._lock:
                room = len(self._ready) < self.keep
            if (room and tree_gone and _sealed_by_judge_only(reader.fd)
                    and os.fstat(reader.fd).st_size <= 4 * KEEP_BYTES and _populated(reader.fd) <= KEEP_BYTES):
                start = time.perf_counter()
                kept = _scrub(reader.fd)
                seconds = time.perf_counter() - start
        except OSError:
            kept = False
        if kept:
            with self._lock:
                self._ready.append(reader)
        else:
            _close(reader)
        return seconds

    def close(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for reader in ready:
            _close(reader)


def _close(reader: PayloadReader) -> None:
    reader.close()
    try:
        os.close(reader.fd)
    except OSError:
        pass


def _sealed_by_judge_only(fd: int) -> bool:
    """The runner added no seal (F_SEAL_WRITE or FUTURE_WRITE would break the next runner's copy into it)."""
    return fcntl.fcntl(fd, fcntl.F_GET_SEALS) == fcntl.F_SEAL_SHRINK


def _data_ranges(fd: int) -> list[tuple[int, int]]:
    """The populated byte ranges of the file (its holes read as zeros and hold no pages)."""
    size, ranges, offset = os.fstat(fd).st_size, [], 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:  # ENXIO: no data past offset
            break
        end = os.lseek(fd, start, os.SEEK_HOLE)
        ranges.append((start, end))
        offset = end
    return ranges


def _populated(fd: int) -> int:
    return sum(end - start for start, end in _data_ranges(fd))


def _scrub(fd: int) -> bool:
    """Zero every populated byte of the file; False where it could not be mapped for writing."""
    page = mmap.PAGESIZE
    for start, end in _data_ranges(fd):
        start -= start % page
        for lo in range(start, end, _SCRUB_STEP):
            n = min(_SCRUB_STEP, end - lo)
            try:
                region = mmap.mmap(fd, n, mmap.MAP_SHARED | _POPULATE, mmap.PROT_READ | mmap.PROT_WRITE, offset=lo)
            except (OSError, ValueError):
                return False
            view = torch.frombuffer(region, dtype=torch.uint8)
            view.zero_()
            del view
            region.close()
    return True
