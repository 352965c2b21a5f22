"""Paired, interleaved timing of the baseline (in the judge) and the candidate (in its runner).

Each pair gets one fresh seed, drawn by the judge when the pair starts: both sides build the same
inputs from it, values no earlier call has seen, so no answer can be cached. The baseline's call
runs here, in a process no candidate code ever ran in. The candidate's call runs in its runner,
which reports its own event time; the judge's clock around the call (from sending the seed to the
runner's "done", the envelope) bounds it. The envelope holds the call's set-up (input building,
cache flush, synchronise) and the pipe, which the same runner measured on the reference through the
same path while it was still pristine. Time the envelope shows beyond that is work the candidate's
events did not see (a
side stream, a lazy output, an event time it reported wrongly): it is added to the candidate's time
and flagged ``side_stream``. Every timed output is checked against the baseline's on the same inputs.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kb_gym.worker.clock import CacheFlusher, median_ci, timed_call
from kb_gym.worker.cpu_clock import load_factor
from kb_gym.worker.inputs import make_inputs
from kb_gym.worker.runner_client import RunnerProcess
from kb_gym.worker.runner_replies import CallReply

_perf_counter = time.perf_counter
# Envelope time beyond this share of the candidate's median (or the absolute floor, whichever is
# larger) is counted as the candidate's: below it, scheduling and pipe jitter are as likely. On the CPU the share is
# wider: the honest Triton ReLU solution under the interpreter (88 ms calls at CPU size) left 2.7-6.3 ms of excess
# (3-7%) in 12 evaluations on this 2-core machine on 2026-12-06, over the 3 ms floor in 11 of them, against
# 1.4-1.95 ms on 2026-12-02: what a long Python-heavy call leaves after its end stamp grows with it. A CPU liar can
# hide up to 10% of its time (1.1x at most; the CPU is not where speedups are earned).
ENVELOPE_TOLERANCE = {"cuda": 0.03, "cpu": 0.10}
# On the CPU, two processes on a few cores wake each other through a pipe: ~0.5 ms of jitter per call.
# On the H200 the runner's per-call overhead (~2.2-8 ms) differs from the spare's calibration by up to 0.26 ms
# for honest candidates (14 evaluations, docs/measurements/runner-smoke-h200-2026-12-01-shield-1ms.log): at a
# 0.02 ms floor a reference copy of a 5 us softmax was charged 0.086 ms and flagged. Hidden work below the
# floor goes uncounted: docs/integrity.md, Open. On the CPU an honest Triton-interpreter kernel left 1.4-3.1 ms of
# excess on this 2-core machine (2026-12-02; 1.4-1.95 ms once the runner held its garbage collection until "done"):
# at a 2 ms floor the Triton ReLU solution was flagged side_stream in 2 of 3 evaluations.
ENVELOPE_FLOOR_MS = {"cuda": 0.3, "cpu": 3.0}
SPREAD_FACTOR = 4.0  # x the median absolute deviation of the pristine runner's own per-call overhead
# A share of that overhead itself: building multi-GB inputs on a loaded CPU drifts by more than its spread.
OVERHEAD_SHARE = {"cuda": 0.02, "cpu": 0.1}
# The CPU clock (cpu_clock.py): the runner tree's CPU time in a call, less the harness's (calibrated on a pristine
# runner), is held to the claim. CPU time does not grow with a loaded host, as the envelope does, so its tolerance
# is far tighter: a share of the claim, a floor, and the calibration's own spread. The share covers the harness's
# work after a forward that left the caches colder than the reference's did: an honest erf-GELU on 512 x 1024 read
# 0.24 ms (19% of its 1.27 ms) over the spare's harness, which ran after a 0.31 ms native GELU (round 25).
CPU_CLOCK_SHARE = 0.25
# What the harness's share read before the candidate loaded misses of its share after (a runner's state changes with
# the candidate's import and trials): honest excesses up to 0.16 ms over a ~0.45 ms harness on a 64 x 256 GELU (1 of
# 12 evaluations over 0.15), and up to 0.33 ms over a 5 ms one on 512 x 1024, on this 2-core host under a second test
# run's load; 0.465 ms over a 4.46 ms one in a whole-suite run (session 31: 10.4%, so the share was 15%); on
# 2026-12-06 an idle run read 0.80 ms over a 5.99 ms one (13.4%) and one honest evaluation was charged 0.925 ms
# over ~6.2 ms (~15%): 20% now. A CPU liar hides at most a fifth of the harness's share (~1.2 ms here).
CPU_CLOCK_FLOOR_MS = 0.2
CPU_CLOCK_HARNESS_SHARE = 0.2


def fresh_seed() -> int:
    """A seed from the operating system: no candidate can predict it from the job's seed."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


@dataclass(frozen=True)
class Calibration:
    """A runner's own per-call overhead inside the judge's envelope (the judge's clock minus the events),
    measured on the reference in a runner that never ran candidate code, and its median absolute deviation."""

    overhead_ms: float
    spread_ms: float
    # time.monotonic() when measured: a problem's calibration is kept for its next candidates (job.py), and its age
    # in a result says whether this evaluation measured its own or was judged against one measured before
    measured_at: float = field(default_factory=time.monotonic, compare=False)
    # the harness's CPU time in a call (a pristine runner's heaviest thread less its event: cpu_clock.Window) and its
    # spread; None: not measured (a GPU, or a call the kernel's accounting could not vouch for)
    cpu_overhead_ms: float | None = None
    cpu_spread_ms: float = 0.0


@dataclass
class Side:
    event_ms: list[float] = field(default_factory=list)
    envelope_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)  # host time inside the call (launching its work)
    cpu: list[Any] = field(default_factory=list)  # cpu_clock.Window of each timed call the kernel vouched for
    cpu_void: int = 0  # timed calls whose CPU time the kernel's accounting could not vouch for (Window.unaccounted)
    # the judge's own thread's CPU time building each timed call's inputs, the runner frozen: the load gauge
    # (cpu_clock.py), on the baseline's side
    gauge_ms: list[float] = field(default_factory=list)


@dataclass
class PairedTiming:
    ref: Side
    cand: Side
    reps: int
    rtt_ms: float
    calibration: Calibration | None  # None: uncalibrated (no spare), the excess is reported, not counted
    device_kind: str
    mismatch: str | None = None
    seconds: float = 0.0
    launches: int = 0
    # the candidate's timed calls (warm-up included) that launched none of its kernels: one launch in the warm-up
    # call, PyTorch after, kept ``fallback`` away while only the stage's total was asked for (round 12)
    unlaunched: int = 0
    # a timed call (warm-up included) wrote to its inputs (RunnerProcess.inputs_mutated): the trials alone were told
    # apart by their seeds (round 31)
    mutated: bool = False
    # an excess over the tolerance was measured again (judge_timing.second_opinion), and the whole loop timed again,
    # the run with the smaller excess kept (judge_timing.retime)
    second_calibration: bool = False
    retimed: bool = False
    burst: Any = None  # burst.BurstReading: what K forwards back to back cost by the judge's clock (burst.py)
    probe: Any = None  # probe_check.ProbeReading: the runner's GPU time as a pristine probe saw it (probe_check.py)
    probe_note: str = ""  # why no probe pass ran where one should have
    probe_pending: Any = None  # probe_check.AfterExit: passes to read again once the candidate's tree is gone
    # the harness's CPU time per call and its spread measured in the candidate's own runner before it loaded the
    # candidate (harness_cpu): read in place of the spare's, another process's (cpu_clock.py)
    harness_cpu: tuple[float, float] | None = None
    # the judge's gauge (its own thread's CPU time building this path's inputs) beside the share's reading in the
    # candidate's runner: held to the loop's (Side.gauge_ms), it scales the share by the load since (cpu_clock.py)
    harness_gauge: float | None = None

    @property
    def harness_load(self) -> float:
        """How much slower the harness's kind of work ran in the loop than when its share was read (least over
        the loop's calls, as the clock's excess is: cpu_clock.load_factor)."""
        if self.harness_cpu is None or not self.ref.gauge_ms:
            return 1.0
        return load_factor(self.harness_gauge, min(self.ref.gauge_ms))

    def _harness_cpu(self) -> tuple[float, float] | None:
        if self.harness_cpu is not None:
            share = self.harness_cpu
        else:
            cal = self.calibration
            share = (cal.cpu_overhead_ms, cal.cpu_spread_ms) if cal and cal.cpu_overhead_ms is not None else None
        return (share[0] * self.harness_load, share[1]) if share else None

    def excess_ms(self) -> float:
        """Median over calls of the candidate's envelope beyond its events and the runner's own per-call
        overhead (measured on the reference while the runner was pristine): work its events did not cover."""
        if not self.cand.event_ms:
            return 0.0
        overhead = self.calibration.overhead_ms if self.calibration else 0.0
        gaps = [(ce - cv) - overhead for ce, cv in zip(self.cand.envelope_ms, self.cand.event_ms, strict=False)]
        return median_ci(gaps)[0]

    def tolerance_ms(self) -> float:
        """How much envelope beyond the calibrated overhead is put down to noise, not hidden work."""
        cal = self.calibration or Calibration(0.0, 0.0)
        med_events = median_ci(self.cand.event_ms)[0] if self.cand.event_ms else 0.0
        # Where building the inputs is slow and uneven (multi-GB inputs on the CPU), the envelope cannot be read
        # more finely than the calibration's own spread: the tolerance grows with it (reported beside it).
        return max(ENVELOPE_TOLERANCE.get(self.device_kind, 0.03) * med_events,
                   ENVELOPE_FLOOR_MS.get(self.device_kind, 0.5),
                   SPREAD_FACTOR * cal.spread_ms, OVERHEAD_SHARE.get(self.device_kind, 0.1) * cal.overhead_ms)

    def hidden_work(self) -> bool:
        """The candidate's envelope shows work its events did not cover (counted only when calibrated)."""
        return self.calibration is not None and bool(self.cand.event_ms) and self.excess_ms() > self.tolerance_ms()

    def cpu_excess_ms(self) -> float | None:
        """Median over calls of the tree's CPU floor beyond the claim and the harness's share (cpu_clock.py); None
        where not read (a GPU, an uncalibrated loop) or where one call could not be vouched for."""
        harness = self._harness_cpu()
        if (harness is None or self.calibration is None or self.cand.cpu_void
                or len(self.cand.cpu) != len(self.cand.event_ms) or not self.cand.event_ms):
            return None
        # The least over calls: CPU time only grows under a neighbour's load (shared caches and memory), while every
        # call must do its forward's work on fresh inputs, so the least-disturbed call shows what the claim left out.
        return min(w.floor_ms(harness[0]) - e for w, e in zip(self.cand.cpu, self.cand.event_ms, strict=True))

    def cpu_tolerance_ms(self) -> float:
        harness = (self._harness_cpu() or (0.0, 0.0))[0]
        med_events = median_ci(self.cand.event_ms)[0] if self.cand.event_ms else 0.0
        return max(CPU_CLOCK_SHARE * med_events, CPU_CLOCK_FLOOR_MS, CPU_CLOCK_HARNESS_SHARE * harness)

    def cpu_counted(self) -> bool:
        """The tree's CPU time shows work the claim did not cover."""
        excess = self.cpu_excess_ms()
        return excess is not None and excess > self.cpu_tolerance_ms()

    def cpu_unverified(self) -> bool:
        """A calibrated CPU loop with a timed call the kernel's accounting could not vouch for (a task made and gone
        inside it): its claim stands unconfirmed."""
        return self.calibration is not None and self._harness_cpu() is not None and self.cand.cpu_void > 0

    def charged_ms(self) -> list[float]:
        """The candidate's time per timed call: its events, plus the envelope's or the CPU clock's excess (the
        larger, where counted: both see the same hidden work), plus the burst's and the probe's charges where they
        showed its forwards cost more than it claimed."""
        extra = max(self.excess_ms() if self.hidden_work() else 0.0,
                    (self.cpu_excess_ms() or 0.0) if self.cpu_counted() else 0.0)
        extra += self.burst.charged_ms if self.burst else 0.0
        extra += self.probe.charged_ms if self.probe else 0.0
        return [c + extra for c in self.cand.event_ms]

    def resolution_ms(self) -> float:
        """The least time a claim is credited as: the absolute floor of the clock that checked it (the probe's on a
        GPU, the CPU clock's on the CPU). Under that floor a false claim can hide all its work and claim any time at
        all (round 4), so in the speedup both sides' times are raised to it, the baseline's too (a reference copy
        still reads 1): a lie under it gains at most what a lie of the floor's size gains over it, 2x, as above it.
        0 where only the envelope checked the claim (its floor, 0.3 ms on a GPU, is not applied: docs/integrity.md,
        Open)."""
        probe = self.probe.resolution_ms if self.probe else 0.0
        cpu = CPU_CLOCK_FLOOR_MS if self.cpu_excess_ms() is not None else 0.0
        return max(probe, cpu)

    def summary(self, cached_ref: tuple[float, float, float] | None = None) -> dict[str, Any]:
        """Medians and intervals; ``cached_ref`` (median, low, high) stands in for an untimed baseline."""
        ref_med, ref_lo, ref_hi = cached_ref or median_ci(self.ref.event_ms)
        out: dict[str, Any] = {"ref_runtime_ms": ref_med, "ref_runtime_ci_ms": [ref_lo, ref_hi],
                               "timing_reps": self.reps,
                               "ref_host_runtime_ms": median_ci(self.ref.host_ms)[0] if self.ref.host_ms else None}
        if not self.cand.event_ms:
            return out
        excess, tolerance = self.excess_ms(), self.tolerance_ms()
        cal = self.calibration or Calibration(0.0, 0.0)
        hidden = self.hidden_work()
        cand = self.charged_ms()
        med, lo, hi = median_ci(cand)
        floor = self.resolution_ms()

        def ratio(r: float, c: float) -> float:
            return max(r, floor) / max(c, floor) if max(c, floor) > 0 else math.nan

        if cached_ref is None:
            ratios = [ratio(r, c) for r, c in zip(self.ref.event_ms, cand, strict=False) if max(c, floor) > 0]
            _, s_lo, s_hi = median_ci(ratios)
        else:  # cached baseline: the interval comes from both medians' intervals
            s_lo, s_hi = ratio(ref_lo, hi), ratio(ref_hi, lo)
        out.update(runtime_ms=med, runtime_ci_ms=[lo, hi],
                   speedup=ratio(ref_med, med) if max(med, floor) > 0 else None,
                   speedup_ci=[s_lo, s_hi],
                   host_runtime_ms=median_ci(self.cand.host_ms)[0] if self.cand.host_ms else None,
                   envelope={"excess_ms": excess, "tolerance_ms": tolerance, "rtt_ms": self.rtt_ms,
                             # times under it were credited as it in the speedup (resolution_ms)
                             "resolution_ms": floor,
                             "overhead_ms": cal.overhead_ms, "overhead_spread_ms": cal.spread_ms,
                             "calibrated": self.calibration is not None, "counted": hidden,
                             "calibration_age_s": (time.monotonic() - self.calibration.measured_at
                                                   if self.calibration else None),
                             "second_calibration": self.second_calibration, "retimed": self.retimed,
                             "cpu_clock": self._cpu_summary(),
                             "burst": self.burst.to_dict() if self.burst else None,
                             "probe": (self.probe.to_dict() if self.probe
                                       else {"skipped": self.probe_note} if self.probe_note else None)})
        return out


    def _cpu_summary(self) -> dict[str, Any] | None:
        if not self.cand.cpu and not self.cand.cpu_void:
            return None
        harness = self._harness_cpu()
        return {"excess_ms": self.cpu_excess_ms(), "tolerance_ms": self.cpu_tolerance_ms(),
                "counted": self.cpu_counted(),
                "floor_ms": median_ci([w.floor_ms(harness[0]) for w in self.cand.cpu])[0]
                if self.cand.cpu and harness else None,
                "harness_ms": harness[0] if harness else None, "harness_spread_ms": harness[1] if harness else None,
                "harness_of": "own runner" if self.harness_cpu is not None else "spare" if harness else None,
                "harness_load": self.harness_load,
                "void_calls": self.cand.cpu_void, "unverified": self.cpu_unverified()}


def gauged_inputs(ref_mod: Any, seed: int, device: torch.device, dtype: torch.dtype, widen: bool = False,
                  gauge_ms: list[float] | None = None) -> list[Any]:
    """The call's inputs, built in the judge's thread; its CPU time for them appended to ``gauge_ms`` (the CPU
    clock's load gauge, cpu_clock.py) where given."""
    began = time.thread_time_ns()
    inputs = make_inputs(ref_mod, seed, device, dtype, widen=widen)
    if gauge_ms is not None:
        gauge_ms.append((time.thread_time_ns() - began) / 1e6)
    return inputs


def _base_call(fn: Callable[..., Any], ref_mod: Any, seed: int, device: torch.device, dtype: torch.dtype,
               flusher: CacheFlusher, side: Side | None, widen: bool = False) -> Any:
    t0 = _perf_counter()
    inputs = gauged_inputs(ref_mod, seed, device, dtype, widen, side.gauge_ms if side is not None else None)
    out, ms, host = timed_call(fn, inputs, device, flusher)
    envelope = (_perf_counter() - t0) * 1e3
    if side is not None:
        side.event_ms.append(ms)
        side.envelope_ms.append(envelope)
        side.host_ms.append(host)
    return out


def reference_outputs(ref_model: Any, ref_mod: Any, seed: int, device: torch.device, dtype: torch.dtype,
                       runner: RunnerProcess, widen: bool = False, gauge_ms: list[float] | None = None) -> Any:
    """The reference's outputs for checking a candidate timed against a cached baseline: computed with the
    runner frozen and finished on the GPU before the candidate's call starts. Left queued, they ran inside
    the candidate's events (H200, "rl" preset: an honest 9.9 ms matmul measured 11.3 ms, a 2.3 ms
    convolution 3.6 ms, both flagged side_stream)."""
    with runner.frozen(), torch.no_grad():
        out = ref_model(*gauged_inputs(ref_mod, seed, device, dtype, widen, gauge_ms))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return out


def calibrate_overhead(runner: RunnerProcess, base_fn: Callable[..., Any], ref_mod: Any, device: torch.device,
                       dtype: torch.dtype, flusher: CacheFlusher, seeds: list[int],
                       timeout: float, chunk_bytes: int = 0, widen: bool = False) -> Calibration | None:
    """The runner's own per-call overhead (the judge's clock minus the events), measured on the reference
    while the runner is pristine, through the very path a candidate's timed call takes and interleaved with
    the judge's baseline calls as in the timing loop (a process woken after the other one ran is slower to
    answer than one called back to back). None when no call reported an event time."""
    gaps, cpu_gaps = [], []
    for k, seed in enumerate(seeds):
        # Frozen while the baseline runs, as the candidate's runner is in the timing loop: a process stopped
        # and continued wakes colder (the H200: a reference copy of a 5 us softmax paid ~0.09 ms more per call
        # than a spare that was never stopped, and its envelope counted that as hidden work: speedup 0.055).
        with runner.frozen():
            _base_call(base_fn, ref_mod, seed, device, dtype, flusher, None, widen)
        # Outputs and all, as a candidate's call: copying them out leaves the host as cold for the next call.
        reply = runner.call(seed, timeout=timeout, byte_limit=1 << 40, timed=True, target="reference",
                            chunk_bytes=chunk_bytes, widen=widen)
        if k >= 2 and reply.event_ms is not None:  # the first two warm the path up
            gaps.append(reply.envelope_ms - reply.event_ms)
            if reply.cpu is not None and not reply.cpu.unaccounted:
                cpu_gaps.append(reply.cpu.heaviest_thread_ms - reply.event_ms)  # a pristine runner: one thread
    if not gaps:
        return None
    overhead = median_ci(gaps)[0]
    cpu = min(cpu_gaps) if cpu_gaps and len(cpu_gaps) == len(gaps) else None  # as harness_cpu reads its own
    return Calibration(overhead, median_ci([abs(g - overhead) for g in gaps])[0], cpu_overhead_ms=cpu,
                       cpu_spread_ms=median_ci([g - cpu for g in cpu_gaps])[0] if cpu is not None else 0.0)


def harness_cpu(runner: RunnerProcess, seeds: list[int], timeout: float, widen: bool = False,
                build: Callable[[int], Any] | None = None) -> tuple[float, float] | None:
    """The harness's CPU time per timed call (median, and its median absolute deviation) in ``runner`` while it is
    still pristine, prepared with the reference model: its heaviest thread's time less the forward's event, on
    timed reference calls (the first two warm up). Another process, the spare, read 0.3-2 ms a call off on 2 MB
    tensors on a 2-core host (round 25). None where a call had no reading the kernel could vouch for.

    ``build``: called after each call past the warm-up, where the judge gauges its own input builds
    (gauged_inputs, the load gauge of cpu_clock.py): after a call, as the loop's baseline builds are (back to back,
    the same builds read ~11% less: warmer caches)."""
    gaps = []
    for k, seed in enumerate(seeds):
        reply = runner.call(seed, timeout=timeout, byte_limit=1 << 40, timed=True, target="reference", widen=widen)
        if k < 2:
            continue
        if build is not None:
            build(seed)
        if reply.event_ms is None or reply.cpu is None or reply.cpu.unaccounted:
            return None
        gaps.append(reply.cpu.heaviest_thread_ms - reply.event_ms)
    if not gaps:
        return None
    least = min(gaps)  # a neighbour's load only adds CPU time: the least-disturbed call is the harness's own cost
    return least, median_ci([g - least for g in gaps])[0]


def time_pair(base_fn: Callable[..., Any] | None, ref_model: Any, runner: RunnerProcess | None, ref_mod: Any,
              device: torch.device, dtype: torch.dtype, flusher: CacheFlusher,
              check: Callable[[Any, Any, int], str | None] | None, *, warmup: int, min_reps: int, max_reps: int,
              target_rel_ci: float, max_seconds: float, call_timeout: Callable[[], float],
              byte_limit: int, calibration: Calibration | None = None, chunk_bytes: int = 0,
              widen: bool = False, harness_cpu: tuple[float, float] | None = None,
              harness_gauge: float | None = None) -> PairedTiming:
    """Interleave baseline and candidate calls (alternating which goes first) until the speedup's
    interval is tight enough, the repetition cap, or the time budget.

    ``base_fn`` None: a cached baseline; the reference's outputs are still computed (untimed) to
    check every timed candidate output. ``chunk_bytes``: the candidate's outputs are spot-checked on chunks
    of that size (spot_check.py), the calibration having been measured the same way. ``runner`` None: a
    baseline-only job (fills the cache). ``widen``: every call's inputs are the widened trial's kind (3 * randn), on a
    problem whose own inputs make the output its input (correctness._widened_trial).
    """
    began = _perf_counter()
    ref, cand = Side(), Side()
    timed_base = base_fn is not None
    timing = PairedTiming(ref, cand, 0, runner.rtt_ms if runner is not None else 0.0, calibration, device.type,
                          # measured on whole outputs: not the path of spot-checked outputs, whose share the spare reads
                          # on that path
                          harness_cpu=harness_cpu if not chunk_bytes else None, harness_gauge=harness_gauge)

    def candidate(seed: int, side: Side | None) -> CallReply:
        assert runner is not None
        reply = runner.call(seed, timeout=call_timeout(), byte_limit=byte_limit, timed=True, chunk_bytes=chunk_bytes,
                            widen=widen)
        timing.launches += reply.launches
        timing.unlaunched += reply.launches == 0
        timing.mutated = runner.inputs_mutated(call_timeout()) or timing.mutated  # outside the call's clock
        if side is not None:
            side.event_ms.append(reply.event_ms if reply.event_ms is not None else reply.envelope_ms)
            side.envelope_ms.append(reply.envelope_ms)
            if reply.host_ms is not None:
                side.host_ms.append(reply.host_ms)
            if reply.cpu is not None:
                if reply.cpu.unaccounted:
                    side.cpu_void += 1
                else:
                    side.cpu.append(reply.cpu)
        return reply

    for _ in range(warmup):
        seed = fresh_seed()
        if timed_base:
            _base_call(base_fn, ref_mod, seed, device, dtype, flusher, None, widen)
        if runner is not None:
            candidate(seed, None)
    deadline = began + max_seconds
    for i in range(max_reps):
        seed = fresh_seed()
        outs: list[Any] = [None, None]
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            if side == 0:
                if timed_base:
                    with runner.frozen() if runner is not None else contextlib.nullcontext():
                        outs[0] = _base_call(base_fn, ref_mod, seed, device, dtype, flusher, ref, widen)
                elif runner is not None:  # a cached baseline: its outputs still check the candidate's
                    outs[0] = reference_outputs(ref_model, ref_mod, seed, device, dtype, runner, widen, ref.gauge_ms)
            elif runner is not None:
                outs[1] = candidate(seed, cand).outputs
        timing.reps += 1
        if check is not None and runner is not None:
            mismatch = check(outs[1], outs[0], seed)
            if mismatch:
                timing.mismatch = f"timing call {i + 1}: {mismatch}"
                break
        del outs
        if timing.reps >= min_reps and (timing.reps % 5 == 0 or _perf_counter() > deadline):
            if _perf_counter() > deadline or _tight(ref, cand, target_rel_ci, timed_base, runner is not None):
                break
    timing.seconds = _perf_counter() - began
    return timing


def _tight(ref: Side, cand: Side, target: float, timed_base: bool, has_cand: bool) -> bool:
    if not (timed_base and has_cand):
        med, lo, hi = median_ci(cand.event_ms if has_cand else ref.event_ms)
        return med > 0 and (hi - lo) / 2 <= target * med
    ratios = [r / c for r, c in zip(ref.event_ms, cand.event_ms, strict=False) if c > 0]
    med, lo, hi = median_ci(ratios)
    return med > 0 and (hi - lo) / 2 <= target * med
