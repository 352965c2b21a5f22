"""Which processes kept a GPU busy, and when: NVML's per-process utilisation, read by a judge.

A neighbour stopped for another job's measurement (neighbours.py) stops only its host threads: GPU work it queued
before the stop runs on through the measurement (the probe check then voids the sibling's passes, and in a GRPO group
the saboteur's advantage rises). NVML names the process whose context was busy in each of its sample periods, under
the PID the caller sees it by (docs/benchmarks.md 1i: a runner in its own PID namespace, from inside the container), so
the judge of a stopped runner can tell whether that runner's work ran on after its stop, and kill it (its context and
the queue with it).

The samples are coarse: one per process per sample period (1/6 s to 1 s, by the product), saying that the process had
some utilisation during the period that ended at the sample's time. So work counts as run after the stop only where a
period that began ``GRACE_S`` after the stop shows it: kernels in flight at the stop (an honest load's parameter
initialisation, milliseconds) never reach that far, and what a saboteur still gets is the grace and one period of
queued work, against an unbounded queue before.

Attribution is trusted only where NVML names this judge's own context under ``os.getpid()`` (``GpuActivity.open``):
a judge runs in a PID namespace of its own, so a driver that reported the host's PIDs would name other processes by
numbers that mean something else here.
"""

from __future__ import annotations

import ctypes
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

GRACE_S = 0.25  # after the stop: what a stopped runner's work in flight may still run (an honest one: milliseconds)
DEFAULT_PERIOD_S = 1.0  # the longest sample period NVML documents: taken where the device's own cannot be read
ENV = "KB_GYM_GPU_OWNER_CHECK"  # "0": off (the pause as before: a stopped runner's queued work is not looked at)


@dataclass(frozen=True)
class Sample:
    pid: int
    sm: int  # percent of the period in which the process had a kernel running
    t_us: int  # the end of the period, on the host's clock (time.time() microseconds)


class Source(Protocol):
    """What GpuActivity reads (NVML on a GPU; a stand-in in the tests)."""

    def samples(self, since_us: int) -> list[Sample]: ...

    def context_pids(self) -> set[int]: ...

    def period_s(self) -> float: ...


class NvmlSource:
    """NVML's view of one GPU, found by its UUID (CUDA_VISIBLE_DEVICES renumbers devices; NVML does not)."""

    def __init__(self, device: torch.device) -> None:
        import pynvml

        self._nvml = pynvml
        torch.empty(1, device=device)  # this process's own context, which ``GpuActivity.open`` looks for
        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        try:
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except (TypeError, ctypes.ArgumentError):  # bindings that take the bytes only
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())

    def samples(self, since_us: int) -> list[Sample]:
        try:
            found = self._nvml.nvmlDeviceGetProcessUtilization(self.handle, since_us)
        except self._nvml.NVMLError_NotFound:  # no sample since then
            return []
        return [Sample(int(s.pid), int(s.smUtil), int(s.timeStamp)) for s in found]

    def context_pids(self) -> set[int]:
        return {int(p.pid) for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)}

    def period_s(self) -> float:
        """The device's utilisation sample period, from the spacing of its recent samples."""
        _, found = self._nvml.nvmlDeviceGetSamples(self.handle, self._nvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        stamps = sorted(int(s.timeStamp) for s in found)
        steps = [b - a for a, b in zip(stamps, stamps[1:], strict=False) if b > a]
        return statistics.median(steps) / 1e6 if len(steps) >= 3 else DEFAULT_PERIOD_S


class GpuActivity:
    """One judge's reading of its GPU's per-process samples (``busy_after``)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        # the longest period plausible, so that a period's start is never placed later than it was
        self.period_s = min(max(_or_default(source.period_s), 1 / 6), DEFAULT_PERIOD_S)

    @classmethod
    def open(cls, device: torch.device, source: Source | None = None) -> tuple[GpuActivity | None, str]:
        """The reading for ``device`` and "on", or None and why not: not a GPU, turned off, no NVML, or NVML does not
        name this process's own context by ``os.getpid()`` (called once the judge has its CUDA context)."""
        if os.environ.get(ENV, "1") == "0":
            return None, "off"
        if device.type != "cuda" and source is None:
            return None, "not a GPU"
        try:
            source = source if source is not None else NvmlSource(device)
            pids = source.context_pids()
        except Exception as exc:  # noqa: BLE001 - no NVML here (its module, its library, the device): no check
            return None, f"no NVML: {type(exc).__name__}: {str(exc)[:200]}"
        if os.getpid() not in pids:
            return None, f"NVML does not name this judge's context by its PID here (it names {sorted(pids)[:8]})"
        return cls(source), "on"

    def busy_after(self, pids: Iterable[int], stopped_at: float, since_us: int) -> tuple[float, int]:
        """How long after ``stopped_at`` (time.time()) one of ``pids`` was seen busy, by the samples taken after
        ``since_us`` (0.0 where none was, or only in periods that began within GRACE_S of it), and the last sample's
        time (the next call's ``since_us``)."""
        wanted = set(pids)
        late, last = 0.0, since_us
        for s in self.source.samples(since_us):
            last = max(last, s.t_us)
            began = s.t_us / 1e6 - self.period_s  # the earliest the work it saw could have run
            if s.pid in wanted and s.sm > 0 and began - stopped_at > GRACE_S:
                late = max(late, s.t_us / 1e6 - stopped_at)
        return late, last


def _or_default(read: Any) -> float:
    try:
        value = float(read())
    except Exception:  # noqa: BLE001 - the device's samples unreadable: the longest period documented
        return DEFAULT_PERIOD_S
    return value if value > 0 else DEFAULT_PERIOD_S
