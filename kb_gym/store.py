"""Results store: every EvalResult appended as one JSON line, flushed to disk before returning."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from kb_gym.result import EvalResult


def cache_dir() -> Path:
    """kb_gym's folder under the user cache (KB_GYM_CACHE overrides, then XDG_CACHE_HOME)."""
    root = os.environ.get("KB_GYM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kb_gym")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_results_path() -> Path:
    return cache_dir() / "results" / f"results-{time.strftime('%Y%m%d')}.jsonl"


class ResultsStore:
    """Append-only JSONL file. Thread-safe; each line is written, flushed and fsynced under a
    lock, so a process killed after ``append`` returns loses nothing already returned."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def append(self, result: EvalResult, extra: dict[str, Any] | None = None) -> None:
        """``extra``: fields written beside the result's (``evaluate-model``'s problem key and sample index)."""
        line = (result.to_json() if not extra else json.dumps({**result.to_dict(), **extra}, default=str,
                                                                  allow_nan=False)) + "\n"
        with self._lock:
            append_lines(self.path, [line])


def append_lines(path: str | os.PathLike, lines: list[str]) -> None:
    """Append ``lines`` (each ending in a newline) to a JSONL file and fsync it. A line torn by a writer that died
    mid-write is closed first: glued to it, the first new line was lost too (round 10)."""
    with open(path, "a+b") as fh:
        end = fh.seek(0, os.SEEK_END)
        torn = False
        if end:
            fh.seek(end - 1)
            torn = fh.read(1) != b"\n"
        fh.write((b"\n" if torn else b"") + "".join(lines).encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())
