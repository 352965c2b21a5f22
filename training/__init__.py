"""TRL integration: prompt datasets and the evaluator as a GRPO reward function."""

from kb_gym.training.dataset import build_prompt_dataset, prompt_rows
from kb_gym.training.reward_function import (
    KernelRewardConfig,
    KernelRewardFunction,
    batch_metrics,
    completion_text,
)

__all__ = ["KernelRewardConfig", "KernelRewardFunction", "batch_metrics", "build_prompt_dataset",
           "completion_text", "prompt_rows"]
