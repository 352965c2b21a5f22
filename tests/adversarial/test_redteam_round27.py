"""Red team, round 27: the probe check's reading after the candidate's exit (git 6b2cf36, ``probe_check.settle``).

What changed: ``confirm`` leaves ``timing.probe_pending`` where the problem's first pass had no kept share to be held
to, or where the chosen reading charges; once the candidate's runner tree is killed (``job.run_job``'s finally ->
``state["after_exit"]`` -> ``judge_timing._after_exit_verdict``) ``settle`` runs the spare's calls once more beside
the probe and reads every valid pass again (against min(own share, after-exit share) and min(own idle, after-exit
idle), or against the after-exit reading alone where the pass had reused kept spare calls); the after-exit reading is
kept, confirmed, as the problem's share where it is the lowest. Where it cannot be had, the passes stand as read.

Tried from the policy's side on the simulated device (``probe_sim.py``; round 24's ``DelayedIntruder`` and
``IntrudedSpare`` model work a candidate queued behind copy-engine copies landing in the spare's windows; another
context's kernels, a sibling candidate loading in another judge outside the device lock, are gaps the probe cannot
tell from anyone else's: docs/integrity.md, Open). The candidate itself never runs after its kill here.

GOT THROUGH (all but the last fixed in session 35, the tests below pinning the fix; the last a strict xfail):

- the lenient fallback: a neighbour's kernels voiding the after-exit pass leave a swollen first pass standing, and
  its swollen spare calls stay kept (unconfirmed, but a share that is *kept*), so the next swelling liars within
  SHARE_TTL_S are neither first nor charged: never read again;
- ``unkept`` is decided at the first attempt only: a kept share that expires between the first pass (read against
  it, reused) and the second leaves a swollen second pass held to nothing, uncharged, and not "first": never read
  again, and min() picks it;
- the read-again drops the kept share that held the passes in ``confirm`` (the reused branch reads the after-exit
  calls alone; the other min(own, post)): one after-exit reading swollen by a neighbour's kernels undoes a charge
  the kept share had rightly made (the docstring's "a liar's charge can only grow by it" does not hold);
- the after-exit reading is kept *confirmed* with no second reading agreeing: a neighbour's kernels in it (with the
  poisoner's own pass swollen so that it is the lowest) make it the share the next REUSES candidates' first passes
  are read against with no spare at all: their lies uncharged (round 26's poisoning, back through settle);
- HONEST, charged wrongly: a first pass is now read against min(own share, after-exit share), so a harness that got
  ~10% cheaper between the pass and the after-exit reading (the kernel checks run in between) charges an honest
  short kernel the drop: round 26's drift, downward.

The fixes (``probe_check``): the after-exit pass is tried up to ATTEMPTS times; where it stays void on a pass held to
no other evaluation's share, that pass is unverified (no speed credit) and its own spare calls are not kept; a pass is
"held" only by a share another evaluation measured, checked on every valid pass (not the first attempt's); the
read-again takes min(own, after-exit) only where the two agree (``SpareReading.agrees``), else the lowest of own,
kept and after-exit (a reused pass: kept and after-exit); the after-exit reading is kept unconfirmed, as this
evaluation's (another evaluation's agreeing fresh pass confirms it); the verdict is not read after a tree that was
not gone (``RunnerProcess.kill`` returns whether it was). Left open: a harness that gets cheaper between the pass and
the after-exit reading by more than the tolerance cannot be told from a pass the candidate swelled.

HELD (plain tests): a settle whose spare or probe fails never raises into the judge and keeps a charge; a first
pass the liar voided on purpose is still read after exit; ``run_job`` runs the verdict only after the kill, never
where a status is already set (no runtime: no credit), and a judge failure in it is a crash.

Not modelled (noted for the maintainers, not tested): ``RunnerProcess.kill`` ignores ``sandbox.wait_gone``'s False
(a tree not gone in 10 s: its context, and whatever it queued, may still be alive in the after-exit pass), and GPU
work of a dying context's teardown, if any, would void the after-exit pass the same way a neighbour does.
"""

from __future__ import annotations

import time
import types

import pytest
import torch
from probe_sim import Device, FailingSpare, FakeProbe, FakeRunner, judge, no_gpu_sync, timing_claiming  # noqa: F401
from test_redteam_round24 import DelayedIntruder, IntrudedSpare

from kb_gym.worker import job as job_mod
from kb_gym.worker import probe_check
from kb_gym.worker.loading import StageError
from kb_gym.worker.probe_clock import PassVoid, ProbeError


def after_kill(monkeypatch, hook) -> None:
    """``hook()`` runs once the candidate's tree is gone (``judge`` zeroes what it left queued), right before
    ``settle``: what the device does from then on is no candidate's."""
    settle = probe_check.settle

    def settled(*a, **k):
        hook()
        return settle(*a, **k)

    monkeypatch.setattr(probe_check, "settle", settled)


class NeighbouredSpare(IntrudedSpare):
    """A pristine spare (round 24's, so a live candidate's delayed work can land in its windows) whose windows, once
    ``neighbour`` is set, also hold that much of a neighbour's kernels (a sibling candidate loading in another judge
    outside the device lock: docs/integrity.md, Open): inside its calls, none between them."""

    neighbour = 0.0

    def harness_only(self) -> None:
        super().harness_only()
        if self.neighbour:
            self.device.busy([self.neighbour])


def honest_kept_share(dev: Device, shares: dict) -> None:
    """Two honest evaluations of the problem: the first's after-exit reading is kept, the second's fresh pass agrees
    with it and confirms it (reused by the next ones)."""
    for _ in range(2):
        judge(FakeProbe(dev), FakeRunner(dev, 0.2), FakeRunner(dev, 0.5), timing_claiming(0.2), shares=shares)
    assert shares["problem"].confirmed and shares["problem"].share_ms < 0.1


# --- (a) ways through ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["the_liar_itself", "the_next_liars"])
def test_a_neighbour_that_voids_the_after_exit_reading_does_not_let_a_swollen_first_pass_stand(who, monkeypatch):
    dev = Device()
    shares: dict = {}
    sibling = {"ms": 0.05}  # the sibling starts launching once the first liar is gone; done before the next ones
    after_kill(monkeypatch, lambda: setattr(dev, "neighbour_ms", sibling["ms"]))
    first = judge(FakeProbe(dev), DelayedIntruder(dev, 0.35, claim=0.05), IntrudedSpare(dev, 0.5),
                  timing_claiming(0.05), shares=shares)
    assert "none could be read" in first.probe.after_exit, first.probe
    if who == "the_liar_itself":
        assert first.probe.counted and (first.probe.charged_ms > 0.25 or first.probe.unverified), first.probe
        return
    dev.neighbour_ms = sibling["ms"] = 0.0  # the sibling is done: nothing else helps the next liars
    for _ in range(3):
        liar = judge(FakeProbe(dev), DelayedIntruder(dev, 0.35, claim=0.05), IntrudedSpare(dev, 0.5),
                     timing_claiming(0.05), shares=shares)
        assert liar.probe.counted and liar.probe.charged_ms > 0.25, (liar.probe, shares["problem"].share_ms)


class SlowFirstPass(DelayedIntruder):
    """Round 24's delayed-work liar whose calls in a pass it is not frozen for (a pass read against kept spare calls:
    no spare, no freeze) each sleep ``stall_s`` on the CPU, under the call's limit (1 s + 10x the loop's envelope)."""

    def __init__(self, *a, stall_s: float = 0.8, **k) -> None:
        super().__init__(*a, **k)
        self.stall_s = stall_s

    def candidate_forward(self) -> None:
        if self.frozen_count == 0:
            self.device.host(self.stall_s * 1e3)
        super().candidate_forward()


@pytest.fixture
def device_clock(monkeypatch):
    """The judge's monotonic clock read off the simulated device's (what the calls take is what passes)."""
    dev = Device()
    t0 = dev.now
    clock = types.SimpleNamespace(monotonic=lambda: 1e4 + (dev.now - t0) / 1e9, perf_counter=time.perf_counter,
                                  sleep=lambda s: dev.host(s * 1e3))
    monkeypatch.setattr(probe_check, "time", clock)
    return dev


def test_a_kept_share_that_expires_between_two_passes_does_not_leave_a_swollen_pass_unread(device_clock):
    dev = device_clock
    shares: dict = {}
    honest_kept_share(dev, shares)
    dev.host((probe_check.SHARE_TTL_S - 4.0) * 1e3)  # the kept share has 4 s to live
    liar = SlowFirstPass(dev, 0.35, claim=0.05, stall_s=0.8)  # 8 calls x 0.8 s: its first pass outlives the share
    t = judge(FakeProbe(dev), liar, IntrudedSpare(dev, 0.5), timing_claiming(0.05), shares=shares)
    assert t.probe.counted and t.probe.charged_ms > 0.25, t.probe


@pytest.mark.parametrize("held", ["reused_kept_calls", "held_to_kept_share"])
def test_one_swollen_after_exit_reading_does_not_undo_a_charge_the_kept_share_made(held, monkeypatch):
    monkeypatch.setattr(probe_check, "REUSE_SPARE", held == "reused_kept_calls")
    dev = Device()
    shares: dict = {}
    honest_kept_share(dev, shares)
    spare = NeighbouredSpare(dev, 0.5)
    after_kill(monkeypatch, lambda: setattr(spare, "neighbour", 0.45))
    # on reused calls the plain lie is enough (min() picks the uncharged re-read); held to the share it swells its own
    liar = (FakeRunner(dev, 0.35, claim=0.05) if held == "reused_kept_calls" else
            DelayedIntruder(dev, 0.35, claim=0.05))
    t = judge(FakeProbe(dev), liar, spare, timing_claiming(0.05), shares=shares)
    assert t.probe.after_exit_share_ms is not None and t.probe.after_exit_share_ms > 0.4  # the swollen reading
    assert t.probe.counted and t.probe.charged_ms > 0.25, t.probe


def test_a_swollen_after_exit_reading_is_not_kept_confirmed_for_the_next_candidates(monkeypatch):
    dev = Device()
    shares: dict = {}
    spare = NeighbouredSpare(dev, 0.5)
    after_kill(monkeypatch, lambda: setattr(spare, "neighbour", 0.3))
    # the poisoner: an honest forward, first on the problem, its own pass swollen by its delayed work
    judge(FakeProbe(dev), DelayedIntruder(dev, 0.2, intrude_ms=0.35), spare, timing_claiming(0.2), shares=shares)
    spare.neighbour = 0.0
    assert shares["problem"].share_ms > 0.3, shares["problem"]
    for _ in range(probe_check.REUSES):
        liar = judge(FakeProbe(dev), FakeRunner(dev, 0.3, claim=0.05), FakeRunner(dev, 0.5), timing_claiming(0.05),
                     shares=shares)
        assert liar.probe.counted and liar.probe.charged_ms > 0.2, liar.probe


# --- (b) honest candidates -----------------------------------------------------------------------------------------


@pytest.mark.xfail(strict=True, reason="a first pass is read again against min(own share, after-exit share): a "
                   "harness ~10% cheaper after the candidate's exit (the kernel checks run in between; round 26 took "
                   "a 10% rise as an honest drift) charges an honest 0.036 ms kernel the drop (0.06 ms > 0.05 ms)")
def test_an_honest_first_pass_is_not_charged_for_a_harness_that_got_cheaper_after_it(monkeypatch):
    dev = Device()
    spare = FakeRunner(dev, 0.036, harness=0.66)
    after_kill(monkeypatch, lambda: setattr(spare, "harness", 0.6))
    t = judge(FakeProbe(dev), FakeRunner(dev, 0.036, harness=0.66), spare, timing_claiming(0.036), shares={})
    assert t.probe.after_exit_share_ms == pytest.approx(0.604, abs=0.01)
    assert not t.probe.counted, t.probe


def test_an_honest_first_pass_with_the_same_harness_after_exit_is_not_charged():
    dev = Device()
    spare = FakeRunner(dev, 0.036, harness=0.66)
    t = judge(FakeProbe(dev), FakeRunner(dev, 0.036, harness=0.66), spare, timing_claiming(0.036), shares={})
    assert t.probe.after_exit_share_ms is not None and not t.probe.counted, t.probe


# --- (c) held -------------------------------------------------------------------------------------------------------


class BreakingProbe(FakeProbe):
    """A probe that, once ``broken`` is set, fails its stop: its own failure, or the pass void (an overflow)."""

    broken = ""

    def stop(self):
        if self.broken:
            self.running = self.device.spinning = False
            if self.broken == "void":
                raise PassVoid("more than 65536 gaps in one pass")
            self.note = "the probe did not answer within 10 s"
            raise ProbeError(self.note)
        return super().stop()


@pytest.mark.parametrize("how", ["spare_fails", "probe_error", "probe_gone", "pass_void", "neighbour"])
def test_a_settle_that_cannot_read_never_raises_into_the_judge_and_keeps_a_charge(how, monkeypatch):
    dev = Device()
    probe = BreakingProbe(dev)
    spare = (FailingSpare(dev, 0.5, from_call=2 * probe_check.SPARE_PASS_CALLS + 1) if how == "spare_fails"
             else FakeRunner(dev, 0.5))
    hooks = {"probe_error": lambda: setattr(probe, "broken", "error"),
             "probe_gone": lambda: setattr(probe, "note", "the probe exited (status -9)"),
             "pass_void": lambda: setattr(probe, "broken", "void"),
             "neighbour": lambda: setattr(dev, "neighbour_ms", 0.05)}
    after_kill(monkeypatch, hooks.get(how, lambda: None))
    t = judge(probe, FakeRunner(dev, 0.2, claim=0.001), spare, timing_claiming(0.001))
    assert t.probe_pending is None and "none could be read" in t.probe.after_exit, t.probe
    assert t.probe.counted and t.probe.passes == 2 and t.probe.charged_ms == pytest.approx(0.2, abs=0.02)


def test_a_first_pass_the_liar_voided_on_purpose_is_still_read_after_exit():
    # a void first attempt changes nothing: the swollen valid pass is still held to no other evaluation's share.
    dev = Device()
    liar = DelayedIntruder(dev, 0.35, claim=0.05, queued=(5.0, 0.0))  # work queued at its first freeze: void
    t = judge(FakeProbe(dev), liar, IntrudedSpare(dev, 0.5), timing_claiming(0.05), shares={})
    assert t.probe.voids == 1 and t.probe.after_exit_share_ms is not None, t.probe
    assert t.probe.counted and t.probe.charged_ms > 0.25, t.probe


@pytest.mark.parametrize("liar", [True, False])
def test_nothing_is_read_after_a_tree_that_was_not_gone(liar):
    # A tree still there after the kill's 10 s (its context, and whatever it queued, maybe alive): a charge stands as
    # read, and a pass held to no other evaluation's share is unverified (no speed credit), its spare calls not kept.
    dev = Device()
    shares: dict = {}
    t = timing_claiming(0.001 if liar else 0.2)
    spare = FakeRunner(dev, 0.5)
    probe_check.confirm(FakeProbe(dev), FakeRunner(dev, 0.2, claim=0.001 if liar else None), lambda: spare, t,
                        lambda seed: torch.full((4,), float(seed % 1000)), lambda out, ref, seed: None,
                        torch.device("cuda"), {}, lambda: 60.0, shares, "problem")
    calls = spare.calls
    probe_check.settle(FakeProbe(dev), lambda: spare, t, torch.device("cuda"), {}, gone=False)
    assert spare.calls == calls and "the candidate's tree was not gone" in t.probe.after_exit, t.probe
    assert t.probe.counted and "problem" not in shares, (t.probe, shares)
    assert bool(t.probe.unverified), t.probe  # first on the problem: held to nothing


def test_a_probe_that_fails_after_the_exit_leaves_an_honest_first_pass_as_read():
    # The probe's own failure is no candidate's doing: the pass stands as confirm read it (as a skip does there).
    dev = Device()
    probe = FakeProbe(dev)
    t = timing_claiming(0.2)
    probe_check.confirm(probe, FakeRunner(dev, 0.2), lambda: FakeRunner(dev, 0.5), t,
                        lambda seed: torch.full((4,), float(seed % 1000)), lambda out, ref, seed: None,
                        torch.device("cuda"), {}, lambda: 60.0, {}, "problem")
    probe.note = "the probe exited (status -9)"
    probe_check.settle(probe, lambda: FakeRunner(dev, 0.5), t, torch.device("cuda"), {})
    assert not t.probe.counted and "none could be read (the probe exited" in t.probe.after_exit, t.probe


class KilledRunner:
    """What run_job's teardown reads of a runner; ``kill`` says when it ran."""

    rtt_ms, forked, launch_shim, shm_payloads, device_payloads, payload = 0.1, True, "", 0, 0, None
    payload_seconds, premap_seconds, device_digest, digest_note, headers = 0.0, 0.0, False, "", {}

    def __init__(self, order: list[str], gone: bool = True) -> None:
        self.order, self.info, self.pch, self.gone = order, {}, {}, gone

    def kill(self, keep=None) -> bool:
        self.order.append("kill")
        return self.gone


@pytest.mark.parametrize("after", ["returns", "kernel_check_fails", "judge_fails", "tree_not_gone"])
def test_the_deferred_verdict_runs_after_the_kill_and_never_past_a_verdict(after, monkeypatch, tmp_path):
    order: list[str] = []

    def verdict(gone: bool) -> None:
        order.append(f"verdict gone={gone}")
        if after == "judge_fails":
            raise RuntimeError("settle failed")

    def pipeline(ctx, job, job_dir, result, state):
        state["runner"] = KilledRunner(order, gone=after != "tree_not_gone")
        state["after_exit"] = verdict
        if after == "kernel_check_fails":  # the knockout's call failed: the candidate's verdict, no timing
            raise StageError("runtime_error", "the knockout call failed")

    monkeypatch.setattr(job_mod, "_pipeline", pipeline)
    ctx = types.SimpleNamespace(scratch_root=tmp_path, jobs_done=0, pool=None, device=torch.device("cpu"))
    result = job_mod.run_job(ctx, {"source": ""})
    if after == "kernel_check_fails":
        assert order == ["kill"] and result["status"] == "runtime_error" and "runtime_ms" not in result
    elif after == "judge_fails":
        assert order == ["kill", "verdict gone=True"] and result["status"] == "crash" and result["restart"]
    else:  # the verdict sets the status (timing_verdict); told whether the tree was gone (settle reads nothing if not)
        assert order == ["kill", f"verdict gone={after == 'returns'}"] and "status" not in result
