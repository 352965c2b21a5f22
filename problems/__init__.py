"""Problems: the model, the loaders and the built-in problem files."""

from kb_gym.problems.loaders import BUILTIN_DIR, exclude_problems, get_problem, load_problems
from kb_gym.problems.problem import Problem, ProblemError, check_problem_code, reference_as_candidate

__all__ = ["BUILTIN_DIR", "Problem", "ProblemError", "check_problem_code", "exclude_problems", "get_problem",
           "load_problems", "reference_as_candidate"]
