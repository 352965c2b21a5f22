"""Paired, interleaved timing of the baseline and the candidate in one worker.

Per call: fresh clones of one of several input sets, a cold L2 (a buffer larger than the cache is
overwritten and the device synchronised before the clock starts), a start event, the call, an end
event, a device-wide synchronise. Events give the time on the caller's stream; the host clock
around the synchronise also sees work the call left on other streams. If the candidate's host
time exceeds its event time by more than the baseline's does, it hid work on another stream: it
is flagged ``side_stream`` and both sides are compared by host time instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

_perf_counter = time.perf_counter
_synchronize = torch.cuda.synchronize
_Event = torch.cuda.Event


def median_ci(values: Sequence[float], z: float = 1.96) -> tuple[float, float, float]:
    """Median and a distribution-free ~95% interval from order statistics."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    mid = n // 2
    med = xs[mid] if n % 2 else 0.5 * (xs[mid - 1] + xs[mid])
    half = z * math.sqrt(n) / 2
    lo = xs[max(0, math.floor(n / 2 - half))]
    hi = xs[min(n - 1, math.ceil(n / 2 + half) - 1)]
    return med, lo, hi


class CacheFlusher:
    """Overwrites a buffer twice the size of the last-level cache to evict inputs and weights."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20) or (64 << 20)
            self.buffer = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.float32, device=device)
        else:
            self.buffer = None

    def flush(self) -> None:
        if self.buffer is not None:
            self.buffer.fill_(1.0)


@dataclass
class TimingSamples:
    event_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)


@dataclass
class TimingResult:
    ref_ms: list[float]
    cand_ms: list[float]
    reps: int
    side_stream: bool
    mismatch: str | None = None
    seconds: float = 0.0

    def summary(self, cached_ref: tuple[float, float, float] | None = None) -> dict[str, Any]:
        """Medians and intervals; ``cached_ref`` (median, low, high) stands in for an untimed baseline."""
        ref_med, ref_lo, ref_hi = cached_ref or median_ci(self.ref_ms)
        out: dict[str, Any] = {"ref_runtime_ms": ref_med, "ref_runtime_ci_ms": [ref_lo, ref_hi],
                               "timing_reps": self.reps}
        if self.cand_ms:
            med, lo, hi = median_ci(self.cand_ms)
            if self.ref_ms:
                ratios = [r / c for r, c in zip(self.ref_ms, self.cand_ms, strict=False) if c > 0]
                _, s_lo, s_hi = median_ci(ratios)
            else:  # cached baseline: the interval comes from both medians' intervals
                s_lo, s_hi = (ref_lo / hi if hi > 0 else math.nan), (ref_hi / lo if lo > 0 else math.nan)
            out.update(runtime_ms=med, runtime_ci_ms=[lo, hi],
                       speedup=(ref_med / med) if med > 0 else None, speedup_ci=[s_lo, s_hi])
        return out


class Timer:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flusher = CacheFlusher(device)
        self.is_cuda = device.type == "cuda"
        self.before_call: Callable[[], None] | None = None  # runs before each timed call, outside its timing

    def call(self, fn: Callable[..., Any], inputs: list[Any]) -> tuple[Any, float, float]:
        """Run ``fn(*inputs)`` once on a cold cache; return (output, event ms, host ms)."""
        if self.before_call is not None:
            self.before_call()
        if self.is_cuda:
            self.flusher.flush()
            _synchronize(self.device)
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            t0 = _perf_counter()
            start.record()
            out = fn(*inputs)
            end.record()
            _synchronize(self.device)
            host = (_perf_counter() - t0) * 1e3
            return out, start.elapsed_time(end), host
        t0 = _perf_counter()
        out = fn(*inputs)
        host = (_perf_counter() - t0) * 1e3
        return out, host, host

    def time_pair(self, ref_fn: Callable[..., Any] | None, cand_fn: Callable[..., Any] | None,
                  input_sets: list[list[Any]], clone: Callable[[list[Any]], list[Any]],
                  check: Callable[[Any, Any, int], str | None] | None, *, warmup: int, min_reps: int,
                  max_reps: int, target_rel_ci: float, max_seconds: float) -> TimingResult:
        """Interleave baseline and candidate calls (alternating which goes first) until the
        speedup's interval is tight enough, the repetition cap, or the time budget.

        Either side may be None: baseline-only jobs fill the cache; candidate-only jobs compare
        against a cached baseline. ``check(cand_out, ref_out, input_set_index)`` sees every timed
        candidate output (``ref_out`` is None when the baseline is not timed).
        """
        began = _perf_counter()
        sides = [(ref_fn, TimingSamples()), (cand_fn, TimingSamples())]
        ref, cand = sides[0][1], sides[1][1]
        for i in range(warmup):
            for fn, _ in sides:
                if fn is not None:
                    self.call(fn, clone(input_sets[i % len(input_sets)]))
        mismatch = None
        reps = 0
        deadline = began + max_seconds
        for i in range(max_reps):
            k = i % len(input_sets)
            outs: list[Any] = [None, None]
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                fn, samples = sides[side]
                if fn is not None:
                    outs[side] = self._timed(fn, clone(input_sets[k]), samples)
            reps += 1
            if check is not None and cand_fn is not None:
                mismatch = check(outs[1], outs[0], k)
                if mismatch:
                    mismatch = f"timing call {i + 1}: {mismatch}"
                    break
            del outs
            if reps >= min_reps and (reps % 5 == 0 or _perf_counter() > deadline):
                if _perf_counter() > deadline or self._tight(ref, cand, target_rel_ci):
                    break
        side_stream = self._side_stream(ref, cand) if cand_fn is not None else False
        pick = (lambda s: s.host_ms) if side_stream else (lambda s: s.event_ms)
        return TimingResult(pick(ref), pick(cand), reps, side_stream, mismatch, _perf_counter() - began)

    def _timed(self, fn: Callable[..., Any], inputs: list[Any], samples: TimingSamples) -> Any:
        out, event_ms, host_ms = self.call(fn, inputs)
        samples.event_ms.append(event_ms)
        samples.host_ms.append(host_ms)
        return out

    @staticmethod
    def _tight(ref: TimingSamples, cand: TimingSamples, target: float) -> bool:
        if not cand.event_ms or not ref.event_ms:
            med, lo, hi = median_ci(ref.event_ms or cand.event_ms)
            return med > 0 and (hi - lo) / 2 <= target * med
        ratios = [r / c for r, c in zip(ref.event_ms, cand.event_ms, strict=False) if c > 0]
        med, lo, hi = median_ci(ratios)
        return med > 0 and (hi - lo) / 2 <= target * med

    @staticmethod
    def _gap(samples: TimingSamples) -> float:
        return median_ci([h - e for h, e in zip(samples.host_ms, samples.event_ms, strict=False)])[0]

    def _side_stream(self, ref: TimingSamples, cand: TimingSamples) -> bool:
        if not self.is_cuda or not cand.event_ms:
            return False
        # Without a timed baseline (cached), its host-minus-event gap is taken as zero.
        ref_gap = self._gap(ref) if ref.event_ms else 0.0
        cand_gap = self._gap(cand)
        cand_event = median_ci(cand.event_ms)[0]
        return cand_gap - ref_gap > max(0.05, 0.5 * cand_event)
