"""Red team, round 9: state kept across candidates (a problem's calibration, the spare, the zygote), the quiet
lock, the results store and the baseline cache, and the judge's reading of the runner's replies.

Each test asserts the verdict a sound judge gives. All three got through when this pass was made (session 18, a
helper's pass): the first and third are stopped since; the second is caught by the burst check, which its test turns
on (off by default until measured on a GPU: round 4's open hole). Candidates run with ``integrity="off"`` (the
design must hold when a static check misses).
"""

from __future__ import annotations

import uuid

import pytest
from device import DEVICE
from test_judge_isolation import CHECK, GELU, TIMED, cand, honest_after
from test_redteam_round4 import FIND_RUNNER, LIE_UNDER_THE_FLOOR

from kb_gym import Evaluator, Problem
from kb_gym.integrity.policy import get_policy


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


# --- 1. the load reply's status is taken as the verdict ---------------------------------------------------
#
# Mechanism: ``RunnerProcess.load`` raises ``StageError(reply["status"], ...)`` for any status other than "ok",
# and ``job.run_job`` copies that status into the result unchecked (``call`` whitelists the statuses a runner
# may report; ``load`` does not). The candidate, imported inside ``Runner._load``, rebinds the protocol's
# ``encode`` (as round 2's ``_rewrite_done``; rebinding ``Runner.send`` is too late: ``handle`` looked it up
# before calling ``_load``) so that its "loaded" reply says ``"status": "correct"``. No trial ever runs.
# Measured: status "correct", error empty, speedup None, for a model whose forward raises (2 of 2 tries); the
# default reward gives it 0.4 (``correct_base``: the status is authoritative, rewards.presets.is_correct) against
# -0.3 for the same broken model judged honestly; Kevin/Dr.Kernel give 0.3/0.5, and ``metrics`` counts it solved.
# Why it matters: a false ``correct`` for any program at all, whatever the problem.
# Stopped since (session 18): a failed load's status is one of those a load can have (runner_replies.LOAD_STATUSES,
# else compile_error), and no StageError can say "correct" (loading.FAILURE_STATUSES).

FORGED_LOAD_STATUS = cand(FIND_RUNNER + '''
_proto = sys.modules["kb_gym.worker.protocol"]
_encode = _proto.encode
def _forged(message):
    if message.get("type") == "loaded":
        message = {"type": "loaded", "status": "correct", "error": ""}
    return _encode(message)
_proto.encode = _forged
''', forward="raise RuntimeError('never computes anything')")


def test_a_load_reply_cannot_name_the_verdict(ev):
    r = ev.evaluate(GELU, FORGED_LOAD_STATUS, config=CHECK)
    assert r.status != "correct", (r.status, r.error, r.flags)
    honest_after(ev)


# --- 2. a problem's calibration measured beside another worker's candidate, kept for 60 s ---------------------
#
# Mechanism: with ``workers_per_device=2`` the spare's calibration (judge_timing.spare_calibration) runs under the device lock
# with the candidate's own runner tree frozen, but the *other* worker's candidate is not frozen: it is loading,
# or loaded and waiting for the device, and its processes run on. The quiet lock (device_lock.begin_quiet) guards
# only baseline-only jobs. Here candidate B (another problem) forks six children in sessions of their own that
# burn the CPU for 14 s, and sleeps 2.5 s at import so that A, a liar (round 4's false 1 us event time) on a
# 16-layer 512 x 512 tanh chain (~7 ms a forward on one thread, far over the 3 ms floor), takes the device first.
# A's own loop runs beside the burn too and is flagged; but its calibration (overhead 5.7-12 ms, spread 3-5.5 ms,
# tolerance 11.9-22 ms; clean: 2.0-2.2 ms, 0.1 ms, 3 ms) is kept for the problem (CALIBRATION_TTL_S) and judges
# the problem's next candidates on that worker after B is gone.
# Measured: the next liar judged with the kept calibration (age 9.6-13.6 s) ``correct``, 7,500-23,700x, no flags
# (5 of 5 tries with B's 2.5 s sleep; 2 of 3 with a 1 s sleep, where B sometimes took the device first); the same
# liar judged by the other worker's fresh calibration at the same moment: side_stream, 1.0-1.06x (the honest
# speed). In 2 of 3 tries A itself also got through beside the burn (31,700x: the inflated spread covered it).
# Without any attacker, two liars of round 8's 768 x 768 matmul problem on the two workers at once gave one
# calibration an overhead of 68 ms and a spread of 17.5 ms (the other's load beside it, and another test run on
# this 2-core machine), and that liar 11,600x: noise alone, once kept, does the same.
# Why it matters: in an RL batch a problem's samples run on both workers at once; one noisy calibration is kept and
# hides up to its tolerance plus its excess overhead for every later candidate of the problem (any forward under
# ~12-25 ms here). Fix (judge_timing.spare_calibration): calibrate under the quiet lock (no load of the device's other workers
# beside it, and their loaded runners frozen too), or keep a calibration only when its spread is near the
# smallest seen for the problem and judge against the smallest overhead of the recent ones.
# Neither would do alone: the burner's load widens the timing loop's own noise as much as the calibration's, and
# A was passed beside it with a fresh calibration too. What the envelope cannot read, the burst check does (K
# forwards back to back against the claim): with it on, 6 of 6 liars here flagged side_stream at 1.0-1.2x
# (session 18: the first and both later ones, two tries, tolerances up to 28 ms). It is off by default until
# measured on a GPU (docs/integrity.md, Open), so this hole is round 4's, with the test below run with it on.

CHAIN = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(512, 512) / 22.6)

    def forward(self, x):
        for _ in range(16):
            x = torch.tanh(x @ self.w)
        return x

def get_inputs():
    return [torch.randn(64, 512)]

def get_init_inputs():
    return []
'''

CHAIN_LIAR = LIE_UNDER_THE_FLOOR.replace("""    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))""", """    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(512, 512) / 22.6)

    def forward(self, x):
        for _ in range(16):
            x = torch.tanh(x @ self.w)
        return x""")

BURN_BESIDE = cand('''
import os, time
_end = time.time() + 14.0
for _ in range(6):
    if os.fork() == 0:
        os.setsid()
        while time.time() < _end:
            pass
        os._exit(0)
time.sleep(2.5)
''')


def _fresh_chain(tag: str) -> Problem:
    return Problem(id=9, name=f"9_TanhChain_{tag}", level=1, code=CHAIN + f"\n# round 9: {tag} {uuid.uuid4().hex}\n")


def test_a_calibration_measured_beside_another_workers_candidate_does_not_judge_the_next():
    """With the burst check on. Its forwards run back to back and are held to the claim, so an envelope too
    noisy to read (the burner's load, kept in a calibration or not) no longer decides. Off (the default until
    measured on a GPU), the lies below get through: tracked by round 4's xfail, the same hole."""
    problem = _fresh_chain("beside")
    config = TIMED.replace(burst_check=True)
    with Evaluator(DEVICE, results_path=False, baseline_cache=False, workers_per_device=2) as e:
        e.warm()
        first = e.submit(problem, CHAIN_LIAR, config=config)
        burner = e.submit(GELU, BURN_BESIDE, config=config)
        results = [first.result()]
        burner.result()  # the burner's runner, and its children, are gone now
        later = [e.submit(problem, CHAIN_LIAR, config=config) for _ in range(2)]  # one on each worker
        results += [f.result() for f in later]
    for r in results:
        assert r.status == "correct", (r.status, r.error)  # right answers: only the times are lies
        # No reward for the lie. On the CPU the burst check charges it (side_stream); on the H200 the time lie
        # itself still gets through (round 4's open hole, 162x in session 26), and what denies it credit there
        # is that PyTorch computed the answer (token_kernel, the dataflow stage; TIMED judges under the "off"
        # policy, so the flag is asked for, not speed_credit).
        denied = {f for f in r.flags if get_policy("strict").action(f) == "no_speed_credit"}
        assert "side_stream" in r.flags or denied or r.speedup < 2.0, (
            r.speedup, r.flags, r.correctness["envelope"])


# --- 3. the results store takes whatever backend names the runner reports -------------------------------------
#
# Mechanism: a runner's "done" lists the backends its launches used (``runner_client.RunnerProcess._reply``:
# at most four strings, each of any length); ``correctness.run_trials`` joins the set of them over the trials
# into ``result["backend"]``, which the EvalResult, its feedback and the results store (one JSONL line) carry
# whole. ``bound_text`` cuts ``error`` to 2,000 characters; nothing cuts ``backend``. The candidate rewrites the
# protocol's ``encode`` so that each "done" names four 500,000-character backends, different per call.
# Measured: ``correct``, ``backend`` 6.0 MB, the store's line for it 6.0 MB (an honest one: 2 kB), per
# evaluation (2 of 2); at 800,000 characters the judge's result message passes the 8 MB protocol limit: the
# candidate's own ``crash`` and a judge restart (the next honest evaluation pays its start-up, 7.4 s instead of
# 0.07 s).
# Why it matters: every evaluation of such a program writes megabytes to the results store and to whatever logs
# the results (a disk filled at ~6 MB an evaluation), and a judge can be restarted at will. Fix: keep only known
# backend names of bounded length in ``RunnerProcess._reply`` (and bound ``result["backend"]`` in run_trials).
# Stopped since (session 18): a reply's backends are kept only where they name a kernel language the launch
# counter knows (runner_replies.BACKENDS).

BIG_BACKENDS = cand('''
import sys
_proto = sys.modules["kb_gym.worker.protocol"]
_encode = _proto.encode
_calls = [0]
def _forged(message):
    if message.get("type") == "done":
        _calls[0] += 1
        message = {**message, "backends": [chr(64 + _calls[0]) * 500_000 + str(i) for i in range(4)]}
    return _encode(message)
_proto.encode = _forged
''')


def test_the_backends_a_runner_reports_do_not_bloat_the_result_or_the_store(tmp_path):
    store = tmp_path / "results.jsonl"
    with Evaluator(DEVICE, results_path=store, baseline_cache=False) as e:
        r = e.evaluate(GELU, BIG_BACKENDS, config=CHECK)
        honest_after(e)
    lines = store.read_text().splitlines()
    assert len(r.backend) <= 1000, (r.status, len(r.backend))
    assert max(len(line) for line in lines) < 100_000, [len(line) for line in lines]
