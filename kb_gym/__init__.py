"""kb_gym: Gymnasium environments and a trustworthy evaluator for KernelBench-style kernels.

``import kb_gym`` registers the environments (KernelBench-L1-v0, -L2-v0, -L3-v0, KernelBench-v0).
"""

from kb_gym.config import EvalConfig
from kb_gym.evaluator import Evaluator, evaluate
from kb_gym.problems import Problem, ProblemError, get_problem, load_problems
from kb_gym.result import EvalResult, Status

__version__ = "0.1.0"

__all__ = ["EvalConfig", "EvalResult", "Evaluator", "Problem", "ProblemError", "Status", "evaluate",
           "get_problem", "load_problems", "__version__"]
from kb_gym.envs.registration import register_envs  # noqa: E402, I001
register_envs()
