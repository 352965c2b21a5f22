"""Problems as a ``datasets.Dataset`` of prompts, the input TRL's trainers take.

Each row carries the prompt (chat messages, or one string) and the problem's key. TRL passes every
extra column to reward functions by name, so :class:`~kb_gym.training.KernelRewardFunction` finds
the problem a completion answers through ``problem_key``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kb_gym.problems import Problem, exclude_problems, load_problems
from kb_gym.prompts import DEFAULT_BACKEND, PromptBackend, build_messages, build_prompt


def prompt_rows(problems: Sequence[Problem], backend: str | PromptBackend = DEFAULT_BACKEND, *,
                conversational: bool = True, system: bool = True, one_shot: bool = True,
                tool_calls: int | None = None) -> list[dict[str, Any]]:
    """One row per problem: ``prompt``, ``problem_key``, ``level``, ``name``."""
    rows = []
    for p in problems:
        if tool_calls and not conversational:
            raise ValueError("tool-use prompts (tool_calls=) are chat messages: use conversational=True")
        prompt: Any = (build_messages(p.code, backend=backend, one_shot=one_shot, system=system, tool_calls=tool_calls)
                       if conversational else build_prompt(p.code, backend=backend, one_shot=one_shot))
        rows.append({"prompt": prompt, "problem_key": p.key, "level": p.level, "name": p.name})
    return rows


def build_prompt_dataset(dataset: str | Sequence[Problem] = "builtin", *, level: int | None = None,
                         backend: str | PromptBackend = DEFAULT_BACKEND, conversational: bool = True,
                         system: bool = True, one_shot: bool = True, repeat: int = 1,
                         exclude: Sequence[str] | None = None, size: str = "auto",
                         devices: str | Sequence[str] | None = None, tool_calls: int | None = None) -> Any:
    """A ``datasets.Dataset`` of prompts for ``dataset`` (any source :func:`load_problems` takes).

    ``conversational``: ``prompt`` is a list of chat messages (TRL applies the model's chat
    template), else one string. ``system=False`` folds the rules into the user message, for chat
    templates without a system role. ``repeat`` lists every problem that many times (an epoch over a
    small set then holds more steps). ``exclude``: problem keys to leave out (for instance
    ``kb_gym.audit.passable_problems("audit.jsonl")``: problems a trivial output passes). ``size``:
    the problems' size, ``"auto"`` by ``devices`` (the evaluator's: GPU size when all are GPUs; None: by
    whether torch sees a GPU); the reward function must look them up at the same size. ``tool_calls``: for the
    ``submit_kernel`` tool environment, the prompt says to submit through the tool (at most that many calls:
    the factory's ``max_submissions``) instead of answering in a code block.
    """
    from datasets import Dataset

    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    problems = exclude_problems(load_problems(dataset, level=level, size=size, device=devices), exclude)
    rows = prompt_rows(problems, backend, conversational=conversational, system=system, one_shot=one_shot,
                       tool_calls=tool_calls)
    return Dataset.from_list(rows * repeat)
