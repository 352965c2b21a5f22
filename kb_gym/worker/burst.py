"""The burst check: a reported event time is believed only as far as the judge's own clock confirms it.

A timed call's time is the event time its runner reports; the judge's envelope around the call overrides it only
where it exceeds the events by more than the tolerance (timing.PairedTiming.tolerance_ms: at least 0.3 ms on a GPU,
3 ms on the CPU). Within that, a runner could report any time at all: round 4 reported 1 us a call for eager GELU
and got 56x (tests/adversarial/test_redteam_round4.py). So after the timing loop, where the tolerance is more than
the drift allowed (DRIFT: all of the claimed median on the CPU, a tenth on a GPU), the candidate's runner runs K
forwards back to back on K fresh input sets (runner.Runner._burst), each output committed before its "done" and a
few drawn afterwards checked against the reference. The judge's clock around the burst, less the harness's own share
of it (building inputs, committing outputs, the pipe), is what the K forwards cost. That share is measured the same
way on a pristine spare running the burst on the reference, where the per-forward event times are trustworthy, right
before each of the candidate's bursts: the load of a 2-core machine changes over seconds (bursts of the same 128
forwards took 80 or 130-140 ms), and two readings taken back to back share it. The median of three such pairs'
differences is what K forwards cost, and their range is the noise allowed for. Where the candidate's forwards cost
more than K times its claimed median plus the drift honest forwards show (DRIFT) and the tolerance, each timed call
is charged the difference. A false time then buys at most that drift and tolerance / K a forward, and K grows as the
claimed time shrinks, up to what time and memory allow.

Back to back, an honest forward costs no more than a timed one (its caches stay warm) on the CPU, and on a GPU where
it is GPU-bound; a launch-bound GPU forward costs its host time, more than the GPU time its shielded events saw.
Such a candidate is charged its host time, flagged ``launch_bound`` rather than ``side_stream``, and its baseline
keeps its shielded GPU time: the speedup stays a lower bound. docs/integrity.md says what is measured where.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kb_gym.worker.clock import median_ci
from kb_gym.worker.runner_client import RunnerProcess
from kb_gym.worker.runner_replies import BurstReply

# A false claim may hide at most this share of the claimed median per forward (the envelope's own share).
RESOLUTION = 0.03
# An honest forward back to back may cost this much more than its timed median before it is charged: forwards drift
# over seconds (on this 2-core CPU the Triton interpreter's ReLU took 62-94 ms a forward from one evaluation to the
# next), and on the CPU the harness's own share differs between two processes by more than a small forward (a
# reference copy of a 0.38 ms GELU read 0.27-0.71 ms a forward back to back). Where the loop's own tolerance is
# already within it, the envelope bounds a false claim as well as a burst would, and no burst runs.
DRIFT = {"cuda": 0.10, "cpu": 1.0}
MAX_FORWARDS = 1024
SECONDS = {"cuda": 0.3, "cpu": 0.6}  # one burst, at the per-forward cost the envelope saw
OUTPUT_BYTES = {"cuda": 1 << 30, "cpu": 256 << 20}  # every forward's outputs are held until the draw
READINGS = 3  # pairs of bursts: the spare's on the reference, then the candidate's right after it
DRAWS = 2  # outputs of each candidate burst checked against the reference after its "done": a candidate that left
# a share f of its forwards undone is found with probability 1 - (1 - f)^6
# The range of the pairs' differences is their noise; the tolerance is this many times that, and at least this
# share of the harness's share itself: building inputs drifts between two processes, and three pairs can agree by
# chance on an offset their range does not show (a clean-clone CI run on this 2-core machine: an honest reference
# copy of ReLU, 0.04 ms a forward, read 48 ms over 512 forwards beyond its share of 276 ms, range 4.9 ms; honest
# pairs here read -12..+37 ms of a ~340 ms share). On the CPU that offset is ~15% of the share.
SPREAD_FACTOR = 1.0
OVERHEAD_SHARE = {"cuda": 0.02, "cpu": 0.15}


def burst_size(claimed_ms: float, tolerance_ms: float, per_forward_ms: float, output_bytes: int,
               device_kind: str, seconds_left: float) -> int:
    """How many forwards the burst needs so that a false claim hides at most RESOLUTION of the claimed median a
    forward: a power of two, capped by time and memory; 0 where the envelope already bounds a false claim within
    the drift allowed (DRIFT) or fewer than two forwards fit."""
    if claimed_ms <= 0 or tolerance_ms <= DRIFT.get(device_kind, DRIFT["cpu"]) * claimed_ms:
        return 0
    want = math.ceil(tolerance_ms / (RESOLUTION * claimed_ms))
    # every burst (the spare's too) and the drawn outputs' references must fit the stage
    bursts = 2 * READINGS + 1
    seconds = min(SECONDS.get(device_kind, 0.3), max(0.0, seconds_left - 2.0) / bursts)
    fits = min(MAX_FORWARDS, int(seconds * 1e3 / max(per_forward_ms, 1e-3)),
               OUTPUT_BYTES.get(device_kind, 256 << 20) // max(1, output_bytes))
    k = min(1 << max(0, math.ceil(math.log2(want))), fits)
    k = 1 << int(math.log2(k)) if k >= 1 else 0
    return k if k >= 2 else 0


def fresh_seeds(n: int) -> list[int]:
    rng = random.SystemRandom()
    return [rng.randrange(1 << 31) for _ in range(n)]


def harness_share(reply: BurstReply) -> float | None:
    """A pristine runner's burst: the judge's clock less the forwards' own event times (None if one is missing)."""
    if any(e is None for e in reply.event_ms):
        return None
    return reply.envelope_ms - sum(e for e in reply.event_ms if e is not None)


@dataclass
class BurstReading:
    """What the candidate's burst showed, beside what its timed calls claimed (``result.correctness.envelope``)."""

    forwards: int
    envelope_ms: float
    overhead_ms: float
    spread_ms: float
    claimed_ms: float  # the median a timed call was charged before the burst
    forward_ms: float  # what one forward cost back to back, by the judge's clock
    tolerance_ms: float  # for the whole burst
    charged_ms: float = 0.0  # added to every timed call
    launch_bound: bool = False

    @property
    def counted(self) -> bool:
        return self.charged_ms > 0

    def to_dict(self) -> dict[str, Any]:
        return {"forwards": self.forwards, "envelope_ms": self.envelope_ms, "overhead_ms": self.overhead_ms,
                "spread_ms": self.spread_ms, "claimed_ms": self.claimed_ms, "forward_ms": self.forward_ms,
                "tolerance_ms": self.tolerance_ms, "charged_ms": self.charged_ms, "counted": self.counted,
                "launch_bound": self.launch_bound}


def read_burst(work_ms: list[float], shares_ms: list[float], forwards: int, claimed_ms: float,
               claimed_host_ms: float | None, loop_tolerance_ms: float, device_kind: str) -> BurstReading:
    """Weigh the candidate's bursts against its claim. ``work_ms``: per pair, the candidate's burst less the
    spare's share read just before it; their median is what ``forwards`` forwards cost by the judge's clock, and
    their range the noise allowed for."""
    work = median_of(work_ms)
    spread = max(work_ms) - min(work_ms)
    share = median_of(shares_ms)
    floor = OVERHEAD_SHARE.get(device_kind, OVERHEAD_SHARE["cpu"]) * share
    tolerance = max(loop_tolerance_ms, SPREAD_FACTOR * spread, floor)
    reading = BurstReading(forwards, work + share, share, spread, claimed_ms, work / forwards, tolerance)
    if work - forwards * claimed_ms * (1.0 + DRIFT.get(device_kind, DRIFT["cpu"])) > tolerance:
        reading.charged_ms = work / forwards - claimed_ms
        # a GPU forward whose host time covers what the burst shows: launch-bound, not hiding work
        reading.launch_bound = (device_kind == "cuda" and claimed_host_ms is not None
                                and claimed_host_ms * forwards + tolerance >= work)
    return reading


def draw(reply: BurstReply) -> list[int]:
    """The forwards whose outputs are checked, drawn after the runner reported the burst done."""
    return sorted(random.SystemRandom().sample(range(len(reply.seeds)), min(DRAWS, len(reply.seeds))))


def median_of(values: list[float]) -> float:
    return median_ci(values)[0] if values else 0.0


def confirm(runner: RunnerProcess, timing: Any, spare_share: Callable[[int], float | None],
            reference: Callable[[int], Any], check: Callable[[Any, Any, int], str | None], output_bytes: int,
            byte_limit: int, device_kind: str, timeout: Callable[[], float]) -> None:
    """Run the bursts on the candidate after its timing loop (``timing``: timing.PairedTiming) and record what
    they showed in ``timing.burst``, or a drawn output that is wrong in ``timing.mismatch``. ``spare_share(K)``:
    the harness's share of a K-forward burst, read now on the pristine spare with the candidate's tree stopped
    (None: none could be had, and nothing is charged); ``reference(seed)``: the reference's outputs for a seed;
    ``check(outputs, reference_outputs, seed)``: why outputs are wrong, or None; ``output_bytes``: the
    reference's outputs' size (what K forwards hold); ``byte_limit``: the most one forward's outputs may announce
    before the judge reads them."""
    if timing.calibration is None or not timing.cand.event_ms or timing.mismatch:
        return
    claimed = median_of(timing.charged_ms())
    per_forward = max(median_of(timing.cand.envelope_ms), median_of(timing.ref.envelope_ms))
    k = burst_size(claimed, timing.tolerance_ms(), per_forward, output_bytes, device_kind, timeout())
    if not k:
        return
    work, shares = [], []
    for _ in range(READINGS):
        share = spare_share(k)
        if share is None:
            return
        reply = runner.burst(fresh_seeds(k), timeout=timeout())
        want = draw(reply)
        for j, outputs in zip(want, runner.burst_outputs(reply, want, timeout(), byte_limit), strict=True):
            why = check(outputs, reference(reply.seeds[j]), reply.seeds[j])
            if why:
                timing.mismatch = f"forward {j + 1} of {k} run back to back after the timed calls: {why}"
                return
        work.append(reply.envelope_ms - share)
        shares.append(share)
    host = median_of(timing.cand.host_ms) if timing.cand.host_ms else None
    timing.burst = read_burst(work, shares, k, claimed, host, timing.tolerance_ms(), device_kind)
