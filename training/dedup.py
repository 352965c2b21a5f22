"""Identical programs evaluated once: a policy repeats itself, and timing the same program again buys only noise.

Two answers are the same candidate when they name the same problem and the evaluator would extract the same
program from them (prose around the code does not matter; an answer without code is keyed by its whole text).
``DedupEvaluator`` sits in front of any evaluator (a local ``Evaluator`` or the Ray service's client) and hands
every later copy of a program the first one's Future. The reward function keeps one per batch (``dedup="batch"``,
the default: the copies in a GRPO group share one verdict) or one for the whole run (``"run"``; the learning check's
GRPO phase); ``"off"`` evaluates every answer.
"""

from __future__ import annotations

import ast
import hashlib
import json
from concurrent.futures import Future
from typing import Any

from kb_gym.config import EvalConfig
from kb_gym.evaluator import MAX_TEXT_CHARS, declared_encoding_error
from kb_gym.extract import extract_code
from kb_gym.integrity.static import MAX_PARSE_CHARS
from kb_gym.problems import Problem

DEDUP_SCOPES = ("off", "batch", "run")
DEFAULT_MAX_SOURCE_CHARS = EvalConfig().max_source_chars


def program_key(problem_key: str, text: str, max_source_chars: int = DEFAULT_MAX_SOURCE_CHARS) -> str:
    """What makes two answers the same candidate: the problem and the program the evaluator will extract;
    ``max_source_chars``: the limit of the config it will be evaluated under."""
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        # refused on the text itself, whatever program it holds: its own key, never a short sibling's verdict
        body = "\x00refused\x00" + (text if isinstance(text, str) else repr(type(text)))
    else:
        code = extract_code(text).code
        if code is None:
            body = "\x00no-code\x00" + text
        elif len(code) > min(MAX_PARSE_CHARS, max_source_chars):
            # refused for its length before anything parses it: keyed by its text, never parsed here either (round
            # 29: a 960 KB program cost the trainer 3.7-5.8 s and ~600 MB to key, and the evaluator 0.2 s to refuse)
            body = "\x00long\x00" + code + _prechecked(code, max_source_chars)
        else:
            body = _program(code) + _prechecked(code, max_source_chars)
    # surrogatepass: "replace" made a lone surrogate and "?" one program (round 10)
    return problem_key + ":" + hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()


class _DropBareStrings(ast.NodeTransformer):
    """String statements do nothing: dropped, as comments and layout are by parsing. Except a docstring (the first
    statement of a module, class or function body): the program can read it (``ModelNew.__doc__``), so two programs
    that differ in one may behave differently (round 29: ``float(ModelNew.__doc__)`` as a scale)."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        keep_first = isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        for name in ("body", "orelse", "finalbody"):
            statements = getattr(node, name, None)
            if isinstance(statements, list):
                setattr(node, name, [st for k, st in enumerate(statements)
                                     if (keep_first and name == "body" and k == 0) or not _bare_string(st)])
        return super().generic_visit(node)


def _bare_string(statement: ast.AST) -> bool:
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def _program(code: str) -> str:
    """The program as the interpreter sees it: a changed comment, blank line, trailing space or bare string is the
    same program (round 11: four such copies of one kernel were four timing draws, and an episode that pays its best
    turn paid the best draw; rewards.multi_turn.best_reward now holds such draws to the first). Source that does
    not parse (or too deep to) is keyed by its text."""
    try:
        return "\x00ast\x00" + ast.dump(_DropBareStrings().visit(ast.parse(code)))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code


def _prechecked(code: str, max_source_chars: int = DEFAULT_MAX_SOURCE_CHARS) -> str:
    """What the evaluator's precheck reads beyond the syntax tree: the code's length against its limits (the
    static checks', and the config's ``max_source_chars``) and a coding declaration. A comment can change each,
    and each changes the verdict (round 13: a 200 KB comment's ``format_error`` was shared with its plain sibling,
    and the sibling's ``correct`` with it; round 29: the same under a config's own limit)."""
    limits = (len(code) > MAX_PARSE_CHARS, len(code) > max_source_chars)
    return f"\x00precheck\x00{limits}{declared_encoding_error(code)}"


def _settings_key(kwargs: dict[str, Any]) -> str:
    """The evaluation settings a submit names (config, seed): another config or seed is another evaluation."""
    config, seed = kwargs.get("config"), kwargs.get("seed")
    settings = config.to_dict() if hasattr(config, "to_dict") else config
    return json.dumps([settings, seed], sort_keys=True, default=repr)


class DedupEvaluator:
    """An evaluator in front of another that evaluates each (problem, program) once and hands every later copy
    the same Future (a failed or cancelled Future is not reused); a submit naming another ``config`` or ``seed``
    is another evaluation. Everything else (``store``, ``devices``, ``close``) is the
    inner evaluator's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.cache: dict[str, Future] = {}
        self.hits = 0
        self.misses = 0

    def submit(self, problem: Problem, text: str, **kwargs: Any) -> Future:
        # under the source limit of the config it will be evaluated with (an EvalConfig; none: the default)
        config = kwargs.get("config") or getattr(self.inner, "config", None)
        key = program_key(problem.key, text, getattr(config, "max_source_chars", DEFAULT_MAX_SOURCE_CHARS))
        if kwargs.get("config") is not None or kwargs.get("seed") is not None:
            key += ":" + hashlib.sha256(_settings_key(kwargs).encode()).hexdigest()
        future = self.cache.get(key)
        # a cancelled Future (a dropped prefetch) or a failed one is evaluated again
        if future is not None and not (future.cancelled() or (future.done() and future.exception() is not None)):
            self.hits += 1
            return future
        self.misses += 1
        future = self.inner.submit(problem, text, **kwargs)
        self.cache[key] = future
        return future

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
