"""Timed outputs checked on chunks the judge draws after "done" (worker/spot_check.py): what it must catch.

GPU-sized outputs (hundreds of MB) are spot-checked on every timed call instead of crossing whole; these
tests lower the threshold so a 128 KB output on the CPU takes the same path.
"""

from __future__ import annotations

import pytest
import torch
from device import DEVICE
from test_judge_isolation import GELU, HONEST, TIMED, cand, honest_after

from kb_gym import Evaluator, Problem
from kb_gym.worker.spot_check import (
    SampledOutputs,
    check_hash_lists,
    chunk_hash,
    chunk_hashes,
    chunk_size,
    pick_chunks,
    reference_pieces,
)
from kb_gym.worker.tensors import describe

# 128 KB of output: 32 chunks of 4 KB, 16 drawn per call (small, so the CPU envelope stays quiet)
BIG_GELU = Problem(id=2, name="2_BigGELU", level=1, code=GELU.code.replace("torch.randn(64, 256)",
                                                                           "torch.randn(128, 256)"))
SAMPLED = TIMED.replace(timed_output_sample_bytes=1024)

FIND_RUNNER = '''
import gc
_R = next(o for o in gc.get_objects()
          if type(o).__name__ == "Runner" and type(o).__module__ == "kb_gym.worker.runner")
'''
GELU_FORWARD = "return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))"


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


# --- the hashes -----------------------------------------------------------------------------------


def test_each_chunk_hash_is_the_one_the_whole_pass_computed_and_depends_on_every_bit_and_the_nonce():
    outs = [torch.randn(1000, 37), torch.arange(10, dtype=torch.int64), torch.rand(7) > 0.5]
    size = 4096
    hashes = chunk_hashes(outs, nonce=99, chunk_bytes=size)
    assert [len(h) for h in hashes] == [-(-t.numel() * t.element_size() // size) for t in outs]
    for k, t in enumerate(outs):
        raw = t.contiguous().reshape(-1).view(torch.uint8)
        for j in range(len(hashes[k])):
            assert chunk_hash(raw[j * size:(j + 1) * size], 99, k, j, size) == hashes[k][j]
    flipped = outs[0].clone()
    flipped.view(torch.int32)[500, 3] ^= 1  # one bit, in the chunk holding element 18503
    again = chunk_hashes([flipped, *outs[1:]], nonce=99, chunk_bytes=size)
    changed = [j for j, (a, b) in enumerate(zip(hashes[0], again[0], strict=True)) if a != b]
    assert changed == [(500 * 37 + 3) * 4 // size]
    assert chunk_hashes(outs, nonce=100, chunk_bytes=size)[0] != hashes[0]


def test_chunks_are_drawn_distinct_and_the_runners_lists_are_checked():
    meta = describe([torch.randn(100_000), torch.randn(10)])
    size = chunk_size(400_040)
    assert size % 16 == 0 and size >= 4096
    drawn = pick_chunks(meta, size)
    assert len(drawn) == len(set(drawn)) == 16
    assert all(0 <= j < -(-meta[k]["nbytes"] // size) for k, j in drawn)
    # every output is drawn on every call, the small one too (1 chunk of 99 here; round 17: a loss beside a large
    # tensor went unchecked in almost every call when all chunks were drawn alike)
    assert all({k for k, _ in pick_chunks(meta, size)} == {0, 1} for _ in range(50))
    assert pick_chunks(describe([torch.randn(10)]), size) == [(0, 0)]
    many = describe([torch.randn(2000) for _ in range(20)])  # more outputs than chunks a call: drawn alike
    assert len(set(pick_chunks(many, size))) == 16
    good = [[0] * -(-m["nbytes"] // size) for m in meta]
    check_hash_lists(meta, good, size)
    for bad in (good[:1], [good[0], []], [good[0] + [0], good[1]], [["x"] * len(good[0]), good[1]], None):
        with pytest.raises(ValueError):
            check_hash_lists(meta, bad, size)


def test_reference_pieces_refuse_other_shapes_and_dtypes():
    ref = [torch.randn(4, 8)]
    same = SampledOutputs(meta=describe([torch.randn(4, 8)]), chunks=[(0, 8, torch.randn(8))])
    pieces, why = reference_pieces(ref, same)
    assert why is None and torch.equal(pieces[0], ref[0].reshape(-1)[8:16])
    for other in (torch.randn(8, 4), torch.randn(4, 8, dtype=torch.float64)):
        assert reference_pieces(ref, SampledOutputs(meta=describe([other]), chunks=[]))[1]
    assert "tensor(s)" in reference_pieces(ref, SampledOutputs(meta=describe([]), chunks=[]))[1]


# --- through the evaluator --------------------------------------------------------------------------


def test_an_honest_large_output_is_spot_checked_and_judged_as_when_it_crosses_whole(ev):
    spot = ev.evaluate(BIG_GELU, HONEST, config=SAMPLED)
    whole = ev.evaluate(BIG_GELU, HONEST, config=SAMPLED.replace(timed_output_sample_bytes=0))
    for r in (spot, whole):
        assert r.status == "correct" and set(r.flags) <= {"no_custom_kernel"}, (r.status, r.flags, r.error)
    assert spot.correctness["timed_output_check"] == {"chunks_per_call": 16, "chunk_bytes": 4096}
    assert whole.correctness["timed_output_check"] == "whole"


# 8 MB of output: 64 chunks of 128 KB; the 16 drawn (2 MB) are over the memfd threshold (payload.py).
LARGER_GELU = Problem(id=3, name="3_LargerGELU", level=1, code=GELU.code.replace("torch.randn(64, 256)",
                                                                                "torch.randn(2048, 1024)"))


def test_drawn_chunks_large_enough_for_shared_memory_cross_through_it(ev):
    """The chunks of a GPU-sized output (16 x 1 MB) cross through the memfd like whole outputs do; the judge
    once read them from the pipe and stalled for the rest of the stage (a crash after 200 s per evaluation)."""
    r = ev.evaluate(LARGER_GELU, HONEST, config=SAMPLED)
    assert r.status == "correct" and set(r.flags) <= {"no_custom_kernel", "side_stream"}, (r.status, r.error)
    assert r.correctness["timed_output_check"] == {"chunks_per_call": 16, "chunk_bytes": 131072}
    assert r.worker["shm_payloads"] >= 1


# Right in the correctness trials, zeros in every timed call (the runner's harness told it which is which).
ZEROS_WHEN_TIMED = cand(FIND_RUNNER + '''
_orig = _R._call
def _call(msg, timed):
    _R.model.zeros = timed
    return _orig(msg, timed)
_R._call = _call
''', "if getattr(self, 'zeros', False):\n    return torch.zeros_like(x)\n" + GELU_FORWARD)

# Hashes the true outputs in "done", then sends other bytes for the chunks drawn.
OTHER_CHUNKS = cand(FIND_RUNNER + '''
import torch as _t
_orig = _R._send_chunks
def _send_chunks(msg):
    _R.held = [_t.zeros_like(h) for h in _R.held]
    return _orig(msg)
_R._send_chunks = _send_chunks
''', GELU_FORWARD)

# "done" with the hashes of an answer it has not computed (zeros), the real answer computed afterwards.
HASHES_BEFORE_COMPUTE = cand(FIND_RUNNER + '''
import torch as _t
from kb_gym.worker import runner as _runner
_real = _runner.chunk_hashes
def _early(flat, nonce, *rest):
    return _real([_t.zeros_like(t) for t in flat], nonce, *rest)
_runner.chunk_hashes = _early
''', GELU_FORWARD)


@pytest.mark.parametrize(("source", "status", "flag"), [
    pytest.param(ZEROS_WHEN_TIMED, "incorrect", "timing_mismatch", id="zeros_when_timed"),
    pytest.param(OTHER_CHUNKS, "incorrect", "tampering", id="other_bytes_than_hashed"),
    pytest.param(HASHES_BEFORE_COMPUTE, "incorrect", "tampering", id="hashes_before_the_answer"),
])
def test_lies_about_spot_checked_outputs_get_their_verdict(ev, source, status, flag):
    r = ev.evaluate(BIG_GELU, source, config=SAMPLED)
    assert r.status == status and flag in r.flags, (r.status, r.flags, r.error)
    honest_after(ev)
