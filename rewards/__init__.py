"""Reward presets for kb_gym, picked by name (``get_reward("default")``, ``get_reward("fast_p", p=1.5)``).

See docs/rewards.md for the formulas and why they are shaped that way.
"""

from kb_gym.rewards.multi_turn import MultiTurnReward, improvement_reward, shape_multi_turn
from kb_gym.rewards.presets import (
    DEFAULT_PENALISED_FLAGS,
    DefaultRewardConfig,
    default_reward,
    drkernel_reward,
    fast_p_reward,
    is_correct,
    is_penalised,
    kevin_reward,
    penalised_flags_of,
    speed_term,
    valid_speedup,
)
from kb_gym.rewards.registry import REWARDS, get_reward, list_rewards, register_reward

__all__ = [
    "DEFAULT_PENALISED_FLAGS",
    "REWARDS",
    "DefaultRewardConfig",
    "MultiTurnReward",
    "default_reward",
    "drkernel_reward",
    "fast_p_reward",
    "get_reward",
    "improvement_reward",
    "is_correct",
    "is_penalised",
    "penalised_flags_of",
    "kevin_reward",
    "list_rewards",
    "register_reward",
    "shape_multi_turn",
    "speed_term",
    "valid_speedup",
]
