"""Compiled extensions kept between runners: a runner builds in its own scratch folder, the judge keeps
the build.

A ``load_inline`` build takes nvcc tens of seconds; each runner is new, so without this every
evaluation of a CUDA candidate would rebuild. The runner never sees the cache: before it loads a
candidate, the judge copies in the entry for that candidate's source hash (and nothing else), and
after a load that built something the judge copies the runner's build folder out under the same
hash, once the runner is dead (nothing can change the folder mid-copy), regular files only. An
entry counts only once its ``complete`` marker is written after the copy, so a half-written
one (a judge killed mid-copy) is rebuilt, never loaded. What a candidate leaves in its own build
folder can only ever reach later evaluations of the very same source.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
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
    """After a runner is dead: keep what it built for ``source``. Regular files only, opened without
    following links (a link planted to a file of the judge's would otherwise be copied in)."""
    root = _root()
    if root is None or not runner_ext.is_dir() or not any(runner_ext.iterdir()):
        return
    entry = root / source_key(source)
    if (entry / MARKER).is_file():
        return
    staging = root / f".{entry.name}.{os.getpid()}.tmp"
    try:
        shutil.rmtree(staging, ignore_errors=True)
        _copy_regular_files(runner_ext, staging / "ext")
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)
        (entry / MARKER).write_text("ok")
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)


def _copy_regular_files(src: Path, dst: Path) -> None:
    for folder, dirs, files in os.walk(src, followlinks=False):
        rel = Path(folder).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
        for name in files:
            path = os.path.join(folder, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue  # a link, or gone
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    continue
                with open(dst / rel / name, "wb") as out:
                    shutil.copyfileobj(fh, out, 1 << 20)
            shutil.copystat(path, dst / rel / name, follow_symlinks=False)
