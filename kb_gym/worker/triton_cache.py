"""Triton's compiled kernels kept between runners, as build_cache.py keeps ``load_inline`` builds.

Every runner is new, and its Triton cache (``TRITON_CACHE_DIR``) is a folder of its own scratch, so a Triton
candidate evaluated again was compiled again from nothing in each fresh runner: its kernels' JIT compile and
Triton's launcher stub (a C build) on its first call. On the H100 (docs/benchmarks.md 1f) a warm Triton candidate's
correctness stage took 0.48-1.81 s against 0.16-0.33 s for a reference copy of the same problem, most of it that;
the throughput issue's target for the whole evaluation is 1.5 s.

An entry is what a runner's Triton cache held when its tree was gone, less the folders the judge seeded before the
candidate loaded (the device digest's kernel: device_digest.seed), keyed by the candidate's whole source, the
toolchain (build_cache.toolchain: torch, CUDA, Python, the GPU's architecture) and Triton's version, beside the
build cache's entries and under its bound and eviction. Before a candidate loads, the judge copies the entry for its
source into the runner's Triton cache, folders the runner does not have only, and points Triton's group files (which
name their files by absolute path) at the copies. What a candidate leaves in its Triton cache can only reach later
evaluations of the very same source, whose behaviour that source decides anyway.

On where the machine has a CUDA GPU (``KB_GYM_TRITON_CACHE`` unset or ``auto``; ``1`` on, ``0`` off): on the CPU
Triton interprets and compiles nothing, so only the keeping and restoring are tested there (tests/test_triton_cache.py);
tests/gpu/test_gpu_triton_cache.py checks that a restored kernel loads (H100, session 44: passed; a Triton candidate
on a warm worker 1.37 s, again 1.31 s, in the batch with the launchers on too).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from pathlib import Path

from kb_gym.worker.build_cache import (
    ENTRY_MAX_BYTES,
    MARKER,
    code_names,
    copy_regular_files,
    extensions_root,
    source_key,
    store,
)

ENV = "KB_GYM_TRITON_CACHE"
FOLDER = "triton"  # inside an entry, beside no ``ext``: the key differs from the build's
MAX_FOLDERS = 256  # Triton keeps a folder per kernel variant, launcher and utility build: more is not a compile
GROUP_MAX_BYTES = 64 << 10  # a group file names a kernel's few files; a larger one is dropped unread (round 32)


def enabled() -> bool:
    return switch(ENV)


def switch(env: str) -> bool:
    """A Triton sharing switch: ``env`` set to ``1`` or ``0``, else on where this machine has a CUDA GPU (only a GPU's
    Triton compiles anything to share)."""
    value = os.environ.get(env, "auto")
    if value in ("0", "1"):
        return value == "1"
    import torch

    return torch.cuda.is_available()


def uses_triton(source: str) -> bool:
    """Whether a candidate may compile Triton kernels: its code (not its comments) names Triton. A miss costs a
    compile, never a verdict; a source that does not parse never loads."""
    return code_names(source, ("triton",), unparsable=False)


def entry_key(source: str, tools: str) -> str:
    try:
        import triton

        version = triton.__version__
    except ImportError:
        version = "none"
    return source_key(source, f"{tools}|triton {version}")


def folders(runner_cache: Path) -> set[str]:
    """The folders in a runner's Triton cache now (before its candidate loads: what the judge seeded)."""
    with contextlib.suppress(OSError):
        return {p.name for p in runner_cache.iterdir() if p.is_dir() and not p.is_symlink()}
    return set()


def restore(source: str, runner_cache: Path, tools: str) -> int:
    """Copy the kept kernels of ``source`` into a runner's Triton cache (folders it lacks only); how many."""
    root = extensions_root()
    entry = root / entry_key(source, tools) if root else None
    if entry is None or not (entry / MARKER).is_file():
        return 0
    have = folders(runner_cache)
    copied = 0
    try:
        for kept in (entry / FOLDER).iterdir():
            if kept.name in have or not kept.is_dir() or kept.is_symlink():
                continue
            shutil.copytree(kept, runner_cache / kept.name, symlinks=False)
            _repoint(runner_cache / kept.name)
            copied += 1
        os.utime(entry / MARKER)  # recently used: the last to be evicted
    except OSError:  # evicted mid-copy: a folder left half-copied lacks files its group names, a miss for Triton
        pass
    return copied


def keep(source: str, runner_cache: Path, tools: str, seeded: set[str]) -> None:
    """With the runner's tree gone: keep the folders of its Triton cache that were not ``seeded``. Regular files only,
    never through a link (build_cache.copy_regular_files); nothing past build_cache.ENTRY_MAX_BYTES."""
    root = extensions_root()
    new = [] if runner_cache.is_symlink() else sorted(folders(runner_cache) - seeded)
    if root is None or not uses_triton(source) or not new or len(new) > MAX_FOLDERS or not _compiled(runner_cache, new):
        return

    def fill(staging: Path) -> int:
        size = 0
        for name in new:
            size += copy_regular_files(runner_cache / name, staging / FOLDER / name, ENTRY_MAX_BYTES - size)
        return size

    store(root / entry_key(source, tools), fill)


def _compiled(runner_cache: Path, new: list[str]) -> bool:
    """Whether Triton compiled a kernel there (a ``.cubin`` in a new folder): a source that only names Triton, and
    files a candidate wrote, are not kept (round 32: 30 MB kept for a candidate that compiled nothing)."""
    for name in new:
        with contextlib.suppress(OSError):
            for p in (runner_cache / name).iterdir():
                info = p.lstat()
                if p.suffix == ".cubin" and stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                    return True
    return False


def _repoint(folder: Path) -> None:
    """Point the group files of a restored folder at its own files: each names its children by the absolute path
    the keeping runner saw (its scratch folder, or the runners' mount point); Triton treats a group whose children
    it cannot find as a miss, and one it may not read as an error."""
    for group in folder.glob("__grp__*.json"):
        try:
            if group.is_symlink() or group.stat().st_size > GROUP_MAX_BYTES:
                raise ValueError("not a group Triton wrote")
            data = json.loads(group.read_text())
            children = data["child_paths"]
            data["child_paths"] = {name: str(folder / Path(str(path)).name) for name, path in children.items()}
            group.write_text(json.dumps(data))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            with contextlib.suppress(OSError):
                group.unlink()  # a group it cannot read: a miss for that kernel, never a wrong path
