"""Round 3 of our own attacks: the memfd payload and the spot-checked timed outputs.

Each test asserts the verdict a sound judge gives the attack, then that the next honest evaluation on the same
Evaluator is judged as on a fresh one. An attack that gets through is kept, marked ``xfail(strict=True)`` with
what it gets through, until the judge is fixed.
"""

from __future__ import annotations

import pytest
import torch
from device import DEVICE
from test_judge_isolation import cand, honest_after
from test_spot_check import FIND_RUNNER, GELU_FORWARD, LARGER_GELU, SAMPLED

from kb_gym import Evaluator

# fewer timed calls: enough to draw chunks several times
SAMPLED_SHORT = SAMPLED.replace(timing_min_reps=5, timing_max_reps=5)


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


# --- 1. a second preimage of the chunk hashes, within the tolerance ---------------------------------------
#
# The first chunk hash was a weighted sum of the output's words mod 2^63, weights computable from the nonce the
# runner is told with the call: linear. So "done" could carry the hashes of a cheap answer (forward returned its
# input: no work timed at all); after "done" the runner computed the real answer and, for each drawn chunk only,
# nudged the low bits of 6-10 of its smallest values (a few ULPs, far inside atol=1e-4) so that the chunk hashed
# to what was committed: the closest vector of a 6-dimensional lattice (LLL on exact integers, in the runner).
# It got `correct`. The digests are now keyed BLAKE2b (worker/digest.py), which has no such structure: the same
# attack, short of breaking BLAKE2b, can only send the real answer's chunks under the cheap answer's digests.

LATE_CHUNKS = cand(FIND_RUNNER + '''
import torch as _t
_STATE = {}
_orig_call, _orig_chunks = _R._call, _R._send_chunks
def _call(msg, timed):
    _STATE["lazy"] = bool(timed and msg.get("chunk_bytes"))
    return _orig_call(msg, timed)
def _send_chunks(msg):
    x = _STATE.pop("x")
    _R.held = [(0.5 * x * (1.0 + _t.erf(x / 2.0 ** 0.5))).contiguous()]  # computed after "done"
    return _orig_chunks(msg)
_R._call, _R._send_chunks = _call, _send_chunks
''', '''if _STATE.get("lazy"):
    _STATE["x"] = x
    return x
''' + GELU_FORWARD)


def test_chunks_computed_after_done_under_a_cheap_answers_digests_are_tampering(ev):
    r = ev.evaluate(LARGER_GELU, LATE_CHUNKS, config=SAMPLED_SHORT)
    assert r.status == "incorrect" and "tampering" in r.flags, (r.status, r.flags, r.error)
    assert r.speedup is None
    honest_after(ev)
    honest_after(ev, SAMPLED)


def test_a_chunk_digest_depends_on_every_byte_the_nonce_the_output_and_the_chunk():
    """What the lattice attack used: the old hash moved by a known amount per word. A keyed BLAKE2b digest
    changes unpredictably with a one-ULP nudge anywhere in the chunk, and with the nonce, output or chunk."""
    from kb_gym.worker.digest import chunk_digest

    data = torch.randn(32768)
    base = chunk_digest(memoryview(data.numpy()).cast("B"), 7, 0, 0)
    nudged = data.clone()
    nudged.view(torch.int32)[12345] += 1
    assert chunk_digest(memoryview(nudged.numpy()).cast("B"), 7, 0, 0) != base
    assert len({base, chunk_digest(memoryview(data.numpy()).cast("B"), 8, 0, 0),
                chunk_digest(memoryview(data.numpy()).cast("B"), 7, 1, 0),
                chunk_digest(memoryview(data.numpy()).cast("B"), 7, 0, 1)}) == 4


# Scribbling zeros into the memfd while the judge copies it out: tests/adversarial/test_shared_payload.py
# (test_what_a_runner_does_to_its_memfd_costs_only_its_own_verdict) covers it: the judge's copy is checked
# against the commitment, and round 3 found it stopped (incorrect, tampering).
