"""Reward presets. Each is a pure function ``(result, **params) -> (reward, components)``.

Components sum to the reward (up to float rounding), so a training log can show where the reward came from:
``status``/``correct`` (what the verdict earned), ``speed`` (what the timing earned, before
integrity) and ``integrity_penalty`` (what integrity flags took away, <= 0). See docs/rewards.md.

The presets never raise on an odd result: ``speedup`` of ``None``, NaN, +/-inf, zero or a
negative number earns no speed credit; unknown statuses score like a format error; unknown
flags are ignored. The functions also accept plain dicts (one JSONL line) in place of an
:class:`~kb_gym.result.EvalResult`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kb_gym.result import EvalResult, Status, flag_names, valid_speedup
from kb_gym.rewards.registry import finite, register_reward

DEFAULT_PENALISED_FLAGS: frozenset[str] = frozenset(
    {
        "no_custom_kernel",
        "token_kernel",
        "fallback",
        "decoy",
        "input_mutation",
        "side_stream",
        "excessive_speedup",
        "tampering",
        "replay",
        "unverifiable_output",
    }
)
"""Integrity flags that remove speed credit. ``degenerate_problem`` is deliberately absent: it
describes the problem (e.g. an output that is constant), not something the candidate did."""

ResultLike = EvalResult | Mapping[str, Any]


# --------------------------------------------------------------------------- helpers


def _get(result: Any, name: str, default: Any = None) -> Any:
    if isinstance(result, Mapping):
        return result.get(name, default)
    return getattr(result, name, default)


def result_status(result: Any) -> str:
    """The status string (``"correct"``, ``"compile_error"``...), lower-cased; ``""`` if absent."""
    status = _get(result, "status")
    if isinstance(status, Status):
        return status.value
    if status is None:
        return ""
    return str(status).strip().lower()


def is_correct(result: Any) -> bool:
    """The status is authoritative: correct means ``status == "correct"``."""
    return result_status(result) == Status.CORRECT.value


def _penalised_set(penalised_flags: Iterable[str] | None) -> frozenset[str]:
    if penalised_flags is None:
        return DEFAULT_PENALISED_FLAGS
    if isinstance(penalised_flags, str):
        penalised_flags = [penalised_flags]
    return frozenset(str(f).strip().lower() for f in penalised_flags)


def is_penalised(result: Any, penalised_flags: Iterable[str] | None = None) -> bool:
    """Whether the result earns no speed credit: the evaluator's integrity policy denied it
    (``speed_credit`` False), or it carries a flag of ``penalised_flags`` (the preset's set by default).

    The policy's verdict is never overridden by a flag set: every preset used to pass its set, so
    the flags the policy penalises beyond it (``unverified_timing``, ``pytorch_compiler``,
    ``precision_change``, ``unlisted_import``, ...) were paid their claimed speedup (red team round 29).
    A laxer policy is chosen in ``EvalConfig(integrity=...)``; ``penalised_flags`` only adds to it.
    """
    if _get(result, "speed_credit") is False:
        return True
    return bool(flag_names(_get(result, "flags")) & _penalised_set(penalised_flags))


def penalised_flags_of(reward: Any) -> frozenset[str] | None:
    """The flag set a bound reward (``get_reward``) penalises beyond the policy's verdict, or None (the default
    set): what code beside the reward (the env's ``solved``, the best-of-episode rule) must judge a result by, so
    that it never calls a result credited that the reward penalised (red team round 30)."""
    kwargs = getattr(reward, "reward_kwargs", None) or {}
    if kwargs.get("penalised_flags") is not None:
        return _penalised_set(kwargs["penalised_flags"])
    config = kwargs.get("config")
    flags = getattr(config, "penalised_flags", None)
    return frozenset(flags) if flags is not None else None


# --------------------------------------------------------------------------- default


@dataclass(frozen=True)
class DefaultRewardConfig:
    """Constants of the ``default`` shaped reward.

    Failure levels follow the order a candidate fails in (format, compile, run, check), so
    every stage passed is worth more than the one before it. A correct kernel earns::

        correct_base + speed_scale * clip(log2(speedup), log2_speedup_min, log2_speedup_max)

    i.e. 0.2 (2x slower or worse) .. 0.4 (as fast as the baseline) .. 1.0 (8x faster or more).
    The lowest correct reward (0.2) stays above ``incorrect`` (-0.1): being correct always pays.
    Validation in ``__post_init__`` enforces
    ``format_error, rejected < compile_error <= runtime failures < incorrect < min correct``.
    """

    format_error: float = -1.0
    rejected: float = -1.0
    compile_error: float = -0.5
    runtime_error: float = -0.3
    timeout: float = -0.3
    crash: float = -0.3
    incorrect: float = -0.1
    correct_base: float = 0.4
    speed_scale: float = 0.2
    log2_speedup_min: float = -1.0
    log2_speedup_max: float = 3.0
    unknown_status: float = -1.0
    penalised_flags: frozenset[str] = field(default=DEFAULT_PENALISED_FLAGS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "penalised_flags", _penalised_set(self.penalised_flags))
        for f in dataclasses.fields(self):
            if f.name == "penalised_flags":
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"DefaultRewardConfig.{f.name} must be a finite number, got {value!r}.")
        if self.speed_scale < 0:
            raise ValueError("speed_scale must be >= 0.")
        if not self.log2_speedup_min <= 0.0 <= self.log2_speedup_max:
            raise ValueError("Need log2_speedup_min <= 0 <= log2_speedup_max.")
        runtime_levels = (self.runtime_error, self.timeout, self.crash)
        ordered = (
            max(self.format_error, self.rejected) < self.compile_error <= min(runtime_levels)
            and max(runtime_levels) < self.incorrect < self.min_correct
        )
        if not ordered:
            raise ValueError(
                "DefaultRewardConfig must keep format_error, rejected < compile_error <= "
                "runtime_error, timeout, crash < incorrect < correct_base + speed_scale * log2_speedup_min."
            )

    @property
    def min_correct(self) -> float:
        """The reward of the slowest correct kernel."""
        return self.correct_base + self.speed_scale * self.log2_speedup_min

    @property
    def max_correct(self) -> float:
        """The reward of the fastest correct kernel."""
        return self.correct_base + self.speed_scale * self.log2_speedup_max

    def status_value(self, status: str) -> float:
        """The reward level of a status; ``correct`` maps to ``correct_base``."""
        if status == Status.CORRECT.value:
            return self.correct_base
        value = getattr(self, status, None) if status in _FAILURE_STATUSES else None
        return float(value) if value is not None else self.unknown_status


_FAILURE_STATUSES = frozenset(s.value for s in Status if s is not Status.CORRECT)
DEFAULT_CONFIG = DefaultRewardConfig()


def speed_term(speedup: Any, config: DefaultRewardConfig = DEFAULT_CONFIG) -> float:
    """``speed_scale * clip(log2(speedup), min, max)``; 0 when the speedup is unusable."""
    value = valid_speedup(speedup)
    if value is None:
        return 0.0
    log2 = min(max(math.log2(value), config.log2_speedup_min), config.log2_speedup_max)
    return config.speed_scale * log2


def _default_prepare(config: DefaultRewardConfig | None = None, **overrides: Any) -> dict[str, Any]:
    base = config if config is not None else DEFAULT_CONFIG
    if not isinstance(base, DefaultRewardConfig):
        raise TypeError(f"config must be a DefaultRewardConfig, got {type(base).__name__}")
    if overrides:
        base = dataclasses.replace(base, **overrides)
    return {"config": base}


@register_reward("default")
def default_reward(
    result: ResultLike, config: DefaultRewardConfig | None = None, **overrides: Any
) -> tuple[float, dict[str, float]]:
    """Shaped reward: status level, plus a clipped log2-speedup term when correct.

    ``reward = status + speed + integrity_penalty`` where ``status`` is the level of the verdict
    (``correct_base`` when correct), ``speed = speed_scale * clip(log2(speedup), -1, 3)`` when
    correct (0 otherwise), and ``integrity_penalty`` (<= 0) removes the speed credit and caps the
    reward at the ``incorrect`` level when a penalised flag is present. Overrides of the config
    fields may be passed as keywords (``get_reward("default", incorrect=-0.2)``).
    """
    cfg = config if config is not None else DEFAULT_CONFIG
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    status = result_status(result)
    status_value = cfg.status_value(status)
    speed = speed_term(_get(result, "speedup"), cfg) if status == Status.CORRECT.value else 0.0
    reward = status_value + speed
    penalty = 0.0
    if is_penalised(result, cfg.penalised_flags):
        capped = min(status_value, cfg.incorrect)
        penalty = capped - reward
        reward = capped  # exactly the cap, not a sum that rounding could lift above it
    reward = finite(reward, cfg.unknown_status)
    return reward, {"status": status_value, "speed": speed, "integrity_penalty": penalty}


default_reward.prepare_kwargs = _default_prepare  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- fast_p


def _fast_p_prepare(p: Any = 1.0, penalised_flags: Iterable[str] | None = None) -> dict[str, Any]:
    try:
        threshold = float(p)
    except (TypeError, ValueError):
        raise TypeError(f"p must be a number, got {p!r}") from None
    if math.isnan(threshold):
        raise TypeError("p must not be NaN")
    return {"p": threshold, "penalised_flags": _penalised_set(penalised_flags)}


@register_reward("fast_p")
def fast_p_reward(
    result: ResultLike, p: float = 1.0, penalised_flags: Iterable[str] | None = None
) -> tuple[float, dict[str, float]]:
    """KernelBench's fast_p as a per-sample reward: 1 if correct and ``speedup > p`` (strict), else 0.

    A penalised integrity flag zeroes it. ``speedup == p`` earns 0; an unusable speedup earns 0.
    """
    speedup = valid_speedup(_get(result, "speedup"))
    fast = 1.0 if is_correct(result) and speedup is not None and speedup > float(p) else 0.0
    penalty = -fast if is_penalised(result, penalised_flags) else 0.0
    return fast + penalty, {"fast": fast, "integrity_penalty": penalty}


fast_p_reward.prepare_kwargs = _fast_p_prepare  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- kevin / drkernel


def _flags_prepare(penalised_flags: Iterable[str] | None = None) -> dict[str, Any]:
    return {"penalised_flags": _penalised_set(penalised_flags)}


@register_reward("kevin")
def kevin_reward(
    result: ResultLike, penalised_flags: Iterable[str] | None = None
) -> tuple[float, dict[str, float]]:
    """Kevin-style: ``0.3 * correct + speedup * correct`` (speedup 0 when unusable; unclipped).

    A penalised integrity flag removes the speedup term (the 0.3 for correctness stays).
    """
    correct = 1.0 if is_correct(result) else 0.0
    speed = (valid_speedup(_get(result, "speedup")) or 0.0) * correct
    penalty = -speed if is_penalised(result, penalised_flags) else 0.0
    base = 0.3 * correct
    components = {"correct": base, "speed": speed, "integrity_penalty": penalty}
    return finite(base + speed + penalty, base), components


kevin_reward.prepare_kwargs = _flags_prepare  # type: ignore[attr-defined]


@register_reward("drkernel")
def drkernel_reward(
    result: ResultLike, penalised_flags: Iterable[str] | None = None
) -> tuple[float, dict[str, float]]:
    """Dr.Kernel-style: ``0.5 * correct + 0.5 * min(speedup, 3) * correct`` (range 0 .. 2).

    A penalised integrity flag removes the speedup term (the 0.5 for correctness stays).
    """
    correct = 1.0 if is_correct(result) else 0.0
    speed = 0.5 * min(valid_speedup(_get(result, "speedup")) or 0.0, 3.0) * correct
    penalty = -speed if is_penalised(result, penalised_flags) else 0.0
    base = 0.5 * correct
    return base + speed + penalty, {"correct": base, "speed": speed, "integrity_penalty": penalty}


drkernel_reward.prepare_kwargs = _flags_prepare  # type: ignore[attr-defined]
