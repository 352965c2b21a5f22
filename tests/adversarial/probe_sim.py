"""A simulated GPU for the probe check (kb_gym/worker/probe_check.py), shared by its tests: a timeline in nanoseconds
where another context's GPU work is a gap in the probe's record (one gap a burst of back-to-back work, ~2 us of
switch each, as the H200 showed: docs/benchmarks.md 0v), host-only time (the CPU, a pipe, a copy engine) no gap at
all, and work past a time slice shares the GPU with the spinning probe (the probe's own slices are no gap, while the
other context's events keep running: a 2.7 ms matmul read 7.5 ms beside the probe with 3.35 ms of gaps). A GPU is
needed only for the probe's kernels themselves (tests/gpu/test_gpu_probe_check.py).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from kb_gym.worker import probe_check, probe_clock, wall_check
from kb_gym.worker.loading import StageError
from kb_gym.worker.probe_clock import PassVoid, ProbeClock
from kb_gym.worker.runner_replies import CallReply
from kb_gym.worker.timing import Calibration, PairedTiming, Side

SWITCH_NS = 2_000


class Device:
    """The GPU as the probe sees it: a clock in nanoseconds and the gaps other contexts left in its readings."""

    def __init__(self) -> None:
        self.now = 10**9
        self.gaps: list[tuple[int, int]] = []
        self.spinning = False
        self.until: int | None = None  # the spinning kernel stops by itself here (probe_clock.MAX_PASS_S)
        self.queued_ms = 0.0  # work a stopped runner left queued: it runs once the probe has read the clock
        self.delayed_ms = 0.0  # a stopped runner's work queued behind copy-engine copies: it reaches the SMs later
        self.neighbour_ms = 0.0  # another judge's loading runner: this much GPU work right after every mark
        # work a stopped runner left running on (time-slicing beside what comes next): one piece lands in each
        # window opened by a probe's mark or a read of the judge's host clock (the wall check's), in turn
        self.lingering: list[float] = []

    def _gap(self, start: int, end: int) -> None:
        if self.spinning and (self.until is None or start < self.until):
            self.gaps.append((start, end))

    def busy(self, ms_pieces: list[float], idle_ns: int = 5_000) -> None:
        """Another context runs these pieces of work, the host leaving ``idle_ns`` between them."""
        for ms in ms_pieces:
            self.now += idle_ns
            start = self.now
            self.now += int(ms * 1e6) + SWITCH_NS
            self._gap(start, self.now)

    def linger(self) -> None:
        if self.lingering:
            self.busy([self.lingering.pop(0)], idle_ns=0)

    def wall_clock(self) -> int:
        """The judge's host clock (the wall check's marks): now, with a piece of lingering work landing after it."""
        now = self.now
        self.linger()
        return now

    def host(self, ms: float) -> None:
        """Time that is no SM work of any context: the CPU, a pipe, a copy engine's transfer."""
        self.now += int(ms * 1e6)

    def sliced(self, ms: float, slice_ms: float = 2.0, switch_ms: float = 0.2) -> float:
        """One context's ``ms`` of work beside the spinning probe: past a time slice the probe gets a slice of its own
        (no gap) and each switch costs ~0.2 ms (H200). Returns the wall time the work took."""
        t0, left = self.now, ms
        while left > 0:
            run = min(left, slice_ms)
            start = self.now
            self.now += int((run + switch_ms) * 1e6)
            self._gap(start, self.now)
            left -= run
            if left > 0:
                self.now += int(slice_ms * 1e6)
        return (self.now - t0) / 1e6


class FakeProbe:
    """ProbeClock's interface over the simulated device, with its real limits: a pass of more than MAX_GAPS gaps is
    an error (``overflow``), the spinning kernel stops MAX_PASS_S after it starts, a note makes it unusable."""

    def __init__(self, device: Device) -> None:
        self.device, self.note, self.running = device, "", False
        self.passes = 0

    @property
    def usable(self) -> bool:
        return not self.note

    def wait_ready(self, timeout: float = 0.0) -> bool:
        return self.usable

    def mark(self) -> int:
        self.device.now += 30_000  # a round trip to the probe process
        now = self.device.now
        if self.device.queued_ms:
            self.device.busy([self.device.queued_ms], idle_ns=0)
            self.device.queued_ms = 0.0
        if self.device.neighbour_ms:
            self.device.busy([self.device.neighbour_ms], idle_ns=0)
        self.device.linger()
        return now

    def start(self) -> None:
        self.device.spinning, self.device.gaps = True, []
        self.device.until = self.device.now + int(probe_clock.MAX_PASS_S * 1e9)
        self.running = True
        self.passes += 1

    def stop(self) -> list[tuple[int, int]]:
        self.running = False
        self.device.spinning = False
        if len(self.device.gaps) > probe_clock.MAX_GAPS:
            raise PassVoid(f"more than {probe_clock.MAX_GAPS} gaps in one pass")
        if self.device.now > self.device.until:
            raise PassVoid("the pass outlived the probe's kernel")
        return list(self.device.gaps)

    spinning = ProbeClock.spinning  # the judge's own: stopped on the way out whatever happens


class FakeRunner:
    """A runner whose probe calls take ``harness`` ms of GPU work around a forward of ``forward`` ms (in ``pieces``
    kernels reaching the GPU one by one, or behind a 1 ms shield for the shielded reference) after ``host_ms`` of its
    own host time, reporting ``claim`` ms.
    ``queued``: GPU work (ms) it leaves queued at each freeze, in turn; ``lingers``: pieces of work it leaves
    running at each freeze (Device.lingering)."""

    def __init__(self, device: Device, forward: float, claim: float | None = None, pieces: int = 1,
                 harness: float = 0.05, queued: tuple[float, ...] = (), wrong: bool = False,
                 host_ms: float = 0.0, lingers: tuple[float, ...] = ()) -> None:
        self.device, self.forward, self.claim, self.pieces = device, forward, claim, pieces
        self.host_ms = host_ms  # the forward's own host cost (module call, launches, synchronisation): no SM work
        self.harness, self.queued, self.wrong, self.lingers = harness, queued, wrong, lingers
        self.frozen_count = 0
        self.calls = 0

    @contextlib.contextmanager
    def frozen(self):
        self.frozen_count += 1
        if self.queued:
            self.device.queued_ms = self.queued[min(self.frozen_count, len(self.queued)) - 1]
        self.device.lingering = list(self.lingers)
        yield True

    def reference_span(self) -> tuple[float, float]:
        """The spare's shield and forward, back to back: (event ms, shield ms) as its events read them."""
        self.device.busy([1.0 + self.forward], idle_ns=0)
        return self.forward, 1.0

    def candidate_forward(self) -> None:
        self.device.host(self.host_ms)
        self.device.busy([self.forward / self.pieces] * self.pieces)

    def harness_only(self) -> None:
        """What a harness-only call does beyond the harness (nothing, in a pristine spare)."""

    def unshielded_reference(self) -> None:
        """The spare's reference forward with no shield in front of it: its host cost, then its GPU work."""
        self.device.host(self.host_ms)
        self.device.busy([self.forward])

    def call(self, seed: int, *, timeout: float, timed: bool, target: str, marks, byte_limit: int = 0,
             chunk_bytes: int = 0, widen: bool = False, window_at_done: bool = False) -> CallReply:
        self.calls += 1
        before = marks()
        self.device.busy([self.harness / 2])  # inputs built
        if target == "reference":
            event, shield = self.reference_span()
        elif target == "harness":  # the spare's harness alone: its held outputs copied out, no forward
            self.harness_only()
            event, shield = self.forward, None
        elif target == "forward":  # the spare's reference, unshielded: its host cost beside its GPU work
            self.unshielded_reference()
            event, shield = self.forward, None
        else:
            self.candidate_forward()
            event, shield = self.forward if self.claim is None else self.claim, None
        if window_at_done:  # the window ends at "done" (the wall check): the outputs' copy comes after it
            after = marks()
            self.device.busy([self.harness / 2])
        else:
            self.device.busy([self.harness / 2])  # outputs copied out
            after = marks()
        out = torch.full((4,), float(seed % 1000) + (1.0 if self.wrong else 0.0))
        return CallReply(outputs=out, event_ms=event, window=(before, after), shield_ms=shield)


class FailingSpare(FakeRunner):
    """A pristine spare that cannot run beside the candidate: the candidate's runner holds the GPU's free memory (a
    tensor of ``mem_get_info()[0]`` less a margin, taken in a timed call; the judge's own allocator keeps its cached
    blocks, a fresh spare has none). ``from_call``: the first of its calls that fails; ``message``: the failure as
    PyTorch words it (an allocation; cuBLAS's handle, round 26)."""

    OUT_OF_MEMORY = "out of memory on the device: CUDA out of memory. Tried to allocate"

    def __init__(self, *a, from_call: int = 1, message: str = OUT_OF_MEMORY, **k) -> None:
        super().__init__(*a, **k)
        self.from_call, self.message = from_call, message

    def call(self, seed, **kw):
        if self.calls + 1 >= self.from_call:
            self.calls += 1
            raise StageError("runtime_error", self.message)
        return super().call(seed, **kw)


def timing_claiming(ms: float) -> PairedTiming:
    cand = Side(event_ms=[ms] * 10, envelope_ms=[ms + 3.0] * 10)
    return PairedTiming(Side(event_ms=[1.0] * 10), cand, 10, 0.1, Calibration(3.0, 0.05), "cuda")


def judge(probe, runner, spare, timing, timeout=lambda: 60.0, shares=None) -> PairedTiming:
    """The probe check as the judge runs it: its passes, then (the candidate's tree killed: nothing it queued runs
    any more) what was left pending read again (probe_check.settle)."""
    def reference(seed):
        return torch.full((4,), float(seed % 1000))

    def check(out, ref, seed):
        return None if torch.equal(out, ref) else "wrong values"

    probe_check.confirm(probe, runner, lambda: spare, timing, reference, check, torch.device("cuda"), {}, timeout,
                        shares, "problem")
    if wall_check.enabled():  # a claim past the probe's limit (judge_timing runs it right after the probe check)
        wall_check.confirm(probe, runner, lambda: spare, timing, reference, check, torch.device("cuda"), {}, timeout,
                           clock=runner.device.wall_clock)
    runner.device.queued_ms = runner.device.delayed_ms = 0.0
    runner.device.lingering = []
    probe_check.settle(probe, lambda: spare, timing, torch.device("cuda"), {})
    return timing


@pytest.fixture(autouse=True)
def no_gpu_sync(monkeypatch):
    """Imported by the tests that use the simulation: no CUDA to synchronise, no wait between passes."""
    monkeypatch.setattr(probe_check.torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(probe_check, "RETRY_WAIT_S", 0.0)
