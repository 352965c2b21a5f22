"""Large outputs from a runner to its judge through GPU memory the judge owns, instead of the host.

On the H200 every correctness call of a 6.4 GB-output problem moved the whole output from the runner's GPU to a
page-locked memfd and from there to the judge's GPU (0.12 + 0.13 s a call, and 3-5 s a runner to allocate and
page-lock the memfd), with the device lock held and the GPU idle (docs/benchmarks.md 0t, 0u). Legacy CUDA IPC
handles do not cross the runners' PID namespaces, so the judge allocates the buffer with the driver's virtual
memory API (``cuMemCreate``), exports it as a POSIX file descriptor and hands that to the runner at birth, as it does
the memfd; the runner imports and maps it at start-up. The runner copies its outputs into it on the device after
"done" and says "payload" via "device"; the judge copies them out on the device (decode clones) and checks them
against the commitment "done" carried, exactly as for the memfd (payload.py says what a runner can do to shared
bytes and why it gains nothing). The judge zeroes the buffer before the runner starts: memory the driver hands out
may hold what the judge's earlier buffers held.

``KB_GYM_DEVICE_PAYLOAD=1`` turns it on: it has not yet run on a GPU (session 27 wrote it with no device time left);
without it, or where any driver call fails, outputs take the memfd as before.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import torch

from kb_gym.worker.payload import _driver

ENV_FD = "KB_GYM_DEVICE_PAYLOAD_FD"  # the exported handle's number in the runner
ENV_BYTES = "KB_GYM_DEVICE_PAYLOAD_BYTES"  # the buffer's size (the runner maps all of it)
MAX_BYTES = int(float(os.environ.get("KB_GYM_DEVICE_PAYLOAD_MAX_GB", "8")) * (1 << 30))

_ALLOCATION_PINNED, _HANDLE_POSIX_FD, _LOCATION_DEVICE, _ACCESS_READWRITE = 1, 1, 1, 3


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class DriverError(RuntimeError):
    pass


def wanted(device: str, nbytes: int) -> bool:
    """Whether outputs of ``nbytes`` (0: none expected) cross through a device buffer on ``device``."""
    return (0 < nbytes <= MAX_BYTES and device.startswith("cuda")
            and os.environ.get("KB_GYM_DEVICE_PAYLOAD", "0") == "1")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise DriverError(f"{what} failed with CUresult {status}")


def _lib() -> Any:
    lib = _driver()
    if lib is None or not hasattr(lib, "cuMemCreate"):
        raise DriverError("no CUDA driver with the virtual memory API")
    return lib


def _ordinal(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.synchronize(index)  # the device's primary context current on this thread, for the driver calls
    return index


def _prop(ordinal: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type, prop.requestedHandleTypes = _ALLOCATION_PINNED, _HANDLE_POSIX_FD
    prop.location = _Location(_LOCATION_DEVICE, ordinal)
    return prop


class _CudaBytes:
    """What ``torch.as_tensor`` reads a device pointer through (no copy): ``nbytes`` of uint8 at ``ptr``."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


class DeviceBuffer:
    """One mapping of a shareable device allocation: the judge's (``create``), or the runner's (``attach``)."""

    def __init__(self, device: torch.device, handle: int, size: int) -> None:
        self.device, self.handle, self.size = device, handle, size
        self.ptr = 0
        self._tensor: torch.Tensor | None = None

    @classmethod
    def create(cls, device: torch.device, nbytes: int) -> tuple[DeviceBuffer, int]:
        """The judge's buffer of at least ``nbytes`` (zeroed) and a file descriptor the runner imports it by."""
        lib, ordinal = _lib(), _ordinal(device)
        prop = _prop(ordinal)
        granularity = ctypes.c_size_t()
        _check(lib.cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(prop), 0), "granularity")
        step = max(1, granularity.value)
        size = -(-nbytes // step) * step
        handle = ctypes.c_ulonglong()
        _check(lib.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop),
                               ctypes.c_ulonglong(0)), "cuMemCreate")
        buffer = cls(device, handle.value, size)
        try:
            fd = ctypes.c_int(-1)
            _check(lib.cuMemExportToShareableHandle(ctypes.byref(fd), ctypes.c_ulonglong(handle.value),
                                                    _HANDLE_POSIX_FD, ctypes.c_ulonglong(0)), "export")
            buffer._map(ordinal)
            buffer.bytes(size).zero_()
            torch.cuda.synchronize(ordinal)
        except BaseException:
            buffer.close()
            raise
        return buffer, fd.value

    @classmethod
    def attach(cls, device: torch.device, fd: int, nbytes: int) -> DeviceBuffer:
        """The runner's mapping of the buffer the judge exported as ``fd`` (closed here once imported)."""
        lib, ordinal = _lib(), _ordinal(device)
        handle = ctypes.c_ulonglong()
        try:
            _check(lib.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd), _HANDLE_POSIX_FD),
                   "import")
        finally:
            os.close(fd)
        buffer = cls(device, handle.value, nbytes)
        try:
            buffer._map(ordinal)
        except BaseException:
            buffer.close()
            raise
        return buffer

    def _map(self, ordinal: int) -> None:
        lib = _lib()
        ptr = ctypes.c_ulonglong()
        _check(lib.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(self.size), ctypes.c_size_t(0),
                                       ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "reserve")
        self.ptr = ptr.value
        _check(lib.cuMemMap(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size), ctypes.c_size_t(0),
                            ctypes.c_ulonglong(self.handle), ctypes.c_ulonglong(0)), "map")
        access = _AccessDesc(_Location(_LOCATION_DEVICE, ordinal), _ACCESS_READWRITE)
        _check(lib.cuMemSetAccess(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size), ctypes.byref(access),
                                  ctypes.c_size_t(1)), "access")
        self._tensor = torch.as_tensor(_CudaBytes(self.ptr, self.size), device=self.device)

    def bytes(self, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` as a uint8 tensor on the device (a view: nothing copied)."""
        if self._tensor is None or nbytes > self.size:
            raise ValueError(f"{nbytes:,} bytes do not fit the {self.size:,}-byte device buffer")
        return self._tensor[:nbytes]

    def write(self, tensors: list[Any], total: int) -> None:
        """The runner's copy of its outputs into the buffer, finished before it returns."""
        from kb_gym.worker.tensors import flatten_bytes

        buf, offset = self.bytes(total), 0
        for t in tensors:
            n = t.numel() * t.element_size()
            if n:
                if not (isinstance(t, torch.Tensor) and t.device == self.device):
                    raise ValueError("an output not on the buffer's device")
                buf[offset:offset + n].copy_(flatten_bytes(t))
            offset += n
        torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Unmap and release this process's hold on the allocation (the other side keeps its own)."""
        lib = _driver()
        self._tensor = None
        if lib is None:
            return
        if self.ptr:
            torch.cuda.synchronize(self.device)
            lib.cuMemUnmap(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size))
            lib.cuMemAddressFree(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size))
            self.ptr = 0
        if self.handle:
            lib.cuMemRelease(ctypes.c_ulonglong(self.handle))
            self.handle = 0


def from_env(device: str) -> DeviceBuffer | None:
    """The runner's side: the buffer its judge exported, or None (none given, or the driver refused it)."""
    fd, nbytes = os.environ.pop(ENV_FD, ""), os.environ.pop(ENV_BYTES, "")
    if not (fd.isdigit() and nbytes.isdigit()) or not device.startswith("cuda"):
        return None
    try:
        return DeviceBuffer.attach(torch.device(device), int(fd), int(nbytes))
    except (DriverError, OSError, RuntimeError, ValueError):
        return None
