"""The Gymnasium environments: KernelBench-L1-v0, -L2-v0, -L3-v0 and KernelBench-v0 (all levels).

``import kb_gym`` registers them, so ``gym.make("KernelBench-L2-v0", dataset="builtin")`` and
``gym.make("kb_gym:KernelBench-L2-v0", ...)`` both work. See docs/environments.md.
"""

from kb_gym.envs.kernelbench import KernelBenchEnv, SharedEvaluator
from kb_gym.envs.registration import ENV_IDS, register_envs
from kb_gym.envs.spaces import CodeText
from kb_gym.envs.vector import KernelBenchVectorEnv, make_vector_env

__all__ = ["ENV_IDS", "CodeText", "KernelBenchEnv", "KernelBenchVectorEnv", "SharedEvaluator", "make_vector_env",
           "register_envs"]
