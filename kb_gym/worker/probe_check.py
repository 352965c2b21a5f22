"""The probe check: a GPU timed call's claim held to what a pristine probe saw of the runner's GPU time.

Round 4's hole: a timed call's time is the event time its runner reports, and the judge's envelope overrides it only
beyond a tolerance of at least 0.3 ms on a GPU (timing.PairedTiming.tolerance_ms), so a forward shorter than that
could claim any time at all. The runner is the candidate's process; its events are the candidate's to rewrite.

After the timing loop, where the claimed median is under a time slice (MAX_CLAIM_MS), the judge starts its probe
(probe_clock.py): from then on every other context's GPU time shows as gaps in the probe's readings. It runs
SPARE_CALLS timed calls of the reference in the pristine spare (the candidate's tree stopped), then CALLS timed
calls of the candidate, each between two marks, every candidate output checked against the reference. A window
runs from the seed sent until the outputs are the judge's: received whole (the runner hashes nothing, so no faster
hash buys time: whatever it computes until then is in the window), or, for outputs over 64 MB drawn in chunks
after "done", until "done", whose chunk hashes commit them. In a probe call neither runner flushes the cache, and
only the spare shields its launches (clock.probe_call), so the runner's window holds the harness's GPU work
(inputs built, outputs copied out) and the forward, nothing the candidate could leave out to look faster. The spare's window less its forward's events and its shield (a pristine runner's
numbers) is the harness's share; a candidate window less that share is what its forward cost the GPU. Where the
median of those exceeds the claim by more than the tolerance, every timed call is charged the difference and the
result flagged ``side_stream``; a second pass must show it too (another judge's runner starting up on the device
outside the lock shows as gaps as well), and the smaller charge stands.

Each gap carries a context switch (~2 us on the H200); a candidate whose forward's kernels reach the GPU one by one
shows more gaps than the spare's shielded reference, and the switches beyond the spare's are not charged. A runner
can make the probe see more (its own work, or another process's), never less: there is no way to hide GPU time
from a context that is waiting for the GPU. What the probe cannot see: work on engines that do not preempt a
compute context (a copy engine's transfers), and any work while MPS shares the GPU between contexts; the spare's
readings are the probe's self-test (a pristine forward it does not see turns the probe off for the judge).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kb_gym.worker.burst import fresh_seeds, median_of
from kb_gym.worker.loading import StageError
from kb_gym.worker.probe_clock import ProbeClock, ProbeError, busy_in
from kb_gym.worker.runner_client import RunnerProcess
from kb_gym.worker.runner_replies import CallReply

MAX_CLAIM_MS = 2.0  # a forward claimed under this runs within one time slice beside the probe (H200: ~2-3 ms)
CALLS = 8  # the candidate's calls per pass
SPARE_CALLS = 6  # the spare's; the first warms its path up and is not read
PASSES = 2  # a charge stands only where a second pass shows it too
SWITCH_MS = 0.002  # a gap's own context switch (H200: a 5 us kernel between two stamps read as a 10.75 us gap)
RESOLUTION = 0.03  # of the claim: what a false claim may hide at most
FLOOR_MS = 0.005
SPREAD_FACTOR = 3.0  # x the spare's median absolute deviation of its harness share
BLIND_SHARE = 0.5  # a pristine forward and shield the probe sees less than this share of: the probe is blind
QUIET_S = 0.002  # with the candidate's tree stopped, the device must stay free of other contexts' work this long
QUIET_MAX_MS = 0.02  # ... up to this much of it (a neighbour's stray launch)
QUIET_TRIES = 3  # passes voided so before the candidate is held to it (``side_stream``)
QUIET_WAIT_S = 0.2


@dataclass
class ProbeReading:
    """What the probe saw, beside what the timed calls claimed (``result.correctness.envelope.probe``)."""

    calls: int
    claimed_ms: float  # the median a timed call was charged before the probe
    forward_ms: float  # the median candidate window, by the probe, less the harness's share
    harness_ms: float  # the spare's window less its forward and shield
    harness_spread_ms: float
    gaps: float  # median gaps in a candidate window
    spare_gaps: float
    tolerance_ms: float
    passes: int = 1
    charged_ms: float = 0.0  # added to every timed call
    # GPU time (ms) other contexts used with the candidate's tree stopped, in each of QUIET_TRIES tries: work it
    # queued before it stopped (nothing was read; the timing could not be confirmed)
    restless: float = 0.0

    @property
    def counted(self) -> bool:
        return self.charged_ms > 0 or self.restless > 0

    def to_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "claimed_ms": self.claimed_ms, "forward_ms": self.forward_ms,
                "harness_ms": self.harness_ms, "harness_spread_ms": self.harness_spread_ms, "gaps": self.gaps,
                "spare_gaps": self.spare_gaps, "tolerance_ms": self.tolerance_ms, "passes": self.passes,
                "charged_ms": self.charged_ms, "restless_ms": self.restless, "counted": self.counted}


def harness_share(windows: list[tuple[float, int]], replies: list[CallReply]) -> tuple[list[float], list[int]]:
    """Per spare call (the first left out): what the probe saw less the reference's forward and shield, and the
    number of gaps. A call missing a number is left out."""
    shares, counts = [], []
    for (busy, n), reply in list(zip(windows, replies, strict=True))[1:]:
        if reply.event_ms is None or reply.shield_ms is None:
            continue
        shares.append(busy - reply.event_ms - reply.shield_ms)
        counts.append(n)
    return shares, counts


def read_probe(claimed_ms: float, cand: list[tuple[float, int]], shares: list[float],
               spare_counts: list[int]) -> ProbeReading:
    """Weigh the candidate's windows (busy ms, gaps) against its claim, given the spare's harness shares."""
    share = median_of(shares)
    spread = median_of([abs(s - share) for s in shares])
    spare_gaps = median_of([float(n) for n in spare_counts])
    forwards = [busy - max(0.0, n - spare_gaps) * SWITCH_MS - share for busy, n in cand]
    forward = median_of(forwards)
    tolerance = max(RESOLUTION * claimed_ms, FLOOR_MS, SPREAD_FACTOR * spread)
    reading = ProbeReading(len(cand), claimed_ms, forward, share, spread, median_of([float(n) for _, n in cand]),
                           spare_gaps, tolerance)
    if forward - claimed_ms > tolerance:
        reading.charged_ms = forward - claimed_ms
    return reading


def blind(windows: list[tuple[float, int]], replies: list[CallReply]) -> bool:
    """The probe saw too little of a pristine forward and shield whose events it can trust: it cannot judge."""
    seen = [(busy, (r.event_ms or 0.0) + (r.shield_ms or 0.0)) for (busy, _), r in zip(windows, replies, strict=True)]
    return median_of([b for b, _ in seen[1:]]) < BLIND_SHARE * median_of([w for _, w in seen[1:]])


def confirm(probe: ProbeClock | None, runner: RunnerProcess, spare: Callable[[], RunnerProcess | None],
            timing: Any, reference: Callable[[int], Any], check: Callable[[Any, Any, int], str | None],
            device: torch.device, call: dict[str, Any], timeout: Callable[[], float]) -> None:
    """Run the probe's passes after the timing loop (``timing``: timing.PairedTiming) and record what they showed in
    ``timing.probe`` (or why none ran in ``timing.probe_note``), or a wrong output in ``timing.mismatch``.
    ``spare()``: the pristine spare, prepared with the reference (None: none could be had); ``reference(seed)``: the
    reference's outputs for a seed; ``check(outputs, reference_outputs, seed)``: why outputs are wrong, or None;
    ``call``: the keywords of the loop's timed calls (byte_limit, chunk_bytes, widen)."""
    if device.type != "cuda" or timing.calibration is None or not timing.cand.event_ms or timing.mismatch:
        return
    claimed = median_of(timing.charged_ms())
    if claimed >= MAX_CLAIM_MS:
        return
    if probe is None or not probe.usable:
        timing.probe_note = probe.note if probe is not None else "no probe on this judge"
        return
    if not probe.wait_ready(timeout=min(60.0, max(1.0, timeout() / 4))):
        timing.probe_note = probe.note or "the probe did not start in time"
        return
    passes = restless = 0
    try:
        while passes < PASSES:
            outcome = _one_pass(probe, runner, spare, claimed, reference, check, device, call, timeout)
            if isinstance(outcome, _Mismatch):
                timing.mismatch = str(outcome)
                return
            if outcome is None:
                timing.probe_note = "no pristine spare could measure the harness's share"
                return
            if isinstance(outcome, float):  # GPU work ran with the candidate's tree stopped: the pass is void
                restless += 1
                if restless < QUIET_TRIES:
                    time.sleep(QUIET_WAIT_S)
                    continue
                timing.probe = ProbeReading(0, claimed, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, passes, restless=outcome)
                return
            passes += 1
            if timing.probe is None or outcome.charged_ms < timing.probe.charged_ms:
                timing.probe = outcome
            timing.probe.passes = passes
            if not timing.probe.counted:
                return
    except ProbeError as exc:
        timing.probe_note = str(exc)


class _Mismatch(str):
    """A probe call's output that is wrong: the verdict, not a reading."""


def _one_pass(probe: ProbeClock, runner: RunnerProcess, spare: Callable[[], RunnerProcess | None], claimed: float,
              reference: Callable[[int], Any], check: Callable[[Any, Any, int], str | None], device: torch.device,
              call: dict[str, Any], timeout: Callable[[], float]) -> ProbeReading | _Mismatch | float | None:
    """One pass: a reading, a wrong output, None (no spare), or the GPU time (ms) another context used while the
    candidate's tree was stopped and before the spare's first call (the pass is then void)."""
    pristine = spare()
    if pristine is None:
        return None

    def mark() -> int | None:
        try:
            return probe.mark()
        except ProbeError:
            return None

    def timed(process: RunnerProcess, seed: int, target: str) -> CallReply:
        torch.cuda.synchronize(device)  # the judge's own context idle inside the window
        return process.call(seed, timeout=timeout(), timed=True, target=target, marks=mark, **call)

    spare_replies, cand_replies = [], []
    with probe.spinning():
        with runner.frozen():
            # Work the candidate queued before its tree stopped runs on (a CPU stop does not reach the GPU): it must be
            # done before the spare's calls, or it would swell the harness's share the candidate is held to.
            torch.cuda.synchronize(device)
            quiet = [probe.mark()]
            time.sleep(QUIET_S)
            quiet.append(probe.mark())
            try:
                for seed in fresh_seeds(SPARE_CALLS):
                    spare_replies.append(timed(pristine, seed, "reference"))
            except StageError as exc:  # the spare's failure is not the candidate's
                raise ProbeError(f"the spare failed: {exc.message[:200]}") from None
        for j, seed in enumerate(fresh_seeds(CALLS)):
            reply = timed(runner, seed, "candidate")
            why = check(reply.outputs, reference(seed), seed)
            if why:
                return _Mismatch(f"probe call {j + 1} of {CALLS}, after the timed calls: {why}")
            cand_replies.append(reply)
        gaps = probe.stop()
    if any(r.window is None for r in spare_replies + cand_replies):
        raise ProbeError(probe.note or "a mark was missing")
    restless, _ = busy_in(gaps, quiet[0], spare_replies[0].window[0])
    if restless > QUIET_MAX_MS:
        return restless
    spare_windows = [busy_in(gaps, *r.window) for r in spare_replies]
    if blind(spare_windows, spare_replies):
        probe.note = "the probe did not see a pristine forward (MPS, or contexts that run at once)"
        raise ProbeError(probe.note)
    shares, counts = harness_share(spare_windows, spare_replies)
    if not shares:
        raise ProbeError("the spare reported no forward time")
    return read_probe(claimed, [busy_in(gaps, *r.window) for r in cand_replies], shares, counts)


def spare_source(ctx: Any, job: dict[str, Any], deadline_left: Callable[[], float],
                 prepare: Callable[..., bool]) -> Callable[[], RunnerProcess | None]:
    """The pristine spare for the probe's passes, prepared with the reference once (None where it failed)."""
    held: dict[str, Any] = {"spare": None, "failed": ctx.pool is None}

    def get() -> RunnerProcess | None:
        if held["failed"]:
            return None
        if held["spare"] is None:
            spare = ctx.pool.pristine(timeout=max(1.0, 0.25 * deadline_left()))
            if spare is None or not prepare(ctx, job, spare, deadline_left()):
                held["failed"] = True
                return None
            held["spare"] = spare
        return held["spare"]

    return get
