"""The probe check's judgement (kb_gym/worker/probe_check.py) on a simulated device (``probe_sim.py``), the runner's
side of a probe call on the CPU, and a runner's view of the host's GPUs. The probe's kernels themselves need a GPU
(tests/gpu/test_gpu_probe_check.py); the attacks on the check are red-team round 24's."""

from __future__ import annotations

import pytest
import torch
from probe_sim import Device, FakeProbe, FakeRunner, judge, no_gpu_sync, timing_claiming  # noqa: F401 - a fixture

from kb_gym.worker import probe_check
from kb_gym.worker.probe_check import ProbeReading, Window, busy_in, read_probe
from kb_gym.worker.probe_clock import PassVoid, ProbeClock, ProbeError


def test_busy_in_clips_gaps_to_the_window():
    gaps = [(0, 10), (20, 30), (40, 60)]
    assert busy_in(gaps, 5, 45) == ((5 + 10 + 5) / 1e6, 3)
    assert busy_in(gaps, 11, 19) == (0.0, 0)


def test_an_honest_claim_is_not_charged():
    dev = Device()
    t = judge(FakeProbe(dev), FakeRunner(dev, 0.2), FakeRunner(dev, 0.5), timing_claiming(0.2))
    assert t.probe is not None and not t.probe.counted, t.probe
    assert abs(t.probe.forward_ms - 0.2) < 0.01, t.probe
    assert t.summary()["runtime_ms"] == pytest.approx(0.2)


def test_a_false_claim_is_charged_what_the_probe_saw():
    dev = Device()
    t = judge(FakeProbe(dev), FakeRunner(dev, 0.2, claim=0.001), FakeRunner(dev, 0.5), timing_claiming(0.001))
    assert t.probe.counted and t.probe.passes == 2, t.probe  # a second pass confirms the charge
    assert t.summary()["runtime_ms"] == pytest.approx(0.2, abs=0.01)
    assert t.summary()["envelope"]["probe"]["counted"]


def test_kernels_that_reach_the_gpu_one_by_one_are_not_charged_their_switches():
    dev = Device()
    t = judge(FakeProbe(dev), FakeRunner(dev, 0.1, pieces=12), FakeRunner(dev, 0.5), timing_claiming(0.1))
    assert not t.probe.counted, t.probe


def test_a_liar_cannot_buy_allowance_by_fragmenting_its_work():
    # Each extra piece costs a real switch and earns one allowance: the false claim still shows in full.
    dev = Device()
    t = judge(FakeProbe(dev), FakeRunner(dev, 0.1, claim=0.02, pieces=40), FakeRunner(dev, 0.5), timing_claiming(0.02))
    assert t.probe.counted and t.probe.forward_ms - t.probe.claimed_ms == pytest.approx(0.08, abs=0.01), t.probe
    assert t.probe.charged_ms >= 0.07  # and its 40 launches' host pacing shows in its wall time besides


def test_work_queued_before_the_freeze_voids_the_pass_and_costs_the_credit():
    # A runner that leaves GPU work queued whenever it is stopped would swell the spare's harness share.
    dev = Device()
    liar = FakeRunner(dev, 0.2, claim=0.001, queued=(5.0,))
    t = judge(FakeProbe(dev), liar, FakeRunner(dev, 0.5), timing_claiming(0.001))
    assert t.probe.counted and "while the candidate was stopped" in t.probe.unverified, t.probe
    assert t.probe.voids == probe_check.ATTEMPTS and liar.frozen_count == probe_check.ATTEMPTS


def test_a_wrong_output_in_a_probe_call_is_a_mismatch():
    dev = Device()
    t = judge(FakeProbe(dev), FakeRunner(dev, 0.2, wrong=True), FakeRunner(dev, 0.5), timing_claiming(0.2))
    assert t.mismatch and "probe call 1" in t.mismatch and t.probe is None


def test_probe_calls_are_checked_once_the_probe_has_stopped_and_a_void_pass_still_checks_them():
    # Beside the spinning probe each of the judge's own GPU visits (the reference's outputs, the comparison, drawn
    # chunks hashed) waits out a time slice, so the checks wait for the probe's stop; a pass the candidate made
    # unreadable must not let its wrong outputs off with an unverified claim.
    dev = Device()
    seen: list[bool] = []

    def check(out, ref, seed):
        seen.append(dev.spinning)
        return None if torch.equal(out, ref) else "wrong values"

    t = timing_claiming(0.2)
    probe_check.confirm(FakeProbe(dev), FakeRunner(dev, 0.2), lambda: FakeRunner(dev, 0.5), t,
                        lambda seed: torch.full((4,), float(seed % 1000)), check, torch.device("cuda"), {},
                        lambda: 60.0)
    assert not t.probe.counted and len(seen) == probe_check.CALLS and not any(seen), t.probe
    assert set(t.probe.seconds) == {"spare", "candidate", "checks", "pass"}  # where a pass's time went
    probe = FakeProbe(dev)

    def void():
        dev.spinning = False
        raise PassVoid("more than 65536 gaps in one pass")

    probe.stop = void
    wrong = judge(probe, FakeRunner(dev, 0.2, claim=0.001, wrong=True), FakeRunner(dev, 0.5), timing_claiming(0.001))
    assert wrong.mismatch and "probe call 1" in wrong.mismatch and wrong.probe is None


def test_long_claims_and_the_cpu_are_left_to_the_envelope():
    dev = Device()
    probe = FakeProbe(dev)
    judge(probe, FakeRunner(dev, 3.0), FakeRunner(dev, 0.5), timing_claiming(probe_check.MAX_CLAIM_MS + 1))
    cpu = timing_claiming(0.2)
    probe_check.confirm(probe, FakeRunner(dev, 0.2), lambda: FakeRunner(dev, 0.5), cpu, lambda seed: None,
                        lambda out, ref, seed: None, torch.device("cpu"), {}, lambda: 60.0)
    assert probe.passes == 0 and cpu.probe is None


def test_a_blind_probe_stands_aside_and_says_so():
    dev = Device()
    probe = FakeProbe(dev)
    probe.stop = lambda: []  # sees nothing of any context: MPS, or a driver running contexts at once
    t = judge(probe, FakeRunner(dev, 0.2, claim=0.001), FakeRunner(dev, 0.5), timing_claiming(0.001))
    assert t.probe is None and "did not see a pristine shield" in t.probe_note
    assert t.summary()["envelope"]["probe"] == {"skipped": t.probe_note}
    assert probe.usable  # for this evaluation only: the next one tries again


def test_no_probe_is_reported_not_charged():
    dev = Device()
    t = judge(None, FakeRunner(dev, 0.2, claim=0.001), FakeRunner(dev, 0.5), timing_claiming(0.001))
    assert t.probe is None and t.probe_note == "no probe on this judge"


# the spare's unshielded reference calls: a 0.5 ms forward whose window spans 0.3 ms beyond it (the harness alone)
FORWARDS = [(Window(0.55, 3, 0.8), 0.5)] * 4


def test_the_reading_weighs_the_spares_spread():
    cand = [Window(0.09, 3, 0.4)] * 8
    calm = read_probe(0.01, cand, [Window(0.05, 3, 0.3)] * 5, FORWARDS)
    noisy = read_probe(0.01, cand, [Window(b, 3, 0.3) for b in (0.03, 0.05, 0.07, 0.05, 0.09)], FORWARDS)
    assert not calm.counted and calm.tolerance_ms == pytest.approx(probe_check.FLOOR_MS)
    assert noisy.tolerance_ms == pytest.approx(3 * 0.02)
    assert isinstance(calm, ProbeReading) and calm.to_dict()["counted"] is False
    uneven = read_probe(0.01, cand, [Window(0.05, 3, 0.3)] * 5,
                        [(Window(0.55, 3, 0.8 + d), 0.5) for d in (0.0, 0.8, -0.8, 0.0)])
    assert uneven.wall_tolerance_ms == pytest.approx(3 * 0.4)  # the reference calls' idle time, as uneven as it is


def test_a_forward_computed_off_the_gpu_is_charged_its_wall_time():
    # No gap (its work is on the CPU or a copy engine) but a window 1.8 ms longer than a reference call's beyond its
    # forward (over the wall's 0.6 ms floor: two processes' host costs drift apart, probe_check.WALL_FLOOR_MS).
    reading = read_probe(0.001, [Window(0.05, 3, 2.1)] * 8, [Window(0.05, 3, 0.3)] * 5, FORWARDS)
    assert reading.counted and reading.by_wall and reading.charged_ms == pytest.approx(1.799), reading
    assert not read_probe(0.001, [Window(0.05, 3, 0.8)] * 8, [Window(0.05, 3, 0.3)] * 5, FORWARDS).counted  # 0.5 ms
    # each window's reading is kept beside the medians (what a charge on a real GPU is read from)
    assert reading.reference_idle_ms == pytest.approx(0.3) and reading.harness_span_ms == 0.3, reading
    assert reading.wall_samples_ms == [1.8] * 8 and reading.busy_samples_ms == [0.0] * 8, reading
    assert reading.to_dict()["wall_samples_ms"] == [1.8] * 8
    honest = read_probe(0.2, [Window(0.25, 3, 0.55)] * 8, [Window(0.05, 3, 0.3)] * 5, FORWARDS)
    assert not honest.counted, honest


def test_a_forwards_own_host_cost_is_held_to_the_references_not_to_a_harness_only_call():
    # On the H200 an honest reference copy of a 0.036 ms ReLU spanned 0.3+ ms more than a harness-only call (its module
    # call, launch and event synchronisation, which the harness alone does not pay, nor the baseline's events) and
    # was charged launch_bound (benchmarks.md 0y). The reference's own calls pay that host cost too.
    forwards = [(Window(0.086, 3, 0.686), 0.036)] * 4  # harness 0.3 ms of wall, host 0.35, forward 0.036
    honest = read_probe(0.036, [Window(0.086, 3, 0.686)] * 8, [Window(0.05, 3, 0.3)] * 5, forwards)
    assert not honest.counted and honest.wall_ms == pytest.approx(0.036), honest
    # 1.8 ms of host work beyond the reference's is still charged
    liar = read_probe(0.001, [Window(0.05, 3, 0.686 + 1.8)] * 8, [Window(0.05, 3, 0.3)] * 5, forwards)
    assert liar.counted and liar.by_wall and liar.charged_ms == pytest.approx(1.835, abs=0.01), liar
    # end to end on the simulated device: the spare's reference calls pay the same host cost
    dev = Device()
    t = judge(FakeProbe(dev), FakeRunner(dev, 0.036, host_ms=0.35), FakeRunner(dev, 0.036, host_ms=0.35),
              timing_claiming(0.036))
    assert not t.probe.counted, t.probe
    t = judge(FakeProbe(dev), FakeRunner(dev, 0.0, claim=0.001, host_ms=2.2), FakeRunner(dev, 0.036, host_ms=0.35),
              timing_claiming(0.001))
    assert t.probe.counted and t.probe.by_wall and t.probe.charged_ms == pytest.approx(1.85, abs=0.05), t.probe


def test_a_pass_the_candidate_left_unreadable_is_unverified_not_skipped():
    # A flood of gaps past the record, or a call that outlived the probe's kernel: nothing to read, no credit.
    dev = Device()
    probe = FakeProbe(dev)

    def void():
        raise PassVoid("more than 65536 gaps in one pass")

    probe.stop = void
    t = judge(probe, FakeRunner(dev, 0.2, claim=0.001), FakeRunner(dev, 0.5), timing_claiming(0.001))
    assert t.probe.counted and t.probe.unverified.startswith("more than"), t.probe


def test_no_spare_beside_the_candidate_is_unverified():
    # A candidate that takes the device's memory leaves no spare able to run: that cannot buy the envelope back.
    dev = Device()
    t = judge(FakeProbe(dev), FakeRunner(dev, 0.2, claim=0.001), None, timing_claiming(0.001))
    assert t.probe.counted and "no pristine spare" in t.probe.unverified


def test_a_probe_that_cannot_start_says_why(tmp_path):
    # On a machine without a GPU the probe process fails at its first CUDA call: the judge learns why, at once.
    probe = ProbeClock("cpu", tmp_path / "probe.log")
    try:
        assert not probe.wait_ready(timeout=120)
        assert probe.note and not probe.usable
        with pytest.raises(ProbeError):
            probe.mark()
    finally:
        probe.close()



PROBLEM = '''
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(64, 64)]
def get_init_inputs():
    return []
'''


def test_a_runner_takes_the_judges_marks_around_a_probe_call(tmp_path):
    # The real runner protocol on the CPU: the marks are read right before the seed goes out and right when "done"
    # comes back, and a probe call is still a timed call with its outputs (no shield on the CPU: none is reported).
    from kb_gym.worker.runner_pool import RunnerPool

    pool = RunnerPool("cpu", tmp_path)
    try:
        runner = pool.pristine(timeout=120)
        assert runner is not None
        runner.prepare(PROBLEM, 0, "fp32", False, timeout=120, reference_model=True)
        ticks = iter(range(100, 200))
        reply = runner.call(7, timeout=60, byte_limit=1 << 30, timed=True, target="reference",
                            marks=lambda: next(ticks))
        assert reply.window == (100, 101)
        assert reply.shield_ms is None and reply.event_ms is not None
        assert tuple(reply.outputs.shape) == (64, 64) and bool((reply.outputs >= 0).all())
        plain = runner.call(8, timeout=60, byte_limit=1 << 30, timed=True, target="reference")
        assert plain.window is None
        # the harness alone: the reference's outputs of its first such call, returned again for any seed
        first = runner.call(9, timeout=60, byte_limit=1 << 30, timed=True, target="harness", marks=lambda: next(ticks))
        again = runner.call(10, timeout=60, byte_limit=1 << 30, timed=True, target="harness", marks=lambda: next(ticks))
        assert torch.equal(first.outputs, again.outputs) and again.window == (104, 105)
    finally:
        pool.close()


def test_a_probe_calls_drawn_chunks_reach_the_judges_host_unchecked_and_are_checked_when_the_pass_asks(tmp_path):
    # Beside the spinning probe the judge does no GPU work of its own: the drawn chunks come to its host inside the
    # window and are checked against the hashes "done" carried when the pass asks (after the probe's stop), as a
    # plain timed call checks them at once.
    from kb_gym.worker.inputs import make_inputs
    from kb_gym.worker.loading import load_module
    from kb_gym.worker.runner_pool import RunnerPool
    from kb_gym.worker.spot_check import DrawnChunks, SampledOutputs, verified

    pool = RunnerPool("cpu", tmp_path)
    try:
        runner = pool.pristine(timeout=120)
        assert runner is not None
        runner.prepare(PROBLEM.replace("randn(64, 64)", "randn(256, 256)"), 0, "fp32", False, timeout=120,
                       reference_model=True)
        ticks = iter(range(100, 200))
        reply = runner.call(7, timeout=60, byte_limit=1 << 30, timed=True, target="reference", chunk_bytes=4096,
                            marks=lambda: next(ticks))
        assert reply.window == (100, 101) and isinstance(reply.outputs, DrawnChunks)
        sample = verified(reply.outputs)
        plain = runner.call(7, timeout=60, byte_limit=1 << 30, timed=True, target="reference", chunk_bytes=4096)
        assert isinstance(sample, SampledOutputs) and isinstance(plain.outputs, SampledOutputs)
        assert len(sample.chunks) == 16 and all(bool((values >= 0).all()) for _, _, values in sample.chunks)
        # each drawn chunk holds the reference's values at its place, for this call's seed
        source = tmp_path / "problem.py"
        source.write_text(PROBLEM.replace("randn(64, 64)", "randn(256, 256)"))
        (x,) = make_inputs(load_module(source, "probe_problem"), 7, torch.device("cpu"), torch.float32)
        expected = torch.relu(x).reshape(-1)
        for _, first, values in sample.chunks:
            assert torch.equal(values, expected[first:first + values.numel()])
    finally:
        pool.close()


def test_a_runner_sees_only_its_judges_gpu(monkeypatch):
    # On a host of several GPUs a runner that saw them all could run its forward where the probe does not look.
    from kb_gym.worker import runner, runner_start
    from kb_gym.worker.process import ENV_GPU

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert runner_start.own_gpu("cuda:1") == "5" and runner_start.own_gpu("cpu") == ""
    monkeypatch.setenv(ENV_GPU, "5")
    assert runner.narrow_to_one_gpu("cuda:1") == "cuda:0"
    assert runner.os.environ["CUDA_VISIBLE_DEVICES"] == "5" and ENV_GPU not in runner.os.environ
    assert runner.narrow_to_one_gpu("cpu") == "cpu"


def test_a_problems_next_candidates_are_read_against_its_kept_spare_calls():
    """The spare's 11 calls of a pass are kept per problem and path (the lowest share's, for SHARE_TTL_S) and, once
    confirmed (measured once the candidate's tree was gone, as a problem's first pass is read again: settle), stand in
    for a fresh spare in the next candidates' first passes: an honest one is read without a spare; a liar's charge is
    read again against a fresh spare, then once more after its exit, and stands."""
    dev = Device()
    shares: dict = {}
    spare = FakeRunner(dev, 0.5)
    first = judge(FakeProbe(dev), FakeRunner(dev, 0.2), spare, timing_claiming(0.2), shares=shares)
    assert not first.probe.counted and first.probe.spare_age_s == 0.0
    assert spare.calls == 2 * probe_check.SPARE_PASS_CALLS  # its pass, then after its exit (held to nothing else)
    assert not shares["problem"].confirmed  # the after-exit reading kept, as this evaluation's: a neighbour can swell it
    assert first.probe.after_exit_share_ms == pytest.approx(first.probe.harness_ms, abs=0.01)
    assert "after_exit" in first.probe.seconds
    spare = FakeRunner(dev, 0.5)
    second = judge(FakeProbe(dev), FakeRunner(dev, 0.2), spare, timing_claiming(0.2), shares=shares)
    assert spare.calls == probe_check.SPARE_PASS_CALLS and not second.probe.after_exit  # held to the first's share
    assert shares["problem"].confirmed  # another evaluation's fresh pass agreed
    honest_spare = FakeRunner(dev, 0.5)
    honest = judge(FakeProbe(dev), FakeRunner(dev, 0.2), honest_spare, timing_claiming(0.2), shares=shares)
    assert not honest.probe.counted and honest_spare.calls == 0 and honest.probe.spare_age_s > 0, honest.probe
    assert honest.probe.forward_ms == pytest.approx(first.probe.forward_ms, abs=0.01)
    assert honest.probe.after_exit_share_ms is None and not honest.probe.after_exit  # nothing to read again
    liar_spare = FakeRunner(dev, 0.5)
    liar = judge(FakeProbe(dev), FakeRunner(dev, 0.2, claim=0.001), liar_spare, timing_claiming(0.001), shares=shares)
    assert liar.probe.counted and liar.probe.passes == 2 and liar.probe.after_exit_share_ms is not None, liar.probe
    assert liar_spare.calls == 2 * probe_check.SPARE_PASS_CALLS  # the second pass's fresh spare, then after exit
    assert liar.summary()["runtime_ms"] == pytest.approx(0.2, abs=0.01)
    # the liar's fresh spare calls (a share no higher) are kept in their place; reused REUSES times at most, then a
    # pass makes its own again
    spares = [FakeRunner(dev, 0.5) for _ in range(probe_check.REUSES + 1)]
    for spare in spares:
        judge(FakeProbe(dev), FakeRunner(dev, 0.2), spare, timing_claiming(0.2), shares=shares)
    assert [spare.calls for spare in spares] == [0] * probe_check.REUSES + [probe_check.SPARE_PASS_CALLS]


def test_kept_spare_calls_are_confirmed_only_by_another_evaluation_and_not_by_a_swollen_reading():
    # A candidate charged in its first pass makes a second, fresh one, then a reading after its exit: readings of one
    # evaluation (its passes' could be swollen by its own delayed work, the last by a neighbour's) confirm nothing. A
    # reading that disagrees confirms nothing either.
    dev = Device()
    shares: dict = {}
    liar = judge(FakeProbe(dev), FakeRunner(dev, 0.2, claim=0.001), FakeRunner(dev, 0.5), timing_claiming(0.001),
                 shares=shares)
    assert liar.probe.passes == 2 and liar.probe.after_exit_share_ms is not None
    assert not shares["problem"].confirmed
    judge(FakeProbe(dev), FakeRunner(dev, 0.2), FakeRunner(dev, 0.5, harness=0.5), timing_claiming(0.2),
          shares=shares)  # a spare whose harness share is 0.45 ms higher: not the same reading
    assert not shares["problem"].confirmed
    judge(FakeProbe(dev), FakeRunner(dev, 0.2), FakeRunner(dev, 0.5), timing_claiming(0.2), shares=shares)
    assert shares["problem"].confirmed


def test_where_nothing_can_be_read_after_the_exit_a_first_pass_keeps_none_of_its_spare_calls(monkeypatch):
    # (round 27) its spare calls may be swollen by its own queued work, with nothing to tell: the next evaluation is
    # held to nothing of its, and is read after its own exit instead
    monkeypatch.setattr(probe_check, "_after_exit_pass", lambda *a, **k: probe_check._Skip("no pristine spare"))
    dev = Device()
    shares: dict = {}
    t = judge(FakeProbe(dev), FakeRunner(dev, 0.2), FakeRunner(dev, 0.5), timing_claiming(0.2), shares=shares)
    assert "problem" not in shares and "none could be read (no pristine spare)" in t.probe.after_exit
    assert not t.probe.counted  # the judge's own failure (a skip): the pass stands as read


def test_kept_spare_calls_expire_and_reuse_can_be_turned_off(monkeypatch):
    dev = Device()
    shares: dict = {}
    judge(FakeProbe(dev), FakeRunner(dev, 0.2), FakeRunner(dev, 0.5), timing_claiming(0.2), shares=shares)
    monkeypatch.setattr(probe_check, "SHARE_TTL_S", 0.0)
    stale = FakeRunner(dev, 0.5)
    judge(FakeProbe(dev), FakeRunner(dev, 0.2), stale, timing_claiming(0.2), shares=shares)
    assert stale.calls == 2 * probe_check.SPARE_PASS_CALLS  # nothing kept in time: a first pass, read again
    monkeypatch.setattr(probe_check, "SHARE_TTL_S", 60.0)
    monkeypatch.setattr(probe_check, "REUSE_SPARE", False)
    fresh = FakeRunner(dev, 0.5)
    t = judge(FakeProbe(dev), FakeRunner(dev, 0.2), fresh, timing_claiming(0.2), shares=shares)
    assert fresh.calls == probe_check.SPARE_PASS_CALLS and t.probe.spare_age_s == 0.0


def test_the_kept_spare_calls_are_the_lowest_shares(monkeypatch):
    """A pass whose harness share came out higher (a slower harness, or work slipped into the spare's windows) does
    not replace the kept calls; a lower one does."""
    dev = Device()
    shares: dict = {}
    judge(FakeProbe(dev), FakeRunner(dev, 0.2), FakeRunner(dev, 0.5, harness=0.05), timing_claiming(0.2),
          shares=shares)
    low = shares["problem"].share_ms
    monkeypatch.setattr(probe_check, "REUSE_SPARE", False)
    judge(FakeProbe(dev), FakeRunner(dev, 0.2), FakeRunner(dev, 0.5, harness=0.3), timing_claiming(0.2),
          shares=shares)
    assert shares["problem"].share_ms == low
    judge(FakeProbe(dev), FakeRunner(dev, 0.2), FakeRunner(dev, 0.5, harness=0.02), timing_claiming(0.2),
          shares=shares)
    assert shares["problem"].share_ms < low


def test_a_failed_probe_is_started_again_a_few_times_in_a_judges_life(tmp_path, monkeypatch):
    # One failure (a reply 10 s late, the process gone) used to leave every later candidate's short claim to the
    # envelope alone for the judge's life (round 26); a fresh probe is started, PROBE_RESTARTS times at most.
    from kb_gym.worker import job

    class Probe:
        def __init__(self) -> None:
            self.note, self.closed = "", False

        def close(self) -> None:
            self.closed = True

    started: list[Probe] = []
    monkeypatch.setattr(job, "start_probe", lambda device, root: started.append(Probe()) or started[-1])
    ctx = job.WorkerContext("cpu", tmp_path, send=lambda msg: None, runners=False)
    ctx.probe = job.start_probe(ctx.device, tmp_path)
    assert ctx.usable_probe() is started[0] and len(started) == 1  # a working probe is kept
    for k in range(job.PROBE_RESTARTS):
        ctx.probe.note = "the probe did not answer within 10 s"
        fresh = ctx.usable_probe()
        assert started[k].closed and fresh is started[k + 1] and not fresh.note
    ctx.probe.note = "the probe did not answer within 10 s"
    assert ctx.usable_probe().note and len(started) == job.PROBE_RESTARTS + 1  # past them the failure stands
