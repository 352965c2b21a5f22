"""Our reference solutions to the built-in problems: one file per problem under builtin/solutions/levelN/,
named as the problem's file; a Triton kernel, or a CUDA one built with ``load_inline``."""

from __future__ import annotations

import re
from pathlib import Path

from kb_gym.problems.loaders import BUILTIN_DIR

_LOAD_INLINE = re.compile(r"\bload_inline\s*\(")


def solution_backend(path: Path) -> str:
    """``"cuda"`` for a ``load_inline`` extension (it needs nvcc and a GPU), else ``"triton"``."""
    return "cuda" if _LOAD_INLINE.search(path.read_text()) else "triton"


def solution_files(device: str = "cuda") -> list[Path]:
    """Every solution file, sorted; on a CPU device the ones that run there (the Triton ones, under the
    interpreter)."""
    files = sorted((BUILTIN_DIR / "solutions").glob("level*/*.py"))
    return files if device.startswith("cuda") else [f for f in files if solution_backend(f) == "triton"]
