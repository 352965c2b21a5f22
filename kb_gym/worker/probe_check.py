"""The probe check: a GPU timed call's claim held to what a pristine probe saw of the runner's GPU time.

Round 4's hole: a timed call's time is the event time its runner reports, and the judge's envelope overrides it only
beyond a tolerance of at least 0.3 ms on a GPU (timing.PairedTiming.tolerance_ms), so a forward shorter than that
could claim any time at all. The runner is the candidate's process; its events are the candidate's to rewrite.

After the timing loop, where the claimed median is under a time slice (MAX_CLAIM_MS), the judge starts its probe
(probe_clock.py): from then on every other context's GPU time shows as gaps in the probe's readings. A pass:

1. With the candidate's tree stopped and the device quiet (no other context's work for QUIET_S: work the
   candidate queued before it stopped would swell what it is held to), the pristine spare runs one shielded call of
   the reference (the probe's self-test: a 1 ms shield it must see) and then SPARE_CALLS calls of the harness alone
   (inputs built, the reference's held outputs copied out: no forward), the first of them unread, then
   FORWARD_CALLS unshielded calls of the reference. The harness-only windows' GPU time is the harness's share; the
   reference calls' spans less their forwards' events are what a whole call costs the wall beyond its forward (the
   reference idle time). The device must stay quiet between them.
2. The candidate runs CALLS timed calls, each output checked against the reference once the probe has stopped.

Each call lies between two marks the judge reads from the probe: before the seed goes out, and once the outputs are
the judge's (received whole: the runner hashes nothing, so whatever it computes until then is in the window; or, for
outputs over 64 MB, the chunks drawn after "done" received on the judge's host, their hashes in "done" committing the
whole). The judge runs nothing on its GPU while the probe spins (each visit would wait out a time slice): outputs and
chunks are checked after the stop. Between the candidate's windows its runner has nothing to do, so GPU work there
voids the pass. In a probe call no runner flushes the cache and none shields its launches (clock.probe_call), so a
window holds the harness's GPU work and the forward, nothing the candidate could leave out to look faster. A
candidate window less the harness's share (and less SWITCH_MS for each gap beyond the harness's: kernels that reach
the GPU one by one) is what its forward cost the GPU; its span less the reference idle time is what it cost in wall
time (a forward computed off the GPU's SMs, on the CPU or a copy engine, leaves no gap but takes time; an honest
forward's own host cost is in the reference calls' windows too, as it is in the baseline's). Where the median of
either exceeds the claim by more than its tolerance, every timed call is charged the larger difference:
``side_stream`` for GPU time, ``launch_bound`` (a note: host launches are slower than the kernels) for wall time
alone. A second pass must show a GPU charge too (another judge's runner starting on the device outside the lock
shows as gaps as well); the smaller stands.

The spare's calls beside a live candidate may be swollen by work it queued before it stopped (round 24: work delayed
behind copy-engine copies lands in the spare's windows), so a pass is held to the lowest share the problem's passes
measured lately too (SHARE_TTL_S). Where nothing held it (a problem's first pass) or where it charges, the passes are
read again once the candidate's tree is gone (``settle``, after the runner's kill: nothing it queued can run then):
the spare's calls once more, against the lower of each pass's own share and that one where the two agree, else the
lowest of those and the kept share (``_read_again``); that reading is kept for the problem where lowest. So a swell
cannot hide a first pass's lie, and a harness that got dearer since the kept share (round 26) costs an honest
candidate nothing.

Fail closed: a pass the candidate's calls left unreadable (the device never quiet while it was stopped, GPU work
between its calls, a flood of gaps past the record, a pass that outlived the probe's kernel, a spare that failed
beside it) is void, and a claim no pass could confirm is ``unverified_timing`` (no speed credit); a later pass the
probe could not read counts as void too, so an earlier pass's charge stands. Only the probe's own absence (not started,
no probe on this judge, MPS) skips the check and says so; the envelope then stands alone.

What the probe cannot see: another context cannot be told from the runner's (a neighbour's loading candidate shows
as the runner's work: docs/integrity.md, Open), and a claim of MAX_CLAIM_MS or more is left to the envelope and, up to
wall_check.MAX_WALL_CLAIM_MS, to the wall check (wall_check.py: off by default until its first GPU run).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kb_gym.worker.burst import fresh_seeds, median_of
from kb_gym.worker.loading import StageError
from kb_gym.worker.probe_clock import PassVoid, ProbeClock, ProbeError, busy_in
from kb_gym.worker.runner_client import RunnerProcess
from kb_gym.worker.runner_replies import CallReply
from kb_gym.worker.spot_check import verified

MAX_CLAIM_MS = 2.0  # a forward claimed under this runs within one time slice beside the probe (H200: ~2-3 ms)
CALLS = 8  # the candidate's calls per pass
SPARE_CALLS = 6  # the spare's harness-only calls; the first warms its path up (and computes the held outputs)
FORWARD_CALLS = 4  # the spare's unshielded reference calls: a whole call's wall time beyond its forward's events
SPARE_PASS_CALLS = 1 + SPARE_CALLS + FORWARD_CALLS  # the spare's calls in one pass (the shielded self-test first)
PASSES = 2  # a GPU charge stands only where a second pass shows it too
ATTEMPTS = 4  # passes tried at most, void ones included
SWITCH_MS = 0.002  # a gap's own context switch (H200: a 5 us kernel between two stamps read as a 10.75 us gap)
# What a false claim may hide at most: the claim itself (a lie of 2x at most) or FLOOR_MS. Measured on the H200
# (session 29, docs/benchmarks.md 0w): a context keeps the GPU through short idle spells (its host launching the next
# kernel, the pipe), so a window's gaps are the runner's scheduled time, not its kernels' alone: an honest reference
# copy of a 0.036 ms ReLU read 0.045 ms, the harness-only window 0.645 ms, a 0.365 ms matmul 0.64 ms. At 3% and 5 us
# the honest ReLU was charged; round 4's lie (1 us claimed for ~0.1 ms) shows at any of these.
RESOLUTION = 1.0
FLOOR_MS = 0.05
SPREAD_FACTOR = 3.0  # x the median absolute deviation of the spare's harness readings
# Wall time: a candidate's runner against the spare's reference calls, two processes, whose host costs per call drift
# apart as the envelope's overheads do (0.4 ms between identical runners on the H200). On an H100 (session 32) ten
# honest reference copies and Triton kernels read -0.89..+0.37 ms of wall over their claims, one steady at +0.31 ms
# (every sample 0.16-0.43) and charged at the envelope's own 0.3 ms floor. The envelope cannot take the floor's
# place: a liar that skips the pristine runner's 1 ms shield hides ~1.3 ms of host work from it (round 24's 0.8 ms
# off the SMs). 0.6 ms clears the honest offsets seen (+0.37 ms at most) and charges that attack; the GPU tests
# passed at 1 ms, not yet run at 0.6 (docs/benchmarks.md 0z).
WALL_FLOOR_MS = 0.6
BLIND_SHARE = 0.5  # a pristine shield the probe sees less than this share of: the probe is blind
QUIET_S = 0.002  # with the candidate's tree stopped, the device must stay free of other contexts' work this long
QUIET_MAX_MS = 0.02  # ... up to this much of it, there and between the spare's calls (a neighbour's stray launch)
RETRY_WAIT_S = 0.2
SHARE_TTL_S = 60.0  # a problem's lowest harness share is kept this long (as its calibration: judge_timing)
# The spare's calls of a pass kept that long reused by the next candidates' first passes (a charge is read again
# against a fresh spare): 11 of a pass's 19 calls. Only once another evaluation's fresh pass agreed with them
# (SpareReading.agrees): a first pass whose spare windows a candidate swelled (round 24's delayed work, on a problem
# with no earlier share) would otherwise hide the next candidates' work (round 26). At most REUSES times, then a
# pass makes its own again. By itself it saved little on an H100 (docs/benchmarks.md 1b): the cost was in the
# windows.
REUSE_SPARE = True
REUSES = 3
CALL_SECONDS = 10.0  # a probe call may take this many times the loop's median envelope (and 1 s more) at most


@dataclass
class ProbeReading:
    """What the probe saw, beside what the timed calls claimed (``result.correctness.envelope.probe``)."""

    calls: int
    claimed_ms: float  # the median a timed call was charged before the probe
    forward_ms: float  # the median candidate window's GPU time, less the harness's share
    harness_ms: float  # the spare's harness-only windows' GPU time
    harness_spread_ms: float
    gaps: float  # median gaps in a candidate window
    spare_gaps: float
    tolerance_ms: float
    wall_ms: float = 0.0  # the median candidate span, less reference_idle_ms
    wall_tolerance_ms: float = 0.0
    harness_span_ms: float = 0.0  # the spare's harness-only windows' median span
    reference_idle_ms: float = 0.0  # the spare's reference calls: median span less the forward's events
    # per candidate window (rounded to 1 us): its span less reference_idle_ms, and its GPU time less the harness's
    # share; what the medians above come from
    wall_samples_ms: list[float] = dataclasses.field(default_factory=list)
    busy_samples_ms: list[float] = dataclasses.field(default_factory=list)
    # the spare's reference calls' spans less their forwards' events (wall_check's pass; rounded to 1 us)
    idle_samples_ms: list[float] = dataclasses.field(default_factory=list)
    passes: int = 1
    spare_age_s: float = 0.0  # how old the spare's calls it was read against were (0: made in this pass)
    charged_ms: float = 0.0  # added to every timed call
    by_wall: bool = False  # charged for wall time alone (``launch_bound``), not GPU time (``side_stream``)
    unverified: str = ""  # why no pass could confirm the claim (``unverified_timing``)
    voids: int = 0
    # where the chosen pass's time went (s): the spare's calls (with the freeze), the candidate's, the checks after
    # the probe's stop, and the whole pass (its start and stop included)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    # the spare's harness share measured once the candidate's tree was gone (``settle``), where one was wanted;
    # ``after_exit`` says why one was wanted, or why it could not be had
    after_exit_share_ms: float | None = None
    after_exit: str = ""
    # the candidate's windows and the spare calls this reading was made from (``settle`` reads them again)
    source: Any = dataclasses.field(default=None, repr=False, compare=False)
    # "probe": this module's pass; "wall": wall_check.py's, for claims of MAX_CLAIM_MS or more (no GPU reading)
    mode: str = "probe"

    @property
    def counted(self) -> bool:
        return self.charged_ms > 0 or bool(self.unverified)

    @property
    def resolution_ms(self) -> float:
        """The least time this reading can vouch for: under FLOOR_MS a false claim hides all of its GPU work (round
        4's 1 us lie on a ~4 us GELU read 4.3x on an H100), so a time below it is credited as FLOOR_MS
        (timing.PairedTiming.resolution_ms); 0 where no pass read the claim."""
        return FLOOR_MS if self.passes and not self.unverified and self.mode == "probe" else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(dataclasses.replace(self, source=None))
        del out["source"]
        return {**out, "counted": self.counted}


@dataclass
class Window:
    busy_ms: float  # the gaps' time inside it
    gaps: int
    span_ms: float  # mark to mark


@dataclass
class SpareReading:
    """The pristine spare's part of a pass, kept per problem and path (``confirm``'s ``shares``): its harness-only
    windows and its reference calls' windows with their forwards' event times, measured at ``at``
    (time.monotonic())."""

    at: float
    harness: list[Window]
    forwards: list[tuple[Window, float]]
    uses: int = 0  # first passes read against it in place of a fresh spare
    origin: object = None  # the evaluation whose pass measured it (``confirm``'s own token)
    confirmed: bool = False  # another evaluation's fresh pass measured the same within the tolerance (``agrees``)

    @property
    def share_ms(self) -> float:
        return median_of([w.busy_ms for w in self.harness])

    @property
    def idle_ms(self) -> float:
        return median_of([w.span_ms - event for w, event in self.forwards])

    def agrees(self, other: SpareReading) -> bool:
        """Whether two readings of one problem's spare calls agree: harness shares within FLOOR_MS (or 3x their
        spread), reference idle times within WALL_FLOOR_MS. Work a candidate slipped into a spare's windows (round
        24's delayed work) swells one reading, not both."""
        spread = max(median_of([abs(w.busy_ms - r.share_ms) for w in r.harness]) for r in (self, other))
        return (abs(self.share_ms - other.share_ms) <= max(FLOOR_MS, SPREAD_FACTOR * spread)
                and abs(self.idle_ms - other.idle_ms) <= WALL_FLOOR_MS)


def read_probe(claimed_ms: float, cand: list[Window], harness: list[Window], forwards: list[tuple[Window, float]],
               lowest_share_ms: float | None = None, lowest_idle_ms: float | None = None) -> ProbeReading:
    """Weigh the candidate's windows against its claim, given the spare's harness-only windows, its reference calls'
    windows with their forwards' event times (``forwards``), and the lowest share a pass measured for the problem
    lately (which stands where it is lower than this pass's; ``lowest_idle_ms`` likewise for the reference idle
    time: a reading taken once the candidate's tree was gone, ``settle``).

    GPU time: a candidate window's gaps less the harness-only windows' (the harness's share). Wall time: a candidate
    window's span less what an honest reference call's window spans beyond its forward's events (the module call,
    its launches, the event synchronisation, fresh output buffers: a harness-only call pays none of it, and held to
    that an honest 0.036 ms ReLU was charged +0.3 ms on the H200, benchmarks.md 0y). Both are held to the claim."""
    share = median_of([w.busy_ms for w in harness])
    spread = median_of([abs(w.busy_ms - share) for w in harness])
    if lowest_share_ms is not None:
        share = min(share, lowest_share_ms)
    spare_gaps = median_of([float(w.gaps) for w in harness])
    forward = median_of([w.busy_ms - max(0.0, w.gaps - spare_gaps) * SWITCH_MS - share for w in cand])
    idles = [w.span_ms - event for w, event in forwards]
    idle = median_of(idles) if lowest_idle_ms is None else min(median_of(idles), lowest_idle_ms)
    walls = [w.span_ms - idle for w in cand]
    wall = median_of(walls)
    reading = ProbeReading(len(cand), claimed_ms, forward, share, spread, median_of([float(w.gaps) for w in cand]),
                           spare_gaps, max(RESOLUTION * claimed_ms, FLOOR_MS, SPREAD_FACTOR * spread), wall,
                           max(RESOLUTION * claimed_ms, WALL_FLOOR_MS,
                               SPREAD_FACTOR * median_of([abs(x - idle) for x in idles])))
    gpu_excess = forward - claimed_ms if forward - claimed_ms > reading.tolerance_ms else 0.0
    wall_excess = wall - claimed_ms if wall - claimed_ms > reading.wall_tolerance_ms else 0.0
    reading.charged_ms = max(gpu_excess, wall_excess)
    reading.by_wall = wall_excess > gpu_excess
    reading.harness_span_ms = median_of([w.span_ms for w in harness])
    reading.reference_idle_ms = idle
    reading.wall_samples_ms = [round(x, 3) for x in walls]
    reading.busy_samples_ms = [round(w.busy_ms - share, 3) for w in cand]
    return reading


class _Mismatch(str):
    """A probe call's output that is wrong: the verdict, not a reading."""


class _Skip(str):
    """The probe itself could not judge (its own failure, not the candidate's): the check says so and stands aside."""


def confirm(probe: ProbeClock | None, runner: RunnerProcess, spare: Callable[[], RunnerProcess | None],
            timing: Any, reference: Callable[[int], Any], check: Callable[[Any, Any, int], str | None],
            device: torch.device, call: dict[str, Any], timeout: Callable[[], float],
            shares: dict[Any, SpareReading] | None = None, key: Any = None) -> None:
    """Run the probe's passes after the timing loop (``timing``: timing.PairedTiming) and record what they showed in
    ``timing.probe`` (or why none ran in ``timing.probe_note``), or a wrong output in ``timing.mismatch``.
    ``spare()``: the pristine spare, prepared with the reference (None: none could be had); ``reference(seed)``: the
    reference's outputs for a seed; ``check(outputs, reference_outputs, seed)``: why outputs are wrong, or None;
    ``call``: the keywords of the loop's timed calls (byte_limit, chunk_bytes, widen). ``shares[key]``: the spare's
    calls of the pass with the lowest harness share measured for this problem and path within SHARE_TTL_S, kept
    across candidates: work a candidate slipped into the spare's windows would swell only its own pass's share. Once
    another evaluation's fresh pass agreed with them, a candidate's first pass is read against them where
    REUSE_SPARE, up to REUSES times (no spare, no freeze: the candidate's calls alone); a pass they charged is read
    again against a fresh spare, and the smaller charge stands."""
    if device.type != "cuda" or not timing.cand.event_ms or timing.mismatch:
        return
    claimed = median_of(timing.charged_ms())
    if claimed >= MAX_CLAIM_MS:
        return
    if probe is None or not probe.usable:
        timing.probe_note = probe.note if probe is not None else "no probe on this judge"
        return
    if not wait_ready(probe, timeout):
        timing.probe_note = probe.note or "the probe had not started yet"
        return
    # A probe call takes about what a loop call took: one that sleeps far longer is the candidate's timeout.
    limit = 1.0 + CALL_SECONDS * median_of(timing.cand.envelope_ms) / 1e3
    valid: list[ProbeReading] = []
    voids: list[str] = []
    origin = object()  # this evaluation's, on the spare readings its passes measure
    for _ in range(ATTEMPTS):
        kept = (shares or {}).get(key)
        if kept is not None and time.monotonic() - kept.at >= SHARE_TTL_S:
            kept = None
        reuse = (kept if REUSE_SPARE and not valid and kept is not None and kept.confirmed and kept.uses < REUSES
                 else None)
        if reuse is not None:
            reuse.uses += 1
        outcome, measured = _one_pass(probe, runner, spare, claimed, reference, check, device, call,
                                      lambda: min(limit, timeout()), kept, reuse)
        if measured is not None and shares is not None:
            _keep(shares, key, measured, origin)
        if isinstance(outcome, _Mismatch):
            timing.mismatch = str(outcome)
            return
        if isinstance(outcome, _Skip):
            if valid:  # a later pass the probe could not read: what the earlier showed stands, as after a void one
                voids.append(str(outcome))
                break
            timing.probe_note = str(outcome)
            return
        if isinstance(outcome, str):
            voids.append(outcome)
            time.sleep(RETRY_WAIT_S)
            continue
        valid.append(outcome)
        if not outcome.counted or len(valid) >= PASSES:
            break
    if not valid:
        timing.probe = ProbeReading(0, claimed, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, passes=0,
                                    unverified=voids[-1] if voids else "no pass", voids=len(voids))
        return
    chosen = _chosen(valid)
    chosen.passes, chosen.voids = len(valid), len(voids)
    timing.probe = chosen
    # Every spare reading beside a live candidate is one its queued work may have swelled (round 24's delayed work),
    # which only another evaluation's lowest share holds in check, and that share may be stale (the harness got
    # dearer since: round 26). A reading once its tree is gone is neither: wanted where nothing else held a pass
    # (none kept, or kept only by this evaluation, or expired between its passes: round 27), or where it charges
    # (rare for an honest candidate).
    unheld = any(r.source[2] is None or r.source[2].origin is origin for r in valid)
    why = ("held to no other evaluation's share" if unheld else
           "a charge: the shares it rests on may be older than a change of the harness's cost" if chosen.counted else
           "")
    if why:
        chosen.after_exit = why
        timing.probe_pending = AfterExit(valid, shares, key, origin, unheld)


def wait_ready(probe: ProbeClock, timeout: Callable[[], float]) -> bool:
    """Whether the probe is ready, waiting a quarter of the stage's time left for it to start (1-60 s)."""
    return probe.wait_ready(timeout=min(60.0, max(1.0, timeout() / 4)))


def _chosen(valid: list[ProbeReading]) -> ProbeReading:
    """The smaller charge of the valid passes; a single charged pass whose second could not be read keeps its
    charge."""
    return min(valid, key=lambda r: r.charged_ms) if len(valid) >= PASSES or not valid[0].counted else valid[0]


def _read_again(r: ProbeReading, post: SpareReading) -> ProbeReading:
    """``r``'s windows read again given the spare calls measured once the candidate's tree was gone (``post``): the
    lower share and idle time of those and the pass's own, where the two agree (so a harness that got dearer since a
    kept share was measured charges nothing: round 26); where they disagree, one of them is swollen (the pass's by the
    candidate's queued work, round 24; ``post``'s by a neighbour's kernels, round 27) and the lowest of the pass's
    own, the kept share it was held to and ``post`` stands. A pass that reused kept calls is held to the lower of
    those and ``post``."""
    cand, basis, kept = r.source
    if r.spare_age_s > 0 or not basis.agrees(post):
        held = [x for x in (kept, post) if x is not None]
        share, idle = min(x.share_ms for x in held), min(x.idle_ms for x in held)
    else:
        share, idle = post.share_ms, post.idle_ms
    again = read_probe(r.claimed_ms, cand, basis.harness, basis.forwards, share, idle)
    again.source, again.spare_age_s, again.seconds = r.source, r.spare_age_s, r.seconds
    again.passes, again.voids, again.after_exit = r.passes, r.voids, r.after_exit
    return again


@dataclass
class AfterExit:
    """A probe check to finish once the candidate's tree is gone (``settle``): its valid passes, and where the
    problem's shares are kept."""

    valid: list[ProbeReading]
    shares: dict[Any, SpareReading] | None
    key: Any
    origin: object  # the evaluation's own token (confirm): its readings confirm no kept share
    unheld: bool  # a pass was held to no other evaluation's share: a void reading after the exit leaves it unverified


def settle(probe: ProbeClock | None, spare: Callable[[], RunnerProcess | None], timing: Any, device: torch.device,
           call: dict[str, Any], gone: bool = True) -> None:
    """Finish ``timing``'s probe check where ``confirm`` left it pending: with the candidate's tree gone (killed and
    waited for: no work it queued can run any more), the spare's calls once more, alone beside the probe, and the
    passes read again (``_read_again``). ``gone``: whether the candidate's whole tree was gone. Tried ATTEMPTS
    times; where no reading could be had, a charge stands as ``confirm`` read it, and a pass held to nothing else is
    unverified where the reading was void (a neighbour's work beside the spare's calls, the spare failing, the tree
    not gone: round 27) and stands where the probe itself failed. The reading is kept as the problem's share where it
    is the lowest, unconfirmed until another evaluation's fresh pass agrees (a neighbour can swell it too)."""
    pending, timing.probe_pending = timing.probe_pending, None
    if pending is None or timing.probe is None:
        return
    began = time.perf_counter()
    # after the timing stage's clock (the kernel checks ran since): a spare call may take what a probe call may
    limit = 1.0 + CALL_SECONDS * median_of(timing.cand.envelope_ms) / 1e3
    outcome: SpareReading | _Skip | str = "the candidate's tree was not gone"
    for attempt in range(ATTEMPTS if gone else 0):
        if attempt:
            time.sleep(RETRY_WAIT_S)
        outcome = _after_exit_pass(probe, spare, device, call, lambda: limit)
        if not isinstance(outcome, str) or isinstance(outcome, _Skip):
            break
    if not isinstance(outcome, SpareReading):
        timing.probe.after_exit += f"; none could be read ({outcome[:200]})"
        if pending.unheld:
            if not isinstance(outcome, _Skip):
                timing.probe.unverified = f"nothing after the candidate's exit to hold its passes to: {outcome[:200]}"
            kept = (pending.shares or {}).get(pending.key)
            if kept is not None and kept.origin is pending.origin:  # its own spare calls, maybe swollen: not kept
                del pending.shares[pending.key]
        return
    post = outcome
    valid = [_read_again(r, post) for r in pending.valid]
    chosen = _chosen(valid)
    chosen.after_exit_share_ms = post.share_ms
    chosen.seconds = {**chosen.seconds, "after_exit": round(time.perf_counter() - began, 3)}
    timing.probe = chosen
    if pending.shares is not None:
        _keep(pending.shares, pending.key, post, pending.origin)


def _keep(shares: dict[Any, SpareReading], key: Any, measured: SpareReading, origin: object) -> None:
    """``measured`` (spare calls of the evaluation whose token is ``origin``) kept as the problem's where its share is
    the lowest within SHARE_TTL_S. Reused only once another evaluation's reading agreed with it (``confirmed``): a
    reading a candidate swelled (round 24's delayed work, on a problem with no earlier share) or a neighbour swelled
    after its exit would otherwise stand for the next REUSES candidates' spares (rounds 26 and 27)."""
    kept = shares.get(key)
    if kept is not None and time.monotonic() - kept.at >= SHARE_TTL_S:
        kept = None
    measured.origin = origin
    agrees = kept is not None and kept.agrees(measured)
    if kept is None or measured.share_ms <= kept.share_ms:
        # confirmed by another evaluation's reading, or by agreeing with a confirmed one
        measured.confirmed = agrees and (kept.origin is not origin or kept.confirmed)
        shares[key] = measured
    elif agrees and kept.origin is not origin:
        kept.confirmed = True


def _after_exit_pass(probe: ProbeClock | None, spare: Callable[[], RunnerProcess | None], device: torch.device,
                     call: dict[str, Any], timeout: Callable[[], float]) -> SpareReading | _Skip | str:
    """The spare's calls of a pass beside the probe with no candidate alive, read; or why none could be: a skip
    where the probe or the judge's pool failed, a void reading otherwise."""
    if probe is None or not probe.usable:
        return _Skip(probe.note if probe is not None else "no probe on this judge")
    pristine = spare()
    if pristine is None:
        return _Skip("no pristine spare")
    try:
        with probe.spinning():
            replies, quiet, after = _spare_stage(probe, pristine, device, call, timeout)
            gaps = probe.stop()
    except ProbeError as exc:
        return _Skip(str(exc))
    except (PassVoid, StageError) as exc:
        return getattr(exc, "message", None) or str(exc)
    if any(r.window is None for r in replies):
        return _Skip(probe.note or "a mark was missing")
    return _spare_reading(gaps, replies, quiet, after)


def _one_pass(probe: ProbeClock, runner: RunnerProcess, spare: Callable[[], RunnerProcess | None], claimed: float,
              reference: Callable[[int], Any], check: Callable[[Any, Any, int], str | None], device: torch.device,
              call: dict[str, Any], timeout: Callable[[], float], held: SpareReading | None = None,
              kept: SpareReading | None = None) -> tuple[ProbeReading | _Mismatch | _Skip | str, SpareReading | None]:
    """One pass: a reading, a wrong output, a skip (the probe's own failure), or why the pass is void; and the
    spare's calls it made where they could be read (None where it was read against ``kept``, which stands in for
    them). ``held``: the problem's kept reading whose share the pass is held to where lower than its own."""
    pristine = None
    if kept is None:
        pristine = spare()
        if pristine is None:
            return "no pristine spare could run beside the candidate", None

    began = time.perf_counter()
    spent: dict[str, float] = {}
    spare_replies: list[CallReply] = []
    cand_replies: list[CallReply] = []
    seeds = fresh_seeds(CALLS)
    quiet = after = 0
    start: int | None = None
    try:
        with probe.spinning():
            if pristine is not None:
                with runner.frozen():
                    # Work the candidate queued before its tree stopped runs on (a CPU stop does not reach the GPU):
                    # it must be done before the spare's calls, or it would swell the harness's share it is held to.
                    try:
                        spare_replies, quiet, after = _spare_stage(probe, pristine, device, call, timeout)
                    except StageError as exc:
                        # The stage's time spent (or a spare call slowed past its limit by work the candidate left
                        # queued) is the candidate's timeout. Any other failure of a pristine spare beside the
                        # candidate's runner may be the candidate's doing (the device's memory held: PyTorch's "out
                        # of memory", cuBLAS's CUBLAS_STATUS_ALLOC_FAILED, cuDNN's, ...; round 26), so the pass is void,
                        # never skipped: a claim no pass confirms gets no speed credit.
                        if exc.status == "timeout":
                            raise
                        return f"the spare failed beside the candidate: {exc.message[:200]}", None
                spent["spare"] = time.perf_counter() - began
            t_cand = time.perf_counter()
            start = _mark(probe)
            for seed in seeds:
                cand_replies.append(_timed(lambda: _mark(probe), runner, seed, "candidate", device, call, timeout))
            spent["candidate"] = time.perf_counter() - t_cand
            gaps = probe.stop()
    except PassVoid as exc:
        return _checked(cand_replies, seeds, reference, check) or str(exc), None
    except ProbeError as exc:
        return _checked(cand_replies, seeds, reference, check) or _Skip(str(exc)), None
    t_check = time.perf_counter()
    wrong = _checked(cand_replies, seeds, reference, check)
    if wrong:
        return wrong, None
    spent["checks"] = time.perf_counter() - t_check
    if start is None or any(r.window is None for r in spare_replies + cand_replies):
        return _Skip(probe.note or "a mark was missing"), None
    # Between the candidate's windows (and before the first) the judge runs nothing on its GPU and the runner has
    # nothing left to do: work there is the candidate's, done where no window counts it (seed-independent work of
    # its next forward, after the last chunk went out: round 26). The pass is void.
    edges = [start] + [t for r in cand_replies for t in r.window]
    between = sum(busy_in(gaps, edges[k], edges[k + 1])[0] for k in range(0, len(edges) - 1, 2))
    if between > QUIET_MAX_MS:
        return f"GPU work ran between the candidate's calls, outside their windows ({between:.3f} ms)", None
    measured = None
    if pristine is not None:
        spare_read = _spare_reading(gaps, spare_replies, quiet, after)
        if not isinstance(spare_read, SpareReading):
            return spare_read, None
        measured = spare_read
    basis = measured or kept
    assert basis is not None  # one of the two by construction: no spare only where one was kept
    cand = [_window(gaps, r.window) for r in cand_replies]
    reading = read_probe(claimed, cand, basis.harness, basis.forwards, held.share_ms if held else None)
    reading.source = (cand, basis, held)
    reading.spare_age_s = 0.0 if measured else time.monotonic() - basis.at
    reading.seconds = {**{k: round(v, 3) for k, v in spent.items()}, "pass": round(time.perf_counter() - began, 3)}
    return reading, measured


def _timed(marks: Callable[[], int | None], process: RunnerProcess, seed: int, target: str, device: torch.device,
           call: dict[str, Any], timeout: Callable[[], float], window_at_done: bool = False) -> CallReply:
    """One call in probe mode (no flush, no shield but the spare's self-test): the judge's own context idle inside
    its window, ``marks()`` at each end (the probe's, None where it failed to give one; wall_check: the host clock,
    the window closed at "done": RunnerProcess.call)."""
    torch.cuda.synchronize(device)
    return process.call(seed, timeout=timeout(), timed=True, target=target, marks=marks,
                        window_at_done=window_at_done, **call)


def _mark(probe: ProbeClock) -> int | None:
    try:
        return probe.mark()
    except ProbeError:
        return None


def _spare_stage(probe: ProbeClock, pristine: RunnerProcess, device: torch.device, call: dict[str, Any],
                 timeout: Callable[[], float]) -> tuple[list[CallReply], int, int]:
    """The spare's calls of a pass after the device was quiet for QUIET_S: the shielded reference (the self-test),
    the harness alone, the reference unshielded; with the marks before the quiet interval and after the last call."""
    torch.cuda.synchronize(device)
    quiet = probe.mark()
    time.sleep(QUIET_S)
    probe.mark()
    targets = ["reference"] + ["harness"] * SPARE_CALLS + ["forward"] * FORWARD_CALLS
    replies = [_timed(lambda: _mark(probe), pristine, seed, target, device, call, timeout)
               for seed, target in zip(fresh_seeds(len(targets)), targets, strict=True)]
    return replies, quiet, probe.mark()


def _spare_reading(gaps: list[tuple[int, int]], replies: list[CallReply], quiet: int, after: int
                   ) -> SpareReading | _Skip | str:
    """The spare's calls read from the probe's gaps (quiet from mark ``quiet`` to the first call, and from the last
    to ``after``); a skip where the probe was blind, or why the reading is void."""
    windows = [_window(gaps, r.window) for r in replies]
    # between the spare's windows (and before and after them) no context may work: the runner's tree is stopped
    edges = [quiet] + [t for r in replies for t in r.window] + [after]
    stray = sum(busy_in(gaps, edges[k], edges[k + 1])[0] for k in range(0, len(edges), 2))
    if stray > QUIET_MAX_MS:
        return f"GPU work ran beside the spare's calls while the candidate was stopped ({stray:.3f} ms)"
    shield = replies[0].shield_ms or 0.0
    if shield <= 0 or windows[0].busy_ms < BLIND_SHARE * shield:
        return _Skip("the probe did not see a pristine shield (MPS, or contexts that run at once)")
    if any(r.event_ms is None for r in replies[-FORWARD_CALLS:]):
        return _Skip("the spare's reference calls had no event time")
    return SpareReading(time.monotonic(), windows[2:1 + SPARE_CALLS],
                        [(w, r.event_ms) for w, r in zip(windows[-FORWARD_CALLS:], replies[-FORWARD_CALLS:],
                                                         strict=True)])


def _checked(replies: list[CallReply], seeds: list[int], reference: Callable[[int], Any],
             check: Callable[[Any, Any, int], str | None]) -> _Mismatch | None:
    """The first of the candidate's calls whose outputs are wrong, checked once the probe has stopped (beside it each
    of the judge's own GPU visits, the reference's outputs, the comparison, drawn chunks hashed, waits out its time
    slice), and also where the pass was void: the outputs are the judge's copies either way."""
    for j, (seed, reply) in enumerate(zip(seeds, replies, strict=False)):
        why = check(verified(reply.outputs), reference(seed), seed)
        if why:
            return _Mismatch(f"probe call {j + 1} of {len(seeds)}, after the timed calls: {why}")
    return None


def _window(gaps: list[tuple[int, int]], window: tuple[int, int]) -> Window:
    busy, n = busy_in(gaps, *window)
    return Window(busy, n, (window[1] - window[0]) / 1e6)

