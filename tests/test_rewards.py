"""Reward presets and the registry (CPU only, fast)."""

from __future__ import annotations

import math

import pytest

from kb_gym.result import EvalResult, Status
from kb_gym.rewards import (
    DEFAULT_PENALISED_FLAGS,
    REWARDS,
    DefaultRewardConfig,
    MultiTurnReward,
    default_reward,
    drkernel_reward,
    fast_p_reward,
    get_reward,
    improvement_reward,
    kevin_reward,
    list_rewards,
    register_reward,
    shape_multi_turn,
)

SPEEDUPS = [1e-9, 0.01, 0.1, 0.25, 0.5, 0.7, 0.99, 1.0, 1.01, 1.5, 2.0, 3.0, 4.0, 7.9, 8.0, 16.0, 1e3, 1e9]
WEIRD_SPEEDUPS = [None, math.nan, math.inf, -math.inf, 0.0, -1.0, -0.0, 1e308, 5e-324]
RUNTIME_FAILURES = ["runtime_error", "timeout", "crash"]


def res(
    status: str = "correct", speedup: float | None = None, flags: list[str] | None = None, **kw
) -> EvalResult:
    return EvalResult(
        status=status,
        problem_name=kw.pop("problem_name", "1_ReLU"),
        level=kw.pop("level", 1),
        correct=status == "correct",
        speedup=speedup,
        flags=list(flags or []),
        **kw,
    )


def reward_of(result, name="default", **kwargs) -> float:
    return get_reward(name, **kwargs)(result)[0]


# --------------------------------------------------------------------------- default


def test_default_status_levels():
    cfg = DefaultRewardConfig()
    assert reward_of(res("format_error")) == cfg.format_error == -1.0
    assert reward_of(res("rejected")) == cfg.rejected == -1.0
    assert reward_of(res("compile_error")) == cfg.compile_error == -0.5
    for status in RUNTIME_FAILURES:
        assert reward_of(res(status)) == -0.3
    assert reward_of(res("incorrect")) == cfg.incorrect == -0.1
    assert reward_of(res("correct", 1.0)) == pytest.approx(cfg.correct_base)


def test_default_ordering_over_statuses_and_speedups():
    fmt = reward_of(res("format_error"))
    rejected = reward_of(res("rejected"))
    compile_error = reward_of(res("compile_error"))
    runtime = [reward_of(res(s)) for s in RUNTIME_FAILURES]
    incorrect = reward_of(res("incorrect"))
    assert max(fmt, rejected) < compile_error <= min(runtime)
    assert max(runtime) < incorrect
    # a failure's speedup field (should it be set) never matters
    for s in SPEEDUPS + WEIRD_SPEEDUPS:
        assert reward_of(res("incorrect", s)) == incorrect
        assert reward_of(res("compile_error", s)) == compile_error
    # correct beats incorrect for ANY speedup, including weird ones
    correct_values = [reward_of(res("correct", s)) for s in SPEEDUPS + WEIRD_SPEEDUPS]
    assert min(correct_values) > incorrect
    assert min(correct_values) >= DefaultRewardConfig().min_correct - 1e-12


def test_default_monotone_in_speedup():
    values = [reward_of(res("correct", s)) for s in SPEEDUPS]
    assert all(b >= a for a, b in zip(values, values[1:], strict=False))
    assert reward_of(res("correct", 2.0)) > reward_of(res("correct", 1.0)) > reward_of(res("correct", 0.6))


def test_default_log_speed_term_is_symmetric_and_clipped():
    cfg = DefaultRewardConfig()
    base = reward_of(res("correct", 1.0))
    up = reward_of(res("correct", 2.0)) - base
    down = base - reward_of(res("correct", 0.5))
    assert up == pytest.approx(down) == pytest.approx(cfg.speed_scale)
    # clipped at log2 in [-1, 3]
    assert reward_of(res("correct", 8.0)) == pytest.approx(cfg.max_correct)
    assert reward_of(res("correct", 1e6)) == pytest.approx(cfg.max_correct)
    assert reward_of(res("correct", 0.5)) == pytest.approx(cfg.min_correct)
    assert reward_of(res("correct", 1e-6)) == pytest.approx(cfg.min_correct)
    assert cfg.min_correct == pytest.approx(0.2) and cfg.max_correct == pytest.approx(1.0)
    r, comp = default_reward(res("correct", 4.0))
    assert comp == pytest.approx({"status": 0.4, "speed": 0.4, "integrity_penalty": 0.0})
    assert r == pytest.approx(0.8)


@pytest.mark.parametrize("flag", sorted(DEFAULT_PENALISED_FLAGS))
def test_default_penalised_flag_removes_speed_and_caps_at_incorrect(flag):
    incorrect = reward_of(res("incorrect"))
    for s in SPEEDUPS + WEIRD_SPEEDUPS:
        r, comp = default_reward(res("correct", s, flags=[flag]))
        assert r <= incorrect
        assert r == incorrect
        assert math.isfinite(r)
        assert comp["integrity_penalty"] <= 0.0
        assert comp["status"] + comp["speed"] + comp["integrity_penalty"] == pytest.approx(r)
    # failures stay at their own (lower) level: the cap never raises a reward
    assert reward_of(res("compile_error", flags=[flag])) == reward_of(res("compile_error"))
    assert reward_of(res("incorrect", flags=[flag])) == incorrect


def test_default_flag_normalisation_and_unknown_flags():
    incorrect = reward_of(res("incorrect"))
    assert reward_of(res("correct", 4.0, flags=["EXCESSIVE_SPEEDUP: 400x"])) == incorrect
    assert reward_of(res("correct", 4.0, flags=["something_new", "note"])) == reward_of(res("correct", 4.0))


def test_degenerate_problem_alone_does_not_penalise():
    for s in SPEEDUPS:
        assert reward_of(res("correct", s, flags=["degenerate_problem"])) == reward_of(res("correct", s))
    assert reward_of(res("correct", 2.0, flags=["degenerate_problem", "decoy"])) == reward_of(
        res("incorrect")
    )


def test_default_config_overrides_and_validation():
    assert reward_of(res("incorrect"), incorrect=-0.2) == -0.2
    cfg = DefaultRewardConfig(speed_scale=0.25, correct_base=0.5)
    assert reward_of(res("correct", 2.0), config=cfg) == pytest.approx(0.75)
    # custom penalised set
    assert reward_of(res("correct", 2.0, flags=["fallback"]), penalised_flags=["decoy"]) == pytest.approx(0.6)
    with pytest.raises(ValueError):
        DefaultRewardConfig(incorrect=-0.6)  # below the runtime failures
    with pytest.raises(ValueError):
        DefaultRewardConfig(correct_base=0.0)  # slowest correct (-0.2) would not beat incorrect (-0.1)
    with pytest.raises(ValueError):
        DefaultRewardConfig(compile_error=math.nan)
    with pytest.raises(ValueError):
        get_reward("default", bogus=1.0)
    with pytest.raises(ValueError):
        get_reward("default", incorrect=0.5)


# --------------------------------------------------------------------------- fast_p / kevin / drkernel


def test_fast_p_strictness():
    assert reward_of(res("correct", 1.0), "fast_p") == 0.0  # p defaults to 1.0; speedup == p is not fast
    assert reward_of(res("correct", 1.0 + 1e-9), "fast_p") == 1.0
    assert reward_of(res("correct", 1.5), "fast_p", p=1.5) == 0.0
    assert reward_of(res("correct", 1.51), "fast_p", p=1.5) == 1.0
    assert reward_of(res("incorrect", 10.0), "fast_p", p=1.5) == 0.0
    assert reward_of(res("correct", 0.1), "fast_p", p=0.0) == 1.0
    assert reward_of(res("correct", None), "fast_p", p=0.0) == 0.0
    for s in SPEEDUPS:
        assert fast_p_reward(res("correct", s), p=2.0)[0] == (1.0 if s > 2.0 else 0.0)


def test_fast_p_flags_zero_it():
    r, comp = fast_p_reward(res("correct", 5.0, flags=["side_stream"]), p=1.0)
    assert r == 0.0 and comp == {"fast": 1.0, "integrity_penalty": -1.0}
    assert fast_p_reward(res("correct", 5.0, flags=["degenerate_problem"]), p=1.0)[0] == 1.0


def test_fast_p_string_forms():
    r = res("correct", 1.7)
    for spec in ("fast_p:1.5", "fast_p:p=1.5", "fast_1.5", "fast_p1.5", " fast_p : 1.5"):
        fn = get_reward(spec)
        assert fn.reward_name == "fast_p"
        assert fn.reward_kwargs["p"] == 1.5
        assert fn(r)[0] == 1.0
    assert get_reward("fast_2")(r)[0] == 0.0
    assert get_reward("fast_p:2", p=1.0)(r)[0] == 1.0  # explicit kwargs win
    with pytest.raises(ValueError):
        get_reward("fast_p:abc")


def test_kevin_formula():
    assert kevin_reward(res("correct", 2.0))[0] == pytest.approx(0.3 + 2.0)
    assert kevin_reward(res("correct", 0.5))[0] == pytest.approx(0.8)
    assert kevin_reward(res("correct", None))[0] == pytest.approx(0.3)
    assert kevin_reward(res("incorrect", 2.0))[0] == 0.0
    assert kevin_reward(res("compile_error"))[0] == 0.0
    r, comp = kevin_reward(res("correct", 2.0, flags=["tampering"]))
    assert r == pytest.approx(0.3)
    assert comp == pytest.approx({"correct": 0.3, "speed": 2.0, "integrity_penalty": -2.0})


def test_drkernel_formula():
    assert drkernel_reward(res("correct", 2.0))[0] == pytest.approx(0.5 + 0.5 * 2.0)
    assert drkernel_reward(res("correct", 10.0))[0] == pytest.approx(0.5 + 0.5 * 3.0)
    assert drkernel_reward(res("correct", 0.4))[0] == pytest.approx(0.7)
    assert drkernel_reward(res("correct", None))[0] == pytest.approx(0.5)
    assert drkernel_reward(res("runtime_error", 2.0))[0] == 0.0
    assert drkernel_reward(res("correct", 10.0, flags=["replay"]))[0] == pytest.approx(0.5)


@pytest.mark.parametrize("name", ["default", "fast_p", "kevin", "drkernel"])
def test_weird_results_give_finite_rewards(name):
    fn = get_reward(name)
    flag_sets = [[], ["fallback"], ["degenerate_problem"], ["???", ""], None]
    for status in [s.value for s in Status]:
        for s in WEIRD_SPEEDUPS + SPEEDUPS:
            for flags in flag_sets:
                result = res(status, s)
                result.flags = flags  # even a None where a list belongs
                r, comp = fn(result)
                assert isinstance(r, float) and math.isfinite(r), (status, s, flags, r)
                assert all(isinstance(v, float) and math.isfinite(v) for v in comp.values())
                assert sum(comp.values()) == pytest.approx(r)
    # plain dicts and odd fields, too
    for odd in [{}, {"status": "mystery"}, {"status": "correct", "speedup": "fast"}, {"status": None}]:
        r, _ = fn(odd)
        assert math.isfinite(r)


def test_weird_speedup_earns_no_speed_credit():
    base = reward_of(res("correct", 1.0))
    for s in WEIRD_SPEEDUPS[:-2]:  # None, nan, +-inf, 0, negatives
        assert reward_of(res("correct", s)) == pytest.approx(base)
        assert reward_of(res("correct", s), "kevin") == pytest.approx(0.3)


# --------------------------------------------------------------------------- registry


def test_builtin_presets_registered():
    assert {"default", "fast_p", "kevin", "drkernel"} <= set(list_rewards())
    assert list_rewards() == sorted(REWARDS)
    assert REWARDS["default"] is default_reward


def test_unknown_name_lists_known():
    with pytest.raises(ValueError) as info:
        get_reward("no_such_reward")
    message = str(info.value)
    assert "no_such_reward" in message
    for name in ("default", "fast_p", "kevin", "drkernel"):
        assert name in message


def test_custom_registration_and_duplicates():
    name = "test_only_correctness"
    try:

        @register_reward(name)
        def correctness(result, scale: float = 1.0):
            value = scale * float(result.status == "correct")
            return value, {"correct": value}

        assert name in list_rewards()
        assert get_reward(name)(res("correct", 1.0)) == (1.0, {"correct": 1.0})
        assert get_reward(name, scale=2.0)(res("correct", 1.0))[0] == 2.0
        assert get_reward(f"{name}:3")(res("correct", 1.0))[0] == 3.0
        with pytest.raises(ValueError):
            get_reward(name, nope=1)

        with pytest.raises(ValueError, match="already registered"):
            register_reward(name, lambda result: (0.0, {}))
        register_reward(name, lambda result: 0.5, overwrite=True)  # a bare number is accepted
        assert get_reward(name)(res("incorrect")) == (0.5, {})
        with pytest.raises(ValueError):
            register_reward("bad:name", lambda result: (0.0, {}))
    finally:
        REWARDS.pop(name, None)


def test_get_reward_accepts_callables():
    fn = get_reward(lambda result, bonus=0.0: (1.0 + bonus, {"x": 1}), bonus=0.5)
    assert fn(res("correct")) == (1.5, {"x": 1.0})
    assert get_reward(default_reward)(res("incorrect"))[0] == -0.1
    with pytest.raises(TypeError):
        get_reward(42)


# --------------------------------------------------------------------------- multi-turn


def test_shape_multi_turn_modes():
    assert shape_multi_turn(0.5, 0.9, "per_step") == 0.5
    assert shape_multi_turn(0.5, None, "improvement") == 0.5
    assert shape_multi_turn(-0.5, None, "improvement") == -0.5
    assert shape_multi_turn(0.5, 0.2, "improvement") == pytest.approx(0.3)
    assert shape_multi_turn(0.1, 0.2, "improvement") == 0.0
    assert shape_multi_turn(math.nan, 0.2, "improvement") == 0.0
    with pytest.raises(ValueError):
        shape_multi_turn(0.0, None, "bogus")


def test_improvement_rewards_sum_to_best():
    turns = [
        res("compile_error"),
        res("correct", 2.0),
        res("incorrect"),
        res("correct", 4.0),
        res("correct", 1.0),
    ]
    shaper = improvement_reward("default")
    shaped = [shaper(t)[0] for t in turns]
    raw = [reward_of(t) for t in turns]
    assert sum(shaped) == pytest.approx(max(raw))
    assert all(v >= 0 for v in shaped[1:])
    shaper.reset()
    assert shaper(res("incorrect"))[0] == pytest.approx(-0.1)
    per_step = MultiTurnReward("default", mode="per_step")
    assert [per_step(t)[0] for t in turns] == pytest.approx(raw)
