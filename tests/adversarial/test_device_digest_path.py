"""The commitment taken where the outputs are (device_digest.py), end to end, on a machine without a GPU.

With ``KB_GYM_DEVICE_DIGEST=force`` the judge and its runners take the GPU path on the CPU: the call asks for
device digests, the runner hashes its outputs without copying them to the host first (CPU tensors by the
same tree function as the kernel's specification), and the judge checks what arrives the same way. The
kernel itself is checked against hashlib in tests/test_device_digest.py and on the GPU by the judge.
"""

from __future__ import annotations

import os

import pytest
from device import DEVICE
from test_judge_isolation import GELU, HONEST, TIMED, cand, honest_after
from test_spot_check import BIG_GELU, GELU_FORWARD, HASHES_BEFORE_COMPUTE, OTHER_CHUNKS, SAMPLED

from kb_gym import Evaluator
from kb_gym.worker import device_digest


@pytest.fixture(scope="module")
def ev():
    before = os.environ.get(device_digest.ENV_SWITCH)
    os.environ[device_digest.ENV_SWITCH] = "force"  # the judge process inherits it
    try:
        with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
            yield e
    finally:
        if before is None:
            os.environ.pop(device_digest.ENV_SWITCH, None)
        else:
            os.environ[device_digest.ENV_SWITCH] = before


# "done" with the commitment of zeros, the real answer sent after it.
COMMITS_TO_ZEROS = cand('''
import torch as _t
from kb_gym.worker import runner as _runner
_real = _runner.commitment
def _early(flat, nonce, *rest):
    return _real([_t.zeros_like(t) for t in flat], nonce, *rest)
_runner.commitment = _early
''', GELU_FORWARD)


def test_honest_outputs_are_committed_where_they_are_whole_and_in_chunks(ev):
    whole = ev.evaluate(GELU, HONEST, config=TIMED)
    spot = ev.evaluate(BIG_GELU, HONEST, config=SAMPLED)
    for r in (whole, spot):
        assert r.status == "correct" and set(r.flags) <= {"no_custom_kernel"}, (r.status, r.flags, r.error)
        assert r.worker["digest"] == "device", r.worker
    assert spot.correctness["timed_output_check"] == {"chunks_per_call": 16, "chunk_bytes": 4096}


@pytest.mark.parametrize(("problem", "source", "config"), [
    pytest.param(GELU, COMMITS_TO_ZEROS, TIMED, id="commitment_before_the_answer"),
    pytest.param(BIG_GELU, OTHER_CHUNKS, SAMPLED, id="other_bytes_than_hashed"),
    pytest.param(BIG_GELU, HASHES_BEFORE_COMPUTE, SAMPLED, id="hashes_before_the_answer"),
])
def test_lies_about_outputs_hashed_where_they_are_are_tampering(ev, problem, source, config):
    r = ev.evaluate(problem, source, config=config)
    assert r.status == "incorrect" and "tampering" in r.flags, (r.status, r.flags, r.error)
    honest_after(ev, TIMED)
