"""The calibrations a device's judges share, kept by the evaluator between them.

A judge measures a problem's per-call harness overhead on a pristine spare (worker/judge_timing.spare_calibration,
0.13-1.7 s of held device time on an H100's GPU-size problems) and keeps it 60 s. With several judges on a device,
each measured its own: on the H100 (docs/benchmarks.md 1g) the two timed candidates of a problem, a second apart on
the two workers, paid a calibration each. A judge now reports a shareable calibration the moment it has one (a
``calibration`` message, under the job's token), and every device grant carries the board's newest ones for the
granted job's problem: a judge granted the device after another judge measured gets that measurement, whereas a list
fixed when its job began (the first version) missed every calibration measured while its candidate loaded.

What the board holds came only from judges' messages (a runner cannot write to a judge's channel: the token); the
judge holds each entry to its own rules before it uses one (judge_timing.adopt_calibration: shareable, not from the
future, newer than its own).
"""

from __future__ import annotations

import hashlib
import math
import threading
from typing import Any

MAX_KEYS = 4096  # problems x paths kept per device, the oldest dropped past it (a long run's many problems)


def problem_hash(problem_code: str) -> str:
    """The first part of a calibration's key (judge_timing.path_key): the problem's code, hashed."""
    return hashlib.sha256(problem_code.encode()).hexdigest()


class CalibrationBoard:
    """The newest calibration per device and key (judge_timing.path_key), reported by the device's judges."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, tuple[Any, ...]], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def keep(self, device: str, entry: Any) -> bool:
        """Keep a judge's entry where it is newer than the one kept for its key; False for a malformed one."""
        try:
            key = tuple(entry["key"])
            measured = float(entry["measured_at"])
            hash(key)
        except (KeyError, TypeError, ValueError):
            return False
        if not key or not isinstance(key[0], str) or not math.isfinite(measured) or not _times(entry):
            return False
        with self._lock:
            kept = self._entries.get((device, key))
            if kept is None or measured > float(kept["measured_at"]):
                self._entries.pop((device, key), None)  # re-inserted last: the dict's order is the eviction order
                self._entries[(device, key)] = dict(entry)
                while len(self._entries) > MAX_KEYS:
                    self._entries.pop(next(iter(self._entries)))
        return True

    def for_problem(self, device: str, problem: str) -> list[dict[str, Any]]:
        """The entries of one problem (its ``problem_hash``) on one device, for a judge's grant."""
        with self._lock:
            return [dict(entry) for (d, key), entry in self._entries.items() if d == device and key[0] == problem]


def _times(entry: dict[str, Any]) -> bool:
    """Whether an entry's overhead and spreads are times (finite, not negative); a judge checks them again when it
    adopts one (judge_timing.plausible)."""
    try:
        values = [float(entry["overhead_ms"]), float(entry["spread_ms"])]
        values += [float(entry[k]) for k in ("cpu_overhead_ms", "cpu_spread_ms") if entry.get(k) is not None]
    except (KeyError, TypeError, ValueError):
        return False
    return all(math.isfinite(v) and v >= 0 for v in values)
