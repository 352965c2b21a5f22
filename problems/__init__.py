"""Problems: the model, the loaders, sizes and splits, and the built-in problem files."""

from kb_gym.problems.loaders import (
    BUILTIN_DIR,
    SPLITS,
    assign_splits,
    exclude_problems,
    get_problem,
    load_problems,
    select_split,
    split_hash,
)
from kb_gym.problems.problem import Problem, ProblemError, check_problem_code, reference_as_candidate
from kb_gym.problems.sizes import SIZE_CHOICES, SIZES, sized_code

__all__ = ["BUILTIN_DIR", "SIZES", "SIZE_CHOICES", "SPLITS", "Problem", "ProblemError", "assign_splits",
           "check_problem_code", "exclude_problems", "get_problem", "load_problems", "reference_as_candidate",
           "select_split", "sized_code", "split_hash"]
