"""Red team, round 9: state kept across candidates (a problem's calibration, the spare, the zygote), the quiet
lock, the results store and the baseline cache, and the judge's reading of the runner's replies.

Each test asserts the verdict a sound judge gives. Those that got through when this pass was made are marked
``xfail(strict=True)`` with what was measured. Candidates run with ``integrity="off"`` (the design must hold when
a static check misses).
"""

from __future__ import annotations

import os

import pytest
from test_judge_isolation import CHECK, GELU, cand, honest_after
from test_redteam_round4 import FIND_RUNNER

from kb_gym import Evaluator

DEVICE = os.environ.get("KB_GYM_ADVERSARIAL_DEVICE", "cpu")


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


# --- 1. the load reply's status is taken as the verdict ---------------------------------------------------
#
# Mechanism: ``RunnerProcess.load`` raises ``StageError(reply["status"], ...)`` for any status other than "ok",
# and ``job.run_job`` copies that status into the result unchecked (``call`` whitelists the statuses a runner
# may report; ``load`` does not). The candidate, imported inside ``Runner._load``, rebinds the protocol's ``encode``
# (as round 2's ``_rewrite_done``) so that its "loaded" reply says ``"status": "correct"``. The judge never runs a correctness trial.
# Measured: status "correct", no flags, speedup None, in 0.1 s of load, for a model whose forward raises; under
# the default reward that is ``correct_base`` (the status is authoritative: rewards.presets.is_correct), under
# Kevin/Dr.Kernel 0.3/0.5, and ``metrics`` counts it solved.
# Why it matters: a false ``correct`` for any program at all, whatever the problem.

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
