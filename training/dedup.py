"""Identical programs evaluated once: a policy repeats itself, and timing the same program again buys only noise.

Two answers are the same candidate when they name the same problem and the evaluator would extract the same
program from them (prose around the code does not matter; an answer without code is keyed by its whole text).
``DedupEvaluator`` sits in front of any evaluator (a local ``Evaluator`` or the Ray service's client) and hands
every later copy of a program the first one's Future. The reward function keeps one per batch (``dedup="batch"``,
the default: the copies in a GRPO group share one verdict) or one for the whole run (``"run"``; the learning check's
GRPO phase); ``"off"`` evaluates every answer.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future
from typing import Any

from kb_gym.evaluator import MAX_TEXT_CHARS
from kb_gym.extract import extract_code
from kb_gym.problems import Problem

DEDUP_SCOPES = ("off", "batch", "run")


def program_key(problem_key: str, text: str) -> str:
    """What makes two answers the same candidate: the problem and the program the evaluator will extract."""
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        # refused on the text itself, whatever program it holds: its own key, never a short sibling's verdict
        body = "\x00refused\x00" + (text if isinstance(text, str) else repr(type(text)))
    else:
        code = extract_code(text).code
        body = code if code is not None else "\x00no-code\x00" + text
    # surrogatepass: "replace" made a lone surrogate and "?" one program (round 10)
    return problem_key + ":" + hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()


class DedupEvaluator:
    """An evaluator in front of another that evaluates each (problem, program) once and hands every later copy
    the same Future (a failed Future is not reused). Everything else (``store``, ``devices``, ``close``) is the
    inner evaluator's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.cache: dict[str, Future] = {}
        self.hits = 0
        self.misses = 0

    def submit(self, problem: Problem, text: str, **kwargs: Any) -> Future:
        key = program_key(problem.key, text)
        future = self.cache.get(key)
        if future is not None and not (future.done() and future.exception() is not None):
            self.hits += 1
            return future
        self.misses += 1
        future = self.inner.submit(problem, text, **kwargs)
        self.cache[key] = future
        return future

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
