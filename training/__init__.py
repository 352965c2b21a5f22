"""TRL integration: prompt datasets, the evaluator as a GRPO reward function, a submit_kernel tool
environment, GRPO training and checkpoint evaluation (``kb-gym train``, ``kb-gym evaluate-model``)."""

from kb_gym.training.dataset import build_prompt_dataset, prompt_rows
from kb_gym.training.errors import ModelLoadError
from kb_gym.training.reward_function import (
    KernelRewardConfig,
    KernelRewardFunction,
    batch_metrics,
    completion_text,
)
from kb_gym.training.rollout import KernelMultiTurnRollout
from kb_gym.training.tool_env import KernelToolEnv, KernelToolEnvFactory, KernelToolReward, overlap_tool_calls

__all__ = ["KernelMultiTurnRollout", "KernelRewardConfig", "KernelRewardFunction", "KernelToolEnv",
           "KernelToolEnvFactory", "KernelToolReward", "ModelLoadError", "batch_metrics", "build_prompt_dataset",
           "completion_text", "overlap_tool_calls", "prompt_rows"]
