"""Multi-turn shaping: turn a per-result reward into a per-turn reward for refinement episodes.

Two modes:

* ``"per_step"``: every turn gets its own reward as is. The episode return grows with the
  number of turns, so a policy is paid for staying good, not only for getting better.
* ``"improvement"``: a turn gets ``max(0, reward - best_so_far)``, and the first turn (no best
  yet) gets its reward as is. Because ``best_so_far`` is the running maximum, the rewards of an
  episode telescope: their sum is exactly the best reward reached in the episode. Regressions
  cost nothing (the kernel kept is the best one anyway) and oscillating between a bad and a good
  kernel earns nothing after the first time the good one was reached.

Either way a later result counts above the best only where it beats it by more than timing noise
(``timing_noise_only``): the same kernel submitted again, made "another program" by a no-op statement,
draws its timing again, and the best of several draws of one kernel pays more than the kernel is worth
(red team rounds 10, 11 and 29: 0.4168 for a 1.00x kernel after four draws). ``best_reward`` is the
same rule for a list of results (the tool environment's and the multi-turn rollout's ``"best"``).
"""

from __future__ import annotations

import math
from typing import Any

from kb_gym.result import EvalResult, valid_speedup
from kb_gym.rewards.presets import _get, is_correct, is_penalised, penalised_flags_of
from kb_gym.rewards.registry import RewardFn, finite, get_reward

MODES = ("per_step", "improvement")


def shape_multi_turn(reward: float, best_so_far: float | None, mode: str = "improvement") -> float:
    """Shape one turn's ``reward`` given the best reward of the previous turns (``None``: first turn).

    ``"per_step"`` returns ``reward``; ``"improvement"`` returns ``max(0, reward - best_so_far)``,
    or ``reward`` on the first turn. A non-finite ``best_so_far`` is treated as ``None``.
    """
    if mode not in MODES:
        raise ValueError(f"Unknown multi-turn mode {mode!r}; use one of {', '.join(MODES)}.")
    value = finite(reward)
    if mode == "per_step":
        return value
    if best_so_far is None or not math.isfinite(float(best_so_far)):
        return value
    return max(0.0, value - float(best_so_far))


# Two evaluations of one kernel differ by more than either's interval (each is one judge's run: the baseline's and the
# host's state move between them); reference copies on the H200 read 0.98-1.02, and round 10 drew 0.97-1.06 for one
# 1.00x kernel on this CPU. A later result counts above the best only past this share of its speedup. Under the
# default preset's log2 speed term a 10% gain is worth 0.028: little is lost to an honest small step.
REPEAT_MARGIN = 0.10


def _interval(result: Any) -> tuple[float, float] | None:
    try:
        low, high = (float(v) for v in _get(result, "speedup_ci"))
    except (TypeError, ValueError):
        return None
    return (low, high) if math.isfinite(low) and math.isfinite(high) and low <= high else None


def timing_noise_only(result: Any, best: Any, penalised_flags: Any = None) -> bool:
    """Whether ``result`` differs from ``best`` only by a draw of timing noise: both correct, with the same
    speed credit and usable speedups, ``result``'s no more than REPEAT_MARGIN above the best's or their 95%
    intervals overlapping. Then its higher reward is not counted above the best's. A result with a better
    status or credit, or one faster beyond both, is better. ``penalised_flags``: the reward's own set
    (presets.penalised_flags_of), by which the credit is judged."""
    if best is None or not (is_correct(result) and is_correct(best)):
        return False
    if is_penalised(result, penalised_flags) != is_penalised(best, penalised_flags):
        return False
    speedup, best_speedup = valid_speedup(_get(result, "speedup")), valid_speedup(_get(best, "speedup"))
    if speedup is None or best_speedup is None:
        return False
    if speedup <= best_speedup * (1.0 + REPEAT_MARGIN):
        return True
    ours, theirs = _interval(result), _interval(best)
    return ours is not None and theirs is not None and ours[0] <= theirs[1]


def best_reward(scored: list[tuple[Any, float]], penalised_flags: Any = None) -> float:
    """The best reward of ``(result, reward)`` pairs in submission order, a later one counting above the best so
    far only where it is better by more than timing noise (``timing_noise_only``, under the reward's
    ``penalised_flags``)."""
    best_result, best = None, None
    for result, reward in scored:
        reward = float(reward)
        if best is None or (reward > best and not timing_noise_only(result, best_result, penalised_flags)):
            best_result, best = result, reward
    if best is None:
        raise ValueError("best_reward needs at least one scored result")
    return best


class MultiTurnReward:
    """A stateful per-episode wrapper: call it once per turn, ``reset()`` between episodes.

    Returns ``(shaped, components)`` where components are the base reward's components plus
    ``raw_reward`` (the unshaped reward) and ``shaped_reward``.
    """

    def __init__(self, base: str | RewardFn = "default", mode: str = "improvement", **kwargs: Any) -> None:
        if mode not in MODES:
            raise ValueError(f"Unknown multi-turn mode {mode!r}; use one of {', '.join(MODES)}.")
        self.base = get_reward(base, **kwargs)
        self.penalised_flags = penalised_flags_of(self.base)
        self.mode = mode
        self.best_so_far: float | None = None
        self.best_result: EvalResult | None = None

    def reset(self) -> None:
        """Forget the episode's best reward."""
        self.best_so_far = None
        self.best_result = None

    def __call__(self, result: EvalResult) -> tuple[float, dict[str, float]]:
        raw, components = self.base(result)
        raw = finite(raw)
        # a draw of timing noise above the best counts as the best, not above it
        counted = min(raw, self.best_so_far) if (
            self.best_so_far is not None and timing_noise_only(result, self.best_result, self.penalised_flags)) else raw
        shaped = raw if self.mode == "per_step" else shape_multi_turn(counted, self.best_so_far, self.mode)
        if self.best_so_far is None or counted > self.best_so_far:
            self.best_so_far, self.best_result = counted, result
        return shaped, {**components, "raw_reward": raw, "shaped_reward": shaped}


def improvement_reward(base: str | RewardFn = "default", **kwargs: Any) -> MultiTurnReward:
    """``MultiTurnReward(base, mode="improvement")``: the episode's rewards sum to its best reward."""
    return MultiTurnReward(base, mode="improvement", **kwargs)
