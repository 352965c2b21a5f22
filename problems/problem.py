"""The Problem model: one KernelBench-format reference program."""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


class ProblemError(ValueError):
    """A problem (or a source of problems) is malformed or cannot be found."""


@dataclass(frozen=True)
class Problem:
    """A reference ``Model`` with ``get_inputs()`` / ``get_init_inputs()``, as KernelBench writes it.

    ``id`` is the number before the first ``_`` of the name, ``source`` says where it came from
    (a file path, ``hf:...``, ``jsonl:...``) so errors can point at it. ``size`` is the size the code
    is written for: ``"cpu"``, ``"gpu"``, or ``""`` when unknown (see docs/problems.md). The key does
    not include it; the same problem at two sizes differs by ``code_hash``.
    """

    id: int
    name: str
    level: int
    code: str
    source: str = ""
    tags: tuple[str, ...] = field(default=())
    size: str = ""

    @property
    def key(self) -> str:
        """``level/name``: unique within a dataset and stable across runs."""
        return f"level{self.level}/{self.name}"

    @property
    def code_hash(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return {"problem_id": self.id, "name": self.name, "level": self.level, "code": self.code,
                "source": self.source, "size": self.size}

    @classmethod
    def from_dict(cls, data: dict) -> Problem:
        return cls(id=int(data["problem_id"]), name=str(data["name"]), level=int(data["level"]),
                   code=str(data["code"]), source=str(data.get("source", "")), size=str(data.get("size", "")))


def reference_as_candidate(problem: Problem) -> str:
    """The reference itself submitted as ``ModelNew``: the baseline for self-checks and demos."""
    return problem.code.replace("class Model(", "class ModelNew(").replace("super(Model, self)", "super()")


def id_from_name(name: str) -> int | None:
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else None


def check_problem_code(code: str, where: str) -> None:
    """Raise ProblemError naming ``where`` unless ``code`` parses and defines the three names.

    Checked statically (no execution) so loading thousands of problems stays cheap and a broken
    file never runs; the worker executes the code later, in its sandbox.
    """
    try:
        tree = ast.parse(code, filename=where)
    except SyntaxError as exc:
        raise ProblemError(f"{where}: syntax error at line {exc.lineno}: {exc.msg}") from None
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
    missing = [n for n in REQUIRED_NAMES if n not in defined]
    if missing:
        raise ProblemError(
            f"{where}: not a KernelBench problem: missing {', '.join(missing)} "
            f"(a problem defines class Model(nn.Module), get_inputs() and get_init_inputs())"
        )
