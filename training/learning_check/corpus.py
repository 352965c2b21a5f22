"""The learning check's supervised corpus: for each training problem, answers that are correct, correct but
slow, or broken, in the fenced form a policy is asked for.

Why these three: a policy trained from scratch has no idea of kernels, so supervision gives it a *mixture* of
behaviours on every prompt (write the kernel, write it wastefully, get it wrong in one of several ways). GRPO
with the evaluator's reward should then move probability towards the modes that earn more (correct, then
fast). Every prompt gets the same mix, so the mode is not predictable from the problem: what GRPO learns is
a preference, not a lookup.

- correct: our Triton solution (``problems/builtin/solutions``; CUDA ones for ``backend="cuda"``) where the
  problem has one, else the reference itself renamed to ``ModelNew`` (correct, and flagged ``no_custom_kernel``
  by the evaluator: no speed credit).
- slow: the correct answer whose ``forward`` runs its work 2 or 3 times and returns the last result.
- broken: one of ``BROKEN_KINDS``: a wrong value, a syntax error, a runtime error (an undefined helper), an
  answer cut off mid-program, a class not named ``ModelNew``, or prose without code.

Deterministic in the seed: the same options give the same rows, in the same order, on every machine.
"""

from __future__ import annotations

import ast
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kb_gym.problems import BUILTIN_DIR, Problem, reference_as_candidate
from kb_gym.prompts import fence
from kb_gym.training.dataset import prompt_rows

KINDS = ("correct", "slow", "broken")
BROKEN_KINDS = ("wrong_value", "syntax_error", "runtime_error", "truncated", "no_modelnew", "no_code")
LEAD = "Here is the complete program with the custom kernels:\n\n"
NO_CODE = "I cannot write a faster kernel for this program."
_SPLIT_NAME = "_forward_once"


@dataclass(frozen=True)
class CorpusRow:
    """One supervised example: the prompt our datasets build, an answer, and what kind of answer it is.

    ``expect_correct`` is what the evaluator should say (the corpus check compares it with real verdicts).
    """

    problem_key: str
    kind: str
    variant: str
    prompt: list[dict[str, str]]
    completion: str
    expect_correct: bool

    def to_dict(self) -> dict[str, Any]:
        return {"problem_key": self.problem_key, "kind": self.kind, "variant": self.variant, "prompt": self.prompt,
                "completion": self.completion, "expect_correct": self.expect_correct}


def parse_mix(text: str | Mapping[str, float]) -> dict[str, float]:
    """``"correct=0.4,slow=0.2,broken=0.4"`` (or a mapping) -> shares that sum to 1, every kind present."""
    raw = dict(text) if isinstance(text, Mapping) else {}
    if isinstance(text, str):
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"mix entry {part!r}: write KIND=SHARE, e.g. correct=0.4")
            raw[name.strip()] = float(value)
    unknown = set(raw) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown answer kind(s) {sorted(unknown)} in the mix; known: {', '.join(KINDS)}")
    if any(v < 0 for v in raw.values()) or sum(raw.values()) <= 0:
        raise ValueError(f"mix shares must be >= 0 and not all 0, got {raw}")
    total = sum(raw.values())
    return {k: raw.get(k, 0.0) / total for k in KINDS}


def allocate(n: int, mix: Mapping[str, float]) -> dict[str, int]:
    """``n`` answers split by ``mix`` with the largest-remainder rule (exact total, ties in KINDS order)."""
    exact = {k: n * mix.get(k, 0.0) for k in KINDS}
    counts = {k: int(v) for k, v in exact.items()}
    for k in sorted(KINDS, key=lambda k: (-(exact[k] - counts[k]), KINDS.index(k)))[:n - sum(counts.values())]:
        counts[k] += 1
    return counts


def solution_for(problem: Problem, backend: str = "triton", solutions_dir: Path = BUILTIN_DIR / "solutions"
                 ) -> str | None:
    """Our solution of a built-in problem in ``backend``'s kernel language, if there is one
    (``solutions/levelN/NAME.py``). Why the language check: a CUDA answer to a prompt that asks for Triton
    would teach the policy to ignore the prompt (and costs an nvcc build per evaluation)."""
    path = solutions_dir / f"level{problem.level}" / f"{problem.name}.py"
    if not path.is_file():
        return None
    code = path.read_text(encoding="utf-8")
    cuda = "load_inline" in code
    if backend == "cuda":
        return code if cuda else None
    return code if not cuda and "triton" in code else None


def correct_code(problem: Problem, backend: str = "triton") -> tuple[str, str]:
    """(code, variant): our solution in ``backend``'s language where one exists, else the reference renamed to
    ModelNew."""
    solution = solution_for(problem, backend)
    if solution is not None:
        return solution, f"{backend}_solution"
    return reference_as_candidate(problem), "reference_copy"


def _modelnew_forward(code: str) -> tuple[ast.ClassDef, ast.FunctionDef]:
    tree = ast.parse(code)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    return node, item
    raise ValueError("no ModelNew.forward in the code")


def wrap_forward(code: str, body: Sequence[str]) -> str:
    """``ModelNew.forward`` renamed to ``_forward_once`` and a new ``forward`` whose body is ``body`` (lines
    without indentation; ``args`` holds the call's arguments)."""
    cls, forward = _modelnew_forward(code)
    lines = code.splitlines()
    def_line = lines[forward.lineno - 1]
    indent = def_line[:len(def_line) - len(def_line.lstrip())]
    lines[forward.lineno - 1] = def_line.replace("def forward(", f"def {_SPLIT_NAME}(", 1)
    inner = indent + "    "
    added = ["", f"{indent}def forward(self, *args):", *(inner + line for line in body)]
    end = cls.end_lineno or len(lines)
    return "\n".join(lines[:end] + added + lines[end:]) + "\n"


def slow_code(code: str, repeats: int) -> str:
    """The same result, computed ``repeats`` times: correct, and slower by about that factor."""
    return wrap_forward(code, ["out = None", f"for _ in range({repeats}):", f"    out = self.{_SPLIT_NAME}(*args)",
                               "return out"])


def broken_code(code: str, kind: str, rng: random.Random) -> str | None:
    """The code broken one way (None: ``no_code``, an answer without a program)."""
    if kind == "wrong_value":
        return wrap_forward(code, [f"return self.{_SPLIT_NAME}(*args) * 1.5 + 0.25"])
    if kind == "runtime_error":
        return wrap_forward(code, [f"return _launch_fused_kernel(self.{_SPLIT_NAME}(*args))"])
    if kind == "syntax_error":
        return code.replace("class ModelNew(nn.Module):", "class ModelNew(nn.Module)", 1)
    if kind == "truncated":  # cut inside ModelNew.forward, so what is left can never be the whole answer
        _, forward = _modelnew_forward(code)
        last = max(forward.lineno, (forward.end_lineno or forward.lineno) - 1)
        return "\n".join(code.splitlines()[:rng.randint(forward.lineno, last)]) + "\n"
    if kind == "no_modelnew":
        return code.replace("class ModelNew(", "class KernelModel(").replace("super(ModelNew, self)", "super()")
    if kind == "no_code":
        return None
    raise ValueError(f"unknown broken kind {kind!r}; known: {', '.join(BROKEN_KINDS)}")


def answer_text(code: str | None, *, closed: bool = True) -> str:
    """The assistant's answer: a short lead-in and the fenced program (``closed=False``: cut off mid-block)."""
    if code is None:
        return NO_CODE
    if not closed:
        return LEAD + "```python\n" + code
    return LEAD + fence(code)


def problem_rows(problem: Problem, prompt: list[dict[str, str]], n: int, mix: Mapping[str, float],
                 rng: random.Random, backend: str = "triton") -> list[CorpusRow]:
    """``n`` answers for one problem, split by ``mix``, in a seeded order."""
    base, variant = correct_code(problem, backend)
    rows = []
    for kind, count in allocate(n, mix).items():
        for _ in range(count):
            if kind == "correct":
                rows.append(CorpusRow(problem.key, kind, variant, prompt, answer_text(base), True))
            elif kind == "slow":
                repeats = rng.choice((2, 3))
                rows.append(CorpusRow(problem.key, kind, f"{variant}_x{repeats}", prompt,
                                      answer_text(slow_code(base, repeats)), True))
            else:
                broken = rng.choice(BROKEN_KINDS)
                text = answer_text(broken_code(base, broken, rng), closed=broken != "truncated")
                rows.append(CorpusRow(problem.key, kind, broken, prompt, text, False))
    rng.shuffle(rows)
    return rows


def build_corpus(problems: Sequence[Problem], *, per_problem: int, mix: Mapping[str, float], seed: int,
                 backend: str = "triton", one_shot: bool = False) -> list[CorpusRow]:
    """Every problem's ``per_problem`` answers; prompts exactly as ``build_prompt_dataset`` makes them (so the
    supervised prompts are the ones GRPO and the evaluation show)."""
    if per_problem < 1:
        raise ValueError(f"per_problem must be at least 1, got {per_problem}")
    rng = random.Random(seed)
    prompts = prompt_rows(problems, backend, conversational=True, one_shot=one_shot)
    rows: list[CorpusRow] = []
    for problem, row in zip(problems, prompts, strict=True):
        rows.extend(problem_rows(problem, row["prompt"], per_problem, mix, rng, backend))
    return rows


def write_corpus(rows: Sequence[CorpusRow], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row.to_dict()) + "\n")
    tmp.replace(path)  # whole or absent: a half-written corpus is never taken for a finished one


def read_corpus(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def corpus_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts by kind and variant, and how many distinct problems and answers."""
    kinds: dict[str, int] = {}
    variants: dict[str, int] = {}
    for row in rows:
        kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
        variants[row["variant"]] = variants.get(row["variant"], 0) + 1
    return {"rows": len(rows), "problems": len({r["problem_key"] for r in rows}),
            "distinct_answers": len({(r["problem_key"], r["completion"]) for r in rows}),
            "kinds": kinds, "variants": dict(sorted(variants.items()))}


def check_corpus(rows: Sequence[Mapping[str, Any]], problems: Sequence[Problem], evaluator: Any,
                 limit: int | None = None) -> list[dict[str, Any]]:
    """Evaluate each distinct answer (up to ``limit``) and say whether the verdict is what its kind promises
    (correct and slow: ``correct``; broken: anything else). Why: a corpus whose "correct" answers fail would
    teach the policy the wrong thing without anyone noticing."""
    by_key = {p.key: p for p in problems}
    seen: set[tuple[str, str]] = set()
    pairs = []
    for row in rows:
        ident = (row["problem_key"], row["completion"])
        if ident in seen:
            continue
        seen.add(ident)
        pairs.append(row)
    pairs = pairs[:limit] if limit is not None else pairs
    futures = [evaluator.submit(by_key[r["problem_key"]], r["completion"]) for r in pairs]
    out = []
    for row, future in zip(pairs, futures, strict=True):
        result = future.result()
        out.append({"problem_key": row["problem_key"], "kind": row["kind"], "variant": row["variant"],
                    "status": str(result.status), "expected_correct": row["expect_correct"],
                    "agrees": (result.status == "correct") == bool(row["expect_correct"]),
                    "error": (result.error or "")[:200]})
    return out
