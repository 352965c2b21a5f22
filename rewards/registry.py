"""Reward registry: presets picked by name, TRL-style.

A reward is a pure function ``(result: EvalResult, **params) -> (reward, components)`` where
``components`` maps names to floats. :func:`get_reward` turns a name (or a callable) plus
parameters into a one-argument callable ``EvalResult -> (float, dict[str, float])``.

Names may carry parameters in string form, handy on command lines and in configs::

    get_reward("fast_p", p=1.5)      # keyword form
    get_reward("fast_p:1.5")         # first parameter, positionally
    get_reward("fast_p:p=1.5")       # key=value pairs, comma separated
    get_reward("fast_1.5")           # KernelBench spelling of fast_p
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from kb_gym.result import EvalResult

RewardOutput = tuple[float, dict[str, float]]
RewardFn = Callable[..., Any]
BoundReward = Callable[[EvalResult], RewardOutput]

REWARDS: dict[str, RewardFn] = {}
"""Every registered reward, by name. Prefer :func:`register_reward` to writing here directly."""

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_FAST_ALIAS_RE = re.compile(r"^fast_?p?_?(?P<p>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)$")


def register_reward(
    name: str, fn: RewardFn | None = None, *, overwrite: bool = False
) -> RewardFn | Callable[[RewardFn], RewardFn]:
    """Register ``fn`` under ``name``; usable directly or as a decorator.

    ``register_reward("mine", my_fn)`` or::

        @register_reward("mine")
        def my_fn(result, scale=1.0):
            return scale * float(result.correct), {"correct": float(result.correct)}

    A second registration under a taken name raises ``ValueError`` unless ``overwrite=True``.
    Names must look like identifiers (letters, digits, ``_ . -``); ``:`` is reserved for the
    parameter string form (``"name:value"``).
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"Invalid reward name {name!r}: use letters, digits, '_', '.', '-' (no ':').")

    def decorator(func: RewardFn) -> RewardFn:
        if not callable(func):
            raise TypeError(f"Reward {name!r} must be callable, got {type(func).__name__}.")
        if name in REWARDS and not overwrite and REWARDS[name] is not func:
            raise ValueError(f"Reward {name!r} is already registered; pass overwrite=True to replace it.")
        REWARDS[name] = func
        return func

    if fn is None:
        return decorator
    return decorator(fn)


def list_rewards() -> list[str]:
    """Names of every registered reward, sorted."""
    return sorted(REWARDS)


def get_reward(name_or_callable: str | RewardFn, **kwargs: Any) -> BoundReward:
    """Resolve a reward by name (or wrap a callable) and bind its parameters.

    Returns a callable ``EvalResult -> (float, dict[str, float])`` whose ``reward_name`` and
    ``reward_kwargs`` attributes record what was resolved. Unknown names raise ``ValueError``
    listing the known ones; parameters the reward does not take raise ``ValueError`` too.
    Explicit ``kwargs`` win over parameters given in the string form.
    """
    if callable(name_or_callable) and not isinstance(name_or_callable, str):
        fn = name_or_callable
        name = getattr(fn, "reward_name", None) or getattr(fn, "__name__", type(fn).__name__)
        params: dict[str, Any] = {}
    elif isinstance(name_or_callable, str):
        name, fn, params = _resolve_name(name_or_callable.strip())
    else:
        raise TypeError(f"get_reward expects a name or a callable, got {type(name_or_callable).__name__}.")

    params.update(kwargs)
    label = name
    if params:
        label = name + ":" + ",".join(f"{k}={_short(v)}" for k, v in params.items())
    params = _bind_params(name, fn, params)
    return _bound(name, label, fn, params)


def _short(value: Any) -> str:
    simple = isinstance(value, int | float | str | bool) or value is None
    return (str(value) if simple else type(value).__name__)[:40]


def _resolve_name(spec: str) -> tuple[str, RewardFn, dict[str, Any]]:
    if spec in REWARDS:
        return spec, REWARDS[spec], {}
    if ":" in spec:
        base, _, arg_text = spec.partition(":")
        base = base.strip()
        if base in REWARDS:
            fn = REWARDS[base]
            return base, fn, _parse_arg_string(base, fn, arg_text)
    alias = _FAST_ALIAS_RE.match(spec)
    if alias and "fast_p" in REWARDS:
        return "fast_p", REWARDS["fast_p"], {"p": float(alias.group("p"))}
    known = ", ".join(list_rewards()) or "(none registered)"
    raise ValueError(f"Unknown reward {spec!r}. Known rewards: {known}.")


def _parse_arg_string(name: str, fn: RewardFn, text: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    parts = [part.strip() for part in text.split(",") if part.strip()]
    for i, part in enumerate(parts):
        if "=" in part:
            key, _, value = part.partition("=")
            params[key.strip()] = _parse_value(value.strip())
        elif i == 0:
            first = _first_param(fn)
            if first is None:
                raise ValueError(f"Reward {name!r} takes no parameters, got {text!r}.")
            params[first] = _parse_value(part)
        else:
            raise ValueError(
                f"Reward {name!r}: only the first parameter may be given without 'key=': {text!r}."
            )
    return params


def _first_param(fn: RewardFn) -> str | None:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    named = [p for p in parameters[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return named[0].name if named else None


def _parse_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _bind_params(name: str, fn: RewardFn, params: dict[str, Any]) -> dict[str, Any]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None
    if signature is not None and params:
        try:
            signature.bind(None, **params)
        except TypeError as exc:
            raise ValueError(f"Bad parameters for reward {name!r}: {exc}") from None
    prepare = getattr(fn, "prepare_kwargs", None)
    if callable(prepare):
        try:
            params = dict(prepare(**params))
        except TypeError as exc:
            raise ValueError(f"Bad parameters for reward {name!r}: {exc}") from None
    return params


def _bound(name: str, label: str, fn: RewardFn, params: dict[str, Any]) -> BoundReward:
    def reward(result: EvalResult) -> RewardOutput:
        return _normalise_output(fn(result, **params))

    reward.__name__ = re.sub(r"\W", "_", label)
    reward.__qualname__ = reward.__name__
    reward.__doc__ = getattr(fn, "__doc__", None)
    reward.reward_name = name  # type: ignore[attr-defined]
    reward.reward_label = label  # type: ignore[attr-defined]
    reward.reward_kwargs = dict(params)  # type: ignore[attr-defined]
    reward.reward_fn = fn  # type: ignore[attr-defined]
    return reward


def _normalise_output(out: Any) -> RewardOutput:
    """Accept ``(reward, components)`` or a bare number from custom rewards; return floats."""
    if isinstance(out, tuple) and len(out) == 2:
        value, components = out
    else:
        value, components = out, {}
    components = components if isinstance(components, Mapping) else {}
    return float(value), {str(k): float(v) for k, v in components.items()}


def finite(value: Any, fallback: float = 0.0) -> float:
    """``float(value)`` when it is a finite number, else ``fallback``."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return fallback
    return number if math.isfinite(number) else fallback
