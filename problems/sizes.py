"""Problem sizes: the ``# gpu:`` annotations of our problem files, rewritten for a CPU or a GPU.

A problem file as written is its CPU size. A module-level size constant that differs at the GPU size
carries a trailing comment, ``batch = 16  # gpu: 4096``; :func:`sized_code` turns that line into
``batch = 4096`` (GPU) or ``batch = 16`` (CPU), the comment gone either way, so the code a policy sees
is plain KernelBench format. The GPU value must be a literal or arithmetic of literals (``4096``,
``16 * 1024``, ``(3, 3)``); it is checked with ``ast`` and never evaluated here.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass

from kb_gym.problems.problem import ProblemError

SIZES = ("cpu", "gpu")
SIZE_CHOICES = ("auto", *SIZES)

ANNOTATION_RE = re.compile(
    r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<cpu>[^#\n]+?)\s*#\s*gpu:\s*(?P<gpu>[^#\n]+?)\s*$")
_GPU_COMMENT_RE = re.compile(r"^#\s*gpu\s*:")
_LITERAL_NODES = (ast.Expression, ast.Constant, ast.Tuple, ast.List, ast.BinOp, ast.UnaryOp, ast.Load,
                  ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd)


@dataclass(frozen=True)
class SizeAnnotation:
    """One annotated line: ``name = cpu  # gpu: gpu`` at ``lineno`` (1-based)."""

    lineno: int
    name: str
    cpu: str
    gpu: str


def auto_size() -> str:
    """``"gpu"`` when torch sees a CUDA GPU, else ``"cpu"`` (torch imported only when asked)."""
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def size_for_devices(devices: str | Sequence[str] | None) -> str:
    """What ``size="auto"`` means for problems that run on ``devices``: ``"gpu"`` when every one is a
    CUDA GPU (``"auto"`` counts as one when torch sees a GPU), else ``"cpu"``; ``None``: by
    :func:`auto_size`. Read from the names only (an unavailable device is the evaluator's to report)."""
    if devices is None:
        return auto_size()
    names = devices.split(",") if isinstance(devices, str) else list(devices)
    kinds = set()
    for name in names:
        name = str(name).strip().lower()
        kinds.add(auto_size() if name == "auto" else "gpu" if name.startswith("cuda") else "cpu")
    return "gpu" if kinds == {"gpu"} else "cpu"


def check_size(size: str, *, allow_auto: bool = True) -> str:
    """``size`` itself when it is one of ``auto`` (when allowed), ``cpu``, ``gpu``; else a ProblemError."""
    choices = SIZE_CHOICES if allow_auto else SIZES
    if size not in choices:
        raise ProblemError(f"size must be one of {', '.join(map(repr, choices))}, got {size!r}")
    return size


def size_annotations(code: str, where: str = "<problem>") -> list[SizeAnnotation]:
    """Every ``# gpu:`` annotation of ``code``, in line order; a malformed one is a ProblemError that
    names ``where`` and the line.

    A comment starting ``# gpu:`` is an annotation, so it must sit on a module-level assignment at
    column 0 (``name = <cpu value>  # gpu: <gpu value>``) whose GPU value is a literal or arithmetic
    of literals. The code must already parse (the loaders check that first).
    """
    if "gpu" not in code:
        return []
    lines = code.splitlines()
    found: list[SizeAnnotation] = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError) as exc:
        raise ProblemError(f"{where}: cannot read the size annotations ({exc})") from None
    for tok in tokens:
        if tok.type != tokenize.COMMENT or not _GPU_COMMENT_RE.match(tok.string):
            continue
        lineno = tok.start[0]
        line = lines[lineno - 1]
        m = ANNOTATION_RE.match(line)
        if m is None:
            raise ProblemError(
                f"{where}:{lineno}: malformed size annotation {line.strip()!r}: a '# gpu:' comment belongs "
                "on a module-level size constant at column 0, e.g. 'batch = 16  # gpu: 4096'")
        _check_literal(m["gpu"], f"{where}:{lineno}", "GPU")
        found.append(SizeAnnotation(lineno, m["name"], m["cpu"], m["gpu"]))
    return found


def sized_code(code: str, size: str, where: str = "<problem>") -> str:
    """``code`` at ``size`` (``"cpu"`` or ``"gpu"``): every annotated line becomes ``name = <value>``
    for that size, without the comment; every other line (and comment) is kept as is."""
    check_size(size, allow_auto=False)
    annotations = size_annotations(code, where)
    if not annotations:
        return code
    lines = code.splitlines(keepends=True)
    for a in annotations:
        line = lines[a.lineno - 1]
        ending = line[len(line.rstrip("\r\n")):]
        lines[a.lineno - 1] = f"{a.name} = {a.gpu if size == 'gpu' else a.cpu}{ending}"
    return "".join(lines)


def _check_literal(text: str, where: str, what: str) -> None:
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ProblemError(f"{where}: the {what} value {text!r} is not a Python expression") from None
    for node in ast.walk(tree):
        if not isinstance(node, _LITERAL_NODES) or (
                isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool, str))):
            raise ProblemError(f"{where}: the {what} value {text!r} must be a literal or arithmetic of "
                               f"literals (4096, 16 * 1024, (3, 3)); found {type(node).__name__}")


__all__ = ["ANNOTATION_RE", "SIZES", "SIZE_CHOICES", "SizeAnnotation", "auto_size", "check_size",
           "size_annotations", "size_for_devices", "sized_code"]
