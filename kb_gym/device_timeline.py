"""Which timings shared a device: the evidence that no two kernels were timed on one GPU at once.

Every timed evaluation records, in ``result.worker["timed_at"]``, the wall-clock span of its timing stage
(the judge's settling, the spare's calibration and the paired loop), and its ``hardware`` names the host and
the GPU's UUID, which stays the same whatever ``CUDA_VISIBLE_DEVICES`` the judge's process saw (a Ray actor
sees its one GPU as ``cuda:0``). Grouped by (host, GPU), the spans of a sound run never overlap: the device
lock (``device_lock.py``) or the one worker of a Ray actor made them take turns. Read from EvalResults or
from the rows of a results store, so a run's record is its own proof.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DeviceTimeline:
    """The timing spans of one device, in start order, and the pairs of them that overlapped."""

    device: str  # "host/GPU-uuid", or "host/device" where no UUID was recorded (the CPU)
    spans: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, index of the result)
    overlaps: list[tuple[int, int, float]] = field(default_factory=list)  # (index, index, seconds shared)

    @property
    def busy_s(self) -> float:
        return sum(end - start for start, end, _ in self.spans)


def _fields(result: Any) -> tuple[dict[str, Any], dict[str, Any], str]:
    if isinstance(result, dict):
        return result.get("worker") or {}, result.get("hardware") or {}, str(result.get("device") or "")
    return result.worker or {}, result.hardware or {}, str(result.device or "")


def device_key(result: Any) -> str:
    """The physical device a result was timed on, as one string."""
    _, hardware, device = _fields(result)
    host = hardware.get("host") or "?"
    return f"{host}/{hardware.get('uuid') or device or '?'}"


def timelines(results: list[Any]) -> dict[str, DeviceTimeline]:
    """Per physical device, the timing spans of ``results`` and every pair that overlapped."""
    lines: dict[str, DeviceTimeline] = {}
    for index, result in enumerate(results):
        worker, _, _ = _fields(result)
        span = worker.get("timed_at")
        if not span:
            continue
        key = device_key(result)
        lines.setdefault(key, DeviceTimeline(key)).spans.append((float(span[0]), float(span[1]), index))
    for line in lines.values():
        line.spans.sort()
        for k, (_, end, index) in enumerate(line.spans):
            for other_start, other_end, other in line.spans[k + 1:]:
                if other_start >= end:
                    break  # sorted by start: no later span begins before this one ends
                line.overlaps.append((index, other, min(end, other_end) - other_start))
    return lines


def overlap_report(results: list[Any]) -> str:
    """A line per device: how many timings, their total time, and how many pairs overlapped."""
    lines = timelines(results)
    if not lines:
        return "no timed results (result.worker['timed_at'] is recorded from this version on)"
    out = []
    for key, line in sorted(lines.items()):
        worst = max((s for _, _, s in line.overlaps), default=0.0)
        out.append(f"{key}: {len(line.spans)} timings, {line.busy_s:.1f} s timed, "
                   f"{len(line.overlaps)} overlapping pairs" + (f" (longest {worst:.3f} s)" if line.overlaps else ""))
    return "\n".join(out)
