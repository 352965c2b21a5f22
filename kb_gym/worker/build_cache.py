"""Compiled extensions kept between runners: a runner builds in its own scratch folder, the judge keeps
the build.

A ``load_inline`` build takes nvcc tens of seconds; each runner is new, so without this every
evaluation of a CUDA candidate would rebuild. The runner never sees the cache: before it loads a
candidate, the judge copies in the entry for that candidate's source hash (and nothing else), and
after a load that built something the judge copies the runner's build folder out under the same
hash. An entry counts only once its ``complete`` marker is written after the copy, so a half-written
one (a judge killed mid-copy) is rebuilt, never loaded. What a candidate leaves in its own build
folder can only ever reach later evaluations of the very same source.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

MARKER = "complete"


def _root() -> Path | None:
    root = os.environ.get("KB_GYM_EXTENSIONS_DIR")
    return Path(root) if root else None


def source_key(source: str) -> str:
    return hashlib.sha256(source.encode(errors="replace")).hexdigest()[:24]


def restore(source: str, runner_ext: Path) -> bool:
    """Copy the cached build of ``source`` into a runner's build folder; True on a hit."""
    root = _root()
    entry = root / source_key(source) if root else None
    if entry is None or not (entry / MARKER).is_file():
        return False
    try:
        shutil.copytree(entry / "ext", runner_ext, dirs_exist_ok=True, symlinks=False)
    except OSError:
        return False
    return True


def keep(source: str, runner_ext: Path) -> None:
    """After a load: keep what the runner built for ``source`` (regular files only; nothing if empty)."""
    root = _root()
    if root is None or not runner_ext.is_dir() or not any(runner_ext.iterdir()):
        return
    entry = root / source_key(source)
    if (entry / MARKER).is_file():
        return
    staging = root / f".{entry.name}.{os.getpid()}.tmp"
    try:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(runner_ext, staging / "ext", symlinks=True,
                        ignore=lambda d, names: [n for n in names if os.path.islink(os.path.join(d, n))])
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)
        (entry / MARKER).write_text("ok")
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
