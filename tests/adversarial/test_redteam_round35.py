"""Red team, round 35: today's float64 second opinion read from the candidate's side: the reference's rounding sampled
on nearby inputs (``float64.rounding_spread``, ``_Sampled``, ``_nearby``, ``_in_own_precision``), the gate that asks
for it (``checks.reference_near_tolerance``), the per-element bound and count allowance it feeds
(``checks._beyond_own_scale``, ``RoundingSpread``, ``judge_against_float64``'s ``spreads``: FLOAT64_ELEMENT_FACTOR 50,
ELEMENT_ALLOWANCE (3, 1e-4)), and the opinion on spot-checked timed chunks (``float64.judge_chunks``,
``RoundingSpread.piece``, ``timed_checks.check``).

Each test asserts what a sound judge does; a test that fails against the code it was written on exposes a hole (not
xfail: the fix makes it pass). Numbers are from this 2-core CPU (``Evaluator("cpu")`` and ``float64.judge`` called
directly on the judge's own arithmetic).

GOT THROUGH (failing tests against the code they were written on):

1. ``test_an_honest_half_precision_tiled_sum_is_not_incorrect`` (an honest answer judged wrong; a regression of
   today's change). ``_nearby`` moves every floating input by a relative draw within +-2^-12, computed in the input's
   own dtype. That is below half a unit in the last place of float16 (10 mantissa bits) and of bfloat16 (7): the
   "nearby" inputs round back to the input itself (float16: 0.004% of 100,000 elements moved; bfloat16: none). Under
   ``precision="fp16"``/``"bf16"`` the four samples are one sample four times, so the per-element scale is the
   reference's error on this input alone, and where the fp16 reference rounded to the correctly rounded value by luck
   that scale is exactly 0: the element is held to the bare tolerance, with 3 + 1e-4 of the elements allowed past it.
   A row sum the problem defines as 16-wide tiles with fp16 partials (``100 randn(4096, 32)``): the same reduction
   with 8-wide tiles (honest: another tile width) misses the fp16 reference narrowly on every input (1.2-1.4% of
   rows), and the float64 opinion now judges it ``incorrect`` on 13 of 40 inputs ("5 value(s) are further off than
   50x the fp32 reference's own error on them ... at most 3 may be"); the rule of yesterday (the whole-output bound)
   judged it ``correct`` on 30 of 30, and the same sampling with the nearby inputs really moved (2^-8, computed in
   fp32 and cast back) on 29 of 30. Evaluations with 3 trials: ``incorrect`` in 5 of 6 random seeds.
2. ``test_a_float64_answer_on_the_host_still_holds_small_rows_to_their_own_rounding`` (a wrong answer judged
   correct). ``rounding_spread`` returns None whenever ``state["float64_on_host"]`` is set, and the opinion falls back
   to the whole-output bound of the input alone: round 33's hole 1 again. The host path is taken where the device's
   memory cannot hold the float64 forward "beside what the judge and the runner already hold", and the runner's
   share is the candidate's to choose: a ModelNew that keeps most of the GPU allocated (``torch.empty`` in
   ``__init__``) sends every float64 opinion of the job to the host (the flag is sticky: later trials and every timed
   call go straight there). Simulated here at the judge level as tests/test_float64.py does (``_in_float64`` raising
   ``OutOfMemoryError`` on ``"cuda"``): round 33's ``WRONG_SMALL_ROWS`` (24-45 row sums of ~5 moved by ~1.25, rows
   wrong by a fifth of their value) is ``incorrect`` with the float64 answer on the device and ``correct``
   (``ill_conditioned``) with it on the host, on 4 of 4 inputs. A GPU-size problem (the session-39 6 GB outputs)
   takes this path with no help from the candidate.

FIXED (session 44, the same session): 1, ``_nearby`` draws and moves in float32 at least, by +-2^-12 or +-4 ulps of
the input's dtype where that is more (fp16: 2^-8, bf16: 2^-5): 0 of 40 inputs judged ``incorrect`` at the judge level,
and the evaluation ``correct``; 2, the samples run where the float64 answer is, on the host too (the model moved
there and back as the float64 forward does), and where they run out of memory the first verdict stands instead of the
whole-output bound (``state["spread_failed"] == "memory"``): ``incorrect`` on both paths. Left as measured: the cost
(bounded by the stage's limit, as a slow kernel's time is) and each drawn chunk's own 3 elements.

HELD (passing tests):

- Round 31's cancelling row sums (``1000 randn(4096, 64)``): four honest orders (sequential fp32, reversed, 16-wide
  tiles, float64 accumulation) were ``incorrect`` on 0 of 30 inputs each under today's rule (the tiled order on 6 of
  30 under yesterday's); 0 of 15 on ``100 randn(256, 65536)``. Pinned on 6 inputs
  (``test_honest_orders_of_a_cancelling_row_sum_pass_the_sampled_opinion``).
- Integer-only inputs (an embedding-bag sum of ``1000 randn`` weights indexed by ``randint``): the four samples are
  identical there too (nothing floating to move), yet 16-wide tiles and a sequential sum were ``incorrect`` on 0 of
  30 inputs: with 64 fp32 roundings per element the reference's own error is rarely 0, and 50x of it covers another
  order. The half-precision hole needs few roundings per element (the reference exact by luck).
- The count allowance (at least 3 elements past the tolerance wherever the rounding was sampled) and the
  allowance of 3 + 1e-4 elements past their own scale: each element still within 3x the largest error anywhere
  (``far``), so a plain GEMM (``randn(512, 2048) @ randn(2048, 512)``, where ``reference_near_tolerance`` is true on
  every input: some output near 0 always has an error above tol/50) forgives at most 3 elements by at most
  3 x 1e-4 past the tolerance; elements 2x the tolerance off are ``incorrect`` (9 of 9). Buys nothing.
- ``judge_chunks``: each drawn chunk gets its own 3 elements past the tolerance (``piece`` scales the sampled count,
  the constant is not scaled), but its L2 bound is at least rtol of the chunk, so on round 33's mixed-scale rows a
  chunk of small rows can carry ~3 rows off by ~0.015 (30x their tolerance, 1/100 of what the whole path allowed
  before today). Not made into a test: the chunk path needs a problem whose trials never flagged ``ill_conditioned``.

COST (measured, no test): a narrow miss now costs the judge one float64 forward plus three fp32 and three float64
forwards of the reference, and the gate opens on nearly every large output (the GEMM above: every input). A
1024x4096x1024 GEMM whose candidate nudges one element past the tolerance: ``correct`` (``ill_conditioned``), the
judge's verdict 4.0 s against a 0.07 s forward and 0.49 s for the plain comparison (~60 forwards' time). With timing
on, every timed call that misses so pays it again (min 10 reps; the loop's ``max_seconds`` is read only between
reps), bounded by the timing stage's timeout: not unbounded, but a candidate can make each of its evaluations cost
the judge ~8x the comparison time at will.

Time: ~17 s for the file on this 2-core machine.
"""

from __future__ import annotations

import types

import pytest
import torch
from device import DEVICE
from test_redteam_round31 import ROW_SUM  # 1000 randn(4096, 64) summed per row
from test_redteam_round33 import MIXED_ROW_SUM, WRONG_SMALL_ROWS

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.problems import reference_as_candidate
from kb_gym.worker import float64
from kb_gym.worker.inputs import make_inputs

CPU = torch.device("cpu")
HEAD = "import torch\nimport torch.nn as nn\n"
HALF = EvalConfig(precision="fp16", trials=3, timing=False, load_timeout=60, correctness_timeout=60, integrity="off")


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


def _module(code: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(code, module.__dict__)  # our own problem's (or candidate's) code, as the judge loads it
    return module


# --- 1. half precision: the nearby inputs are the input ----------------------------------------------------------------

HALF_TILED_ROW_SUM = Problem(id=12, name="12_HalfTiledRowSum", level=1, code=HEAD + '''

class Model(nn.Module):
    """Row sums as 16-wide tiles with partials in the problem's precision (fp16 here), then the partials summed."""

    def forward(self, x):
        return x.view(x.shape[0], -1, 16).sum(2).sum(1)


def get_inputs():
    return [100.0 * torch.randn(4096, 32)]


def get_init_inputs():
    return []
''')
TILES_OF_EIGHT = HEAD + '''

class ModelNew(nn.Module):
    def forward(self, x):  # the same reduction, another tile width
        return x.view(x.shape[0], -1, 8).sum(2).sum(1)
'''


def _judged_incorrect(problem: Problem, dtype: torch.dtype, atol: float, rtol: float, seeds: range) -> list[int]:
    """The inputs (seeds) where the float64 opinion judges 8-wide tiles incorrect, at the judge level."""
    module = _module(problem.code, "round35_problem")
    model = module.Model()
    wrong = []
    for seed in seeds:
        x = make_inputs(module, seed, CPU, dtype)[0]
        with torch.no_grad():
            ref, out = model(x), x.view(x.shape[0], -1, 8).sum(2).sum(1)
        if not float64.judge(CPU, model, [x], out, ref, atol, rtol, {"flags": []}, {}).ok:
            wrong.append(seed)
    return wrong


def test_half_precision_nearby_inputs_round_back_to_the_input():
    """The mechanism of 1: +-2^-12 is under half a float16 or bfloat16 ulp (float32: 99.98% of elements move)."""
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(100_000).to(dtype)
        moved = (float64._nearby([x], float64.SPREAD_SEED, CPU)[0] != x).float().mean().item()
        assert moved > 0.5, (dtype, moved)


def test_an_honest_half_precision_tiled_sum_is_not_incorrect(ev):
    control = ev.evaluate(HALF_TILED_ROW_SUM, reference_as_candidate(HALF_TILED_ROW_SUM), config=HALF)
    assert control.status == "correct", (control.status, control.error)
    # before the fix: 13 of 40 inputs judged incorrect at the judge level, and 5 of 6 evaluations
    assert _judged_incorrect(HALF_TILED_ROW_SUM, torch.float16, 1e-2, 1e-2, range(1, 41)) == []
    r = ev.evaluate(HALF_TILED_ROW_SUM, TILES_OF_EIGHT, config=HALF, seed=0)
    assert r.status == "correct", (r.status, r.flags, r.error)


# --- 2. the float64 answer on the host: no sampling, round 33's whole-output bound -------------------------------------


def _device_full(real):
    def in_float64(ref_model, args, where):
        if where.type == "cuda":  # the runner (the candidate) holds the device's memory
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return real(ref_model, args, where)

    return in_float64


@pytest.mark.parametrize("where", ["device", "host"])
def test_a_float64_answer_on_the_host_still_holds_small_rows_to_their_own_rounding(monkeypatch, where):
    model = _module(MIXED_ROW_SUM.code, "round35_mixed").Model()
    wrong = _module(WRONG_SMALL_ROWS, "round35_wrong").ModelNew()
    monkeypatch.setattr(float64, "_in_float64", _device_full(float64._in_float64))
    device = CPU if where == "device" else torch.device("cuda")  # "cuda": its float64 forward runs out of memory
    for seed in range(2):
        x = make_inputs(_module(MIXED_ROW_SUM.code, "round35_inputs"), seed, CPU, torch.float32)[0]
        with torch.no_grad():
            ref, out = model(x), wrong(x)
        result, state = {"flags": []}, {}
        verdict = float64.judge(device, model, [x], out, ref, 1e-4, 1e-4, result, state)
        assert result["correctness"].get("float64_on", "device") == ("cpu" if where == "host" else "device")
        assert not verdict.ok, (where, seed, result)


# --- held: honest orders of round 31's cancelling row sums --------------------------------------------------------------

HONEST_ORDERS = {
    "sequential": lambda x: x.cumsum(1)[:, -1],
    "reversed": lambda x: x.flip(1).cumsum(1)[:, -1],
    "tiles_of_16": lambda x: x.view(x.shape[0], -1, 16).sum(2).sum(1),
    "float64": lambda x: x.double().sum(1).float(),
}


def test_honest_orders_of_a_cancelling_row_sum_pass_the_sampled_opinion():
    module = _module(ROW_SUM.code, "round35_row_sum")
    model = module.Model()
    judged = 0
    for seed in range(6):
        x = make_inputs(module, seed, CPU, torch.float32)[0]
        with torch.no_grad():
            ref = model(x)
            for name, order in HONEST_ORDERS.items():
                result = {"flags": []}
                verdict = float64.judge(CPU, model, [x], order(x), ref, 1e-4, 1e-4, result, {})
                assert verdict.ok, (seed, name, verdict.reason)
                judged += "judged_against_float64" in result.get("correctness", {})
    assert judged, "no input reached the float64 opinion"
