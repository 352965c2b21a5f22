"""Multi-turn shaping: turn a per-result reward into a per-turn reward for refinement episodes.

Two modes:

* ``"per_step"``: every turn gets its own reward as is. The episode return grows with the
  number of turns, so a policy is paid for staying good, not only for getting better.
* ``"improvement"``: a turn gets ``max(0, reward - best_so_far)``, and the first turn (no best
  yet) gets its reward as is. Because ``best_so_far`` is the running maximum, the rewards of an
  episode telescope: their sum is exactly the best reward reached in the episode. Regressions
  cost nothing (the kernel kept is the best one anyway) and oscillating between a bad and a good
  kernel earns nothing after the first time the good one was reached.
"""

from __future__ import annotations

import math
from typing import Any

from kb_gym.result import EvalResult
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


class MultiTurnReward:
    """A stateful per-episode wrapper: call it once per turn, ``reset()`` between episodes.

    Returns ``(shaped, components)`` where components are the base reward's components plus
    ``raw_reward`` (the unshaped reward) and ``shaped_reward``.
    """

    def __init__(self, base: str | RewardFn = "default", mode: str = "improvement", **kwargs: Any) -> None:
        if mode not in MODES:
            raise ValueError(f"Unknown multi-turn mode {mode!r}; use one of {', '.join(MODES)}.")
        self.base = get_reward(base, **kwargs)
        self.mode = mode
        self.best_so_far: float | None = None

    def reset(self) -> None:
        """Forget the episode's best reward."""
        self.best_so_far = None

    def __call__(self, result: EvalResult) -> tuple[float, dict[str, float]]:
        raw, components = self.base(result)
        shaped = shape_multi_turn(raw, self.best_so_far, self.mode)
        raw = finite(raw)
        self.best_so_far = raw if self.best_so_far is None else max(self.best_so_far, raw)
        return shaped, {**components, "raw_reward": raw, "shaped_reward": shaped}


def improvement_reward(base: str | RewardFn = "default", **kwargs: Any) -> MultiTurnReward:
    """``MultiTurnReward(base, mode="improvement")``: the episode's rewards sum to its best reward."""
    return MultiTurnReward(base, mode="improvement", **kwargs)
