"""Runtime integrity checks: each adversarial candidate gets the verdict it must (on the CPU in CI; against a GPU judge
with KB_GYM_ADVERSARIAL_DEVICE, device.py)."""

from __future__ import annotations

import pytest
from device import DEVICE, ON_GPU

from kb_gym import EvalConfig, Evaluator, Problem, get_problem, load_problems

CHECK = EvalConfig(trials=2, timing=False)
TIMED = EvalConfig(trials=2, timing_min_reps=4, timing_max_reps=8, timing_warmup=1, timing_max_seconds=3)


@pytest.fixture(scope="module")
def relu():
    return get_problem(load_problems("builtin"), name="level1/1_ReLU")


@pytest.fixture(scope="module")
def ev():
    evaluator = Evaluator(DEVICE, results_path=False)
    yield evaluator
    evaluator.close()


def test_answer_that_changes_on_a_rerun_is_nondeterministic(ev, relu):
    src = '''
import torch
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
    def forward(self, x):
        self.calls += 1
        return torch.relu(x) if self.calls <= 2 else torch.relu(x) + 1e-2
'''
    r = ev.evaluate(relu, src, config=CHECK)
    assert r.status == "incorrect" and "nondeterministic" in r.flags
    assert "second run" in r.error


def test_replaying_the_first_answer_fails_on_fresh_inputs(ev, relu):
    src = '''
import torch
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = {}
    def forward(self, x):
        key = tuple(x.shape)
        if key not in self.cache:
            self.cache[key] = torch.relu(x)
        return self.cache[key]
'''
    r = ev.evaluate(relu, src, config=CHECK)
    assert r.status == "incorrect" and r.correctness["failed_trial"] == 2


def test_replay_keyed_by_input_values_is_caught_while_timing(ev, relu):
    # Passes correctness (fresh inputs each trial) but returns a stale answer on any input it has
    # seen before with different data at the same address: caught by the timed-output check.
    src = '''
import torch
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = 0
        self.stale = None
    def forward(self, x):
        self.seen += 1
        if self.seen > 4 and self.stale is not None and self.stale.shape == x.shape:
            return self.stale
        self.stale = torch.relu(x)
        return self.stale
'''
    r = ev.evaluate(relu, src, config=TIMED)
    assert r.status == "incorrect"
    assert "timing_mismatch" in r.flags or "nondeterministic" in r.flags


def test_pytorch_fallback_without_kernel_launch_is_flagged(ev, relu):
    src = '''
import torch
import triton
import triton.language as tl

@triton.jit
def never_called(x_ptr, n, BLOCK: tl.constexpr):
    pass

class ModelNew(torch.nn.Module):
    def forward(self, x):
        try:
            raise RuntimeError("pretend the kernel failed")
        except RuntimeError:
            return torch.relu(x)
'''
    r = ev.evaluate(relu, src, config=CHECK)
    assert "no_custom_kernel" in r.flags and r.custom_kernel_launches == 0


def test_backend_does_not_leak_between_candidates(ev, relu):
    from kb_gym.problems import BUILTIN_DIR

    triton_src = (BUILTIN_DIR / "solutions" / "level1" / "1_ReLU.py").read_text()
    assert ev.evaluate(relu, triton_src, config=CHECK).backend == "triton"
    plain = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
    r = ev.evaluate(relu, plain, config=CHECK)
    assert r.backend == "torch" and "no_custom_kernel" in r.flags


def _problem(name: str, forward: str, inputs: str) -> Problem:
    code = (f"import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
            f"        return {forward}\n\ndef get_inputs():\n    return [{inputs}]\n\ndef get_init_inputs():\n"
            "    return []\n")
    return Problem(id=90, name=name, level=1, code=code)


def _candidate(forward: str) -> str:
    return f"import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return {forward}\n"


def test_returning_the_input_fails_where_the_inputs_make_the_output_the_input(ev):
    """ReLU of torch.rand is its input (L1/19_ReLU, 20, 31, 32 of the official set): a widened trial
    on inputs of both signs tells a kernel from a copy, and an honest kernel still passes."""
    problem = _problem("90_ReLUOfRand", "torch.relu(x)", "torch.rand(64, 256)")
    copy = ev.evaluate(problem, _candidate("x.clone()"), config=CHECK)
    assert copy.status == "incorrect" and "both signs" in copy.error, copy.error
    assert "degenerate_problem" in copy.flags
    honest = ev.evaluate(problem, _candidate("torch.clamp(x, min=0)"), config=CHECK)
    assert honest.status == "correct" and honest.correctness["widened_trial"], honest.error


def test_widened_trial_is_skipped_where_the_reference_is_not_finite_on_it(ev):
    # sqrt(x**2) of rand is x again, but log of a negative input is NaN: no verdict from that trial.
    problem = _problem("91_LogExpOfRand", "torch.log(torch.exp(x)).clamp(min=0) + torch.log(x + 1) * 0",
                       "torch.rand(64, 256)")
    honest = ev.evaluate(problem, _candidate("x.clamp(min=0) + torch.log(x + 1) * 0"), config=CHECK)
    assert honest.status == "correct", honest.error
    assert "widened_trial" not in honest.correctness


def test_lower_precision_arithmetic_fails_on_small_outputs(ev):
    """Outputs under the atol floor let bfloat16 and float16 pass element by element (L1/39_L2Norm and the
    softmax-ended level-2 problems in the official set); the relative L2 bound does not."""
    problem = _problem("92_SmallSoftmax", "torch.softmax(x, dim=1)", "torch.randn(64, 4096) * 0.5")
    for low_precision in ("bfloat16", "half"):
        low = ev.evaluate(problem, _candidate(f"torch.softmax(x.{low_precision}(), dim=1).float()"), config=CHECK)
        assert low.status == "incorrect" and "relative L2 error" in low.error, (low_precision, low.error)
    honest = ev.evaluate(problem, _candidate("torch.exp(x - x.amax(1, keepdim=True)) / "
                                            "torch.exp(x - x.amax(1, keepdim=True)).sum(1, keepdim=True)"),
                         config=CHECK)
    assert honest.status == "correct", honest.error


def test_a_hard_coded_typical_answer_fails_where_the_output_barely_depends_on_the_inputs(ev):
    """A tenth of the mean of 1M values moves ~3e-5 between inputs: inside the tolerance, so the typical answer
    (computed once on other inputs) would pass (L2/42 and L2/65 of the official set); the trials' own
    answers flag the problem and hold candidates to a fraction of that movement."""
    problem = _problem("93_HugeMean", "x.mean(dim=(1, 2)) * 0.1 + 1.0", "torch.rand(4, 1024, 1024)")
    typical = _candidate("torch.full((x.shape[0],), 1.05, device=x.device)")
    # 1.05 is the expected answer: checked one way, it lands within 0.3x of the trial-to-trial distance on
    # seeds 1 and 9 (3 in 100 seeds); checked both ways between two trials it cannot. Where the two answers
    # happen to lie within 1e-5 of each other (seed 60, 1 in 100) nothing tells it apart: unverifiable.
    for seed in (0, 1, 2, 9):
        r = ev.evaluate(problem, typical, seed=seed, config=CHECK)
        assert r.status == "incorrect" and "degenerate_problem" in r.flags, (seed, r.status, r.error)
    r = ev.evaluate(problem, typical, seed=60, config=CHECK)
    if ON_GPU:  # the CUDA generator draws other inputs for seed 60: no coincidence to count on, only a sound verdict
        assert r.status == "incorrect" or ("unverifiable_output" in r.flags and not r.speed_credit), (r.status, r.flags)
    else:
        assert r.status == "correct" and "unverifiable_output" in r.flags and not r.speed_credit, (r.status, r.flags)
    # With more trials the other pairs still test it, and an honest kernel is not unverifiable by one close pair.
    more = CHECK.replace(trials=4)
    r = ev.evaluate(problem, typical, seed=60, config=more)
    assert r.status == "incorrect", (r.status, r.flags)
    honest_source = _candidate("x.sum(dim=(1, 2)) / (x.shape[1] * x.shape[2]) * 0.1 + 1.0")
    for seed, config in ((0, CHECK), (60, more)):
        honest = ev.evaluate(problem, honest_source, seed=seed, config=config)
        assert honest.status == "correct" and "unverifiable_output" not in honest.flags, (honest.error, honest.flags)


def test_zeros_on_an_always_zero_problem_get_no_speed_credit(ev):
    """max over a keepdim dimension minus its own mean is exactly zero (L2/80 and L2/9 of the official
    set): zeros are the answer, so the result is correct but unverifiable and earns no speed credit
    under strict; the reward caps it at the incorrect level."""
    from kb_gym.rewards import get_reward

    problem = _problem("94_AlwaysZero", "x.amax(1, keepdim=True) - x.amax(1, keepdim=True).mean(1, keepdim=True)",
                       "torch.randn(64, 256)")
    zeros = ev.evaluate(problem, _candidate("x.new_zeros(x.shape[0], 1)"), config=TIMED)
    assert zeros.status == "correct" and "unverifiable_output" in zeros.flags, (zeros.status, zeros.error)
    assert not zeros.speed_credit
    reward, parts = get_reward("default")(zeros)
    # the speed it would have earned is taken back whatever it was (exactly 0 where both times are under the
    # checking clock's resolution: the CPU clock on)
    assert parts["integrity_penalty"] <= -parts["speed"] and parts["integrity_penalty"] < 0 and reward <= -0.1


def test_identity_resolved_by_the_widened_trial_is_not_unverifiable(ev):
    problem = _problem("95_ReLUOfRandAgain", "torch.relu(x)", "torch.rand(64, 256)")
    honest = ev.evaluate(problem, _candidate("torch.clamp(x, min=0)"), config=CHECK)
    assert honest.status == "correct" and "degenerate_problem" in honest.flags
    assert "unverifiable_output" not in honest.flags


def test_an_output_the_inputs_do_not_move_is_unverifiable(ev):
    """level3/28_VisionTransformer and 3_DeepNarrowMLP of the official set give the same answer for any
    input (to 1e-5): one row computed and repeated passes, so no speed credit can be earned there."""
    problem = _problem("96_InputBlind", "torch.ones(x.shape[0], 8, device=x.device) * 3.0 + x.mean() * 1e-9",
                       "torch.randn(64, 256)")
    repeated = ev.evaluate(problem, _candidate("(x.new_ones(1, 8) * 3.0).expand(x.shape[0], 8).contiguous()"),
                           config=CHECK)
    assert repeated.status == "correct" and "unverifiable_output" in repeated.flags and not repeated.speed_credit


TF32_BY_ARGUMENT = '''
import torch

def _configure(module, value):
    module.allow_tf32 = value

class ModelNew(torch.nn.Module):
    def forward(self, x):
        _configure(torch.backends.cudnn, True)
        return torch.relu(x)
'''


def test_turning_on_tf32_where_the_static_check_cannot_see_it_is_a_precision_change(ev, relu):
    """fp32 problems run the reference without TF32; a candidate that turns it on (here through an
    argument, which name-based static checks miss) changes the reference's numerics as well: flagged
    at runtime, no speed credit, and the next evaluation starts with TF32 off again."""
    r = ev.evaluate(relu, TF32_BY_ARGUMENT, config=CHECK)
    assert "precision_change" in r.flags and not r.speed_credit, r.flags
    clean = ev.evaluate(relu, _candidate("torch.relu(x)"), config=CHECK)
    assert clean.status == "correct" and "precision_change" not in clean.flags, clean.flags
    # Asking for TF32 is the user's choice, not the candidate's: nothing to flag then.
    allowed = ev.evaluate(relu, TF32_BY_ARGUMENT, config=CHECK.replace(tf32=True))
    assert "precision_change" not in allowed.flags, allowed.flags


LYING_SUBCLASS = '''
import torch
import torch.nn as nn

_Tensor = getattr(torch, "Ten" + "sor")

def _agree(cls, func, types, args=(), kwargs=None):
    # Every comparison says "equal"; everything else computes as usual.
    if getattr(func, "__name__", "") in ("isclose", "eq", "__eq__", "allclose", "equal"):
        return torch.ones_like(args[0].as_subclass(_Tensor), dtype=torch.bool)
    return func(*[a.as_subclass(_Tensor) if isinstance(a, _Tensor) else a for a in args], **(kwargs or {}))

_Lie = type("Lie", (_Tensor,), {"__torch_" + "function__": classmethod(_agree)})

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x).as_subclass(_Lie)
'''


def test_a_tensor_subclass_built_by_computed_names_cannot_answer(ev, relu):
    """The static check names __torch_function__; built from pieces it is missed, so the comparison
    itself refuses outputs that are not plain tensors (nn.Parameter is allowed)."""
    r = ev.evaluate(relu, LYING_SUBCLASS, config=CHECK)
    assert r.status == "incorrect" and "subclass" in r.error, (r.status, r.error)
    parameter = ev.evaluate(relu, _candidate("torch.nn.Parameter(torch.relu(x), requires_grad=False)"), config=CHECK)
    assert parameter.status == "correct", parameter.error


CANCELLING_SUM = _problem("97_CancellingSum", "x.sum(dim=1)",
                          "torch.randn(8192, 2048) + (b := torch.randn(2048) * 20) - b.mean()")


def test_an_exact_answer_passes_where_the_fp32_reference_itself_is_off(ev):
    """Rows of large terms that cancel leave the fp32 sum off from float64 beyond 1e-4 on ~0.2% of rows (like
    L2/14 and L2/18 of the official set): a kernel that sums exactly, or in another order, is as right as the
    reference and must pass; one wrong on more rows than the reference, or in half precision, must not."""
    exact = ev.evaluate(CANCELLING_SUM, _candidate("x.double().sum(1).float()"), config=TIMED)
    assert exact.status == "correct", exact.error
    assert "ill_conditioned" in exact.flags and exact.correctness["judged_against_float64"] >= 1
    assert set(exact.flags) == {"ill_conditioned", "no_custom_kernel"}, exact.flags  # a note: speed still counts
    assert exact.speedup is not None
    reordered = ev.evaluate(CANCELLING_SUM, _candidate("x.view(x.shape[0], -1, 128).sum(2).sum(1)"), config=CHECK)
    assert reordered.status == "correct", reordered.error
    off_rows = ev.evaluate(CANCELLING_SUM, _candidate("x.double().sum(1).float() + "
                                                      "(torch.arange(x.shape[0], device=x.device) % 50 == 0).float()"),
                       config=CHECK)
    assert off_rows.status == "incorrect" and "float64" in off_rows.error, off_rows.error
    assert "ill_conditioned" in off_rows.flags
    half = ev.evaluate(CANCELLING_SUM, _candidate("x.half().sum(1).float()"), config=CHECK)
    assert half.status == "incorrect" and "ill_conditioned" not in half.flags, half.error


def test_an_accurate_reference_gets_no_second_opinion(ev, relu):
    near = ev.evaluate(relu, _candidate("torch.relu(x) + (torch.rand_like(x) < 0.01).float()"), config=CHECK)
    assert near.status == "incorrect" and "ill_conditioned" not in near.flags
    assert "judged_against_float64" not in near.correctness


def test_an_output_of_rounding_noise_is_unverifiable(ev):
    """Two orders of one sum differ only by rounding (L2/23_Conv3d_GroupNorm_Mean of the official set is the mean of
    a normalised tensor): the exact answer is zero, the reference is noise, and zeros are as right as any kernel."""
    problem = _problem("98_RoundingNoise", "x.sum(1) - x.flip(1).sum(1)", "torch.randn(64, 4096)")
    zeros = ev.evaluate(problem, _candidate("x.new_zeros(x.shape[0])"), config=CHECK)
    assert zeros.status == "correct", zeros.error
    assert {"ill_conditioned", "unverifiable_output"} <= set(zeros.flags)


def test_a_typical_answer_fails_where_answers_move_by_about_the_tolerance(ev):
    """Here answers move ~1.5x the tolerance between inputs (L2/65_Conv2d_AvgPool_Sigmoid_Sum of the official set):
    two trials' answers fail against each other, yet another input's answer can land within the tolerance of both
    (seed 35; with only answers within 1x counted as near, it passed). Answers within 3x count as near, so the
    relative-error test holds it to a fraction of their distance."""
    problem = _problem("99_NearTypical", "x.mean(dim=1) * 0.015 + 1.0", "torch.rand(128, 8192)")
    typical = _candidate("torch.rand(x.shape, generator=torch.Generator().manual_seed(1234)).to(x.device).mean(dim=1) "
                         "* 0.015 + 1.0")
    for seed in (*range(8), 35):
        r = ev.evaluate(problem, typical, seed=seed, config=CHECK)
        assert r.status == "incorrect" or "unverifiable_output" in r.flags, (seed, r.status, r.flags)
    honest = ev.evaluate(problem, _candidate("x.sum(dim=1) / x.shape[1] * 0.015 + 1.0"), seed=35, config=CHECK)
    assert honest.status == "correct" and "unverifiable_output" not in honest.flags, (honest.error, honest.flags)


def test_a_timed_call_that_misses_narrowly_gets_the_float64_opinion_the_trials_did_not_need():
    """The correctness trials' few inputs can all fall where the fp32 reference is exact; then a timed call's
    inputs fall where it is not, and a kernel more exact than the reference failed there (the H200: a mat-vec
    summing in float64 at K = 65536). Each timed call's narrow miss gets the same second opinion."""
    import torch

    from kb_gym.worker.inputs import init_model, make_inputs
    from kb_gym.worker.loading import load_source
    from kb_gym.worker.timed_checks import timed_output_check

    device, dtype = torch.device("cpu"), torch.float32
    module = load_source(CANCELLING_SUM.code, "kb_test_cancelling_sum")
    model = init_model(module, module.Model, 0, device, dtype)
    result: dict = {"flags": []}  # the trials passed without needing float64: no ill_conditioned yet
    check = timed_output_check(device, module, model, dtype, 1e-4, 1e-4, result, {})
    seed = 11
    (x,) = make_inputs(module, seed, device, dtype)
    with torch.no_grad():
        ref = model(x)
    exact = x.double().sum(1).float()
    assert not torch.allclose(exact, ref, atol=1e-4, rtol=1e-4)  # the reference is off on this call's inputs
    assert check(exact, ref, seed) is None and "ill_conditioned" in result["flags"]
    wrong = exact + (torch.arange(x.shape[0]) % 50 == 0).float()
    assert "float64" in (check(wrong, ref, seed) or "")
    assert check(torch.zeros_like(ref), ref, seed)  # a far miss needs no second opinion to fail
