"""Triton's launchers built by the judge's side and given to every runner, so no runner compiles one.

Up to Triton 3.6, the first call of a kernel with a new argument signature builds a C launcher for it
(``driver.make_launcher``, then gcc through ``runtime.build.compile_module_from_src``): 0.25-0.35 s of a
0.27-0.43 s first call on the H100 (docs/benchmarks.md 1j, ``scripts/triton_first_call.py``), paid again by
every runner, since each starts with a Triton cache of its own. The launcher's C source depends only on the
kinds of the kernel's arguments (a pointer of any element type, a scalar type, ``constexpr``), not on the
kernel, so candidates of one problem (a GRPO group) and most kernels share a few.

A runner cannot be trusted to build one for the next candidate: a launcher is a shared library the next
runner loads. So, as for the precompiled header (pch.py):

- in a runner, :func:`record` wraps ``make_launcher`` before the candidate loads and notes each signature
  it was asked for, and whether its launcher was already in the runner's cache; the calls' replies carry
  the new notes (runner.py), which the judge cuts to signatures of known argument kinds (:func:`signature_of`);
- after the job the judge starts a builder (a low-priority process of kb_gym's code only, :func:`start_build`)
  for the signatures that missed; it generates each launcher with Triton's own ``make_launcher`` from the
  signature alone and compiles it with Triton's own ``compile_module_from_src`` into a staging cache, then
  moves the folder into the store and writes a marker with the files' size, inode and change time;
- before a Triton candidate loads, the judge copies the store's launchers into its runner's Triton cache
  (:func:`seed`), each checked against its marker first: a changed one is removed, never copied.

Whatever a candidate reports can only make the builder compile launchers of known argument kinds (at most
``MAX_ARGS`` arguments, ``MAX_REPORTED`` a runner) with Triton's own generator: never code of its choosing.
The store sits beside the build cache, which Landlock keeps runners out of; launchers are built from, and
given to, confined runners only, since an unconfined one could plant a folder and its marker.

Triton from 3.7 on has no per-signature launcher (``make_launcher`` is gone): there this does nothing. On where the
machine has a CUDA GPU (``KB_GYM_TRITON_LAUNCHERS`` unset or ``auto``; ``1`` on, ``0`` off; read by the judges; where
off, runners still note their launchers, which nothing reads). tests/gpu/test_gpu_triton_launchers.py passed on an H100
(session 44): the second candidate of the same argument kinds had its launcher seeded, a hit, 0.15 s against 0.45 s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kb_gym.file_tree import remove_tree

ENV = "KB_GYM_TRITON_LAUNCHERS"
NAME = "__triton_launcher"  # the module name Triton's CudaLauncher builds
MAX_ARGS = 64
MAX_REPORTED = 16  # signatures a runner's replies may carry in all
MAX_LAUNCHERS = 512  # folders in the store; past that a builder evicts the launchers hit least lately
MAX_SEEDED = 256  # the newest, copied into a runner
SCALARS = frozenset({"i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32",
                     "f32", "fp64", "constexpr"})
POINTER = re.compile(r"\*k?[a-z][a-z0-9]{0,11}")  # "*fp32", "*i64", "*fp8e4nv": the element type is not in the C
ALIASES = {"f32": "fp32", "i1": "i8", "u1": "u8"}
READY, FAILED, LAUNCHERS = "ready", "failed", "launchers"
ORPHAN_AGE_S = 3600.0  # a store folder no marker names (a builder stopped between its move and its marker) is removed

_started: dict[str, float] = {}  # signature key -> when this judge last started its build
RESTART_AFTER_S = 300.0


def enabled() -> bool:
    """On where the machine has a CUDA GPU, unless KB_GYM_TRITON_LAUNCHERS says otherwise (triton_cache.switch)."""
    from kb_gym.worker.triton_cache import switch

    return switch(ENV)


def _driver() -> Any:
    """Triton's NVIDIA driver module where it builds a launcher per signature, else None."""
    try:
        from triton.backends.nvidia import driver
    except Exception:  # noqa: BLE001 - no Triton, or one that cannot load its NVIDIA backend here
        return None
    return driver if callable(getattr(driver, "make_launcher", None)) else None


def store_root() -> Path | None:
    """The judges' launcher store for this Triton (beside the build cache), None where there is none to keep."""
    from kb_gym.worker.build_cache import extensions_root

    root = extensions_root()
    if root is None or not enabled() or _driver() is None:
        return None
    import triton

    return root.parent / "triton_launchers" / triton.__version__


def signature_of(value: Any) -> tuple[str, ...] | None:
    """A signature a runner reported, if it is one of known argument kinds (tensor descriptors and tuples are
    not: their launchers need more than the signature), in its canonical form; None for anything else."""
    if not isinstance(value, list) or len(value) > MAX_ARGS:
        return None
    if not all(isinstance(t, str) and (t in SCALARS or POINTER.fullmatch(t)) for t in value):
        return None
    return canonical(tuple(value))


def canonical(signature: tuple[str, ...]) -> tuple[str, ...]:
    """One name per kind the launcher's C tells apart: every pointer is ``*fp32`` (the C passes a device pointer
    whatever its element type), ``f32`` is ``fp32``, ``i1`` ``i8`` and ``u1`` ``u8`` (the same C types). Round 34:
    ``*q0x0``, ``*q0x1``, ... were as many keys, builds and markers for one launcher, and pushed the honest ones out
    of the newest seeded."""
    return tuple("*fp32" if t.startswith("*") else ALIASES.get(t, t) for t in signature)


def reported(value: Any) -> list[tuple[tuple[str, ...], bool]]:
    """A reply's ``launchers`` note, as (signature, hit) pairs of known signatures; garbage is dropped."""
    out = []
    for item in value[:MAX_REPORTED] if isinstance(value, list) else []:
        signature = signature_of(item.get("signature")) if isinstance(item, dict) else None
        if signature is not None:
            out.append((signature, item.get("hit") is True))
    return out


def key(signature: tuple[str, ...]) -> str:
    return hashlib.sha256(json.dumps(list(canonical(signature))).encode()).hexdigest()[:32]


# -- in a runner, before the candidate loads ---------------------------------------------------------------------

def record() -> list[dict[str, Any]] | None:
    """Wrap Triton's ``make_launcher`` so that each signature asked for is noted, and its compiler so that a note
    says whether the launcher was built here (a miss) or found in this process's Triton cache (seeded, or built by
    an earlier kernel); the list the notes go to, None where Triton builds no launcher per signature. A candidate
    may undo the wrappers: it then only loses the sharing."""
    driver = _driver()
    if driver is None:
        return None
    import triton.runtime.build as triton_build

    make, compile_c = driver.make_launcher, triton_build._build
    notes: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []  # the note of the launcher just asked for, until Triton looks it up

    def make_launcher(constants: Any, signature: Any, tensordesc_meta: Any, *args: Any, **kwargs: Any) -> Any:
        pending.clear()
        if len(notes) < MAX_REPORTED and not tensordesc_meta and isinstance(signature, dict):
            notes.append({"signature": [s if isinstance(s, str) else "?" for s in signature.values()], "hit": True})
            pending.append(notes[-1])
        return make(constants, signature, tensordesc_meta, *args, **kwargs)

    def build(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == NAME and pending:  # Triton compiles the launcher just asked for: it was not in the cache
            pending.pop()["hit"] = False
        return compile_c(name, *args, **kwargs)

    driver.make_launcher = make_launcher
    triton_build._build = build
    return notes


# -- in the judge ----------------------------------------------------------------------------------------------

def start_build(root: Path | None, signatures: list[tuple[str, ...]]) -> int:
    """Start a builder for those of ``signatures`` not built, failed or started lately; how many it was given."""
    if root is None:
        return 0
    now = time.monotonic()
    todo = []
    for signature in dict.fromkeys(signatures):
        k = key(signature)
        if (root / READY / f"{k}.json").is_file() or (root / FAILED / k).exists():
            continue
        if now - _started.get(k, -RESTART_AFTER_S) < RESTART_AFTER_S:
            continue
        todo.append(list(signature))
        _started[k] = now
    if not todo:
        return 0
    with contextlib.suppress(OSError):
        (root / LAUNCHERS).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=root, prefix="request-", suffix=".json", delete=False) as f:
            json.dump(todo, f)
        with open(root / "build.log", "ab") as log:
            subprocess.Popen([sys.executable, "-P", "-m", "kb_gym.worker.triton_launchers", str(root), f.name],
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                             close_fds=True)
        return len(todo)
    return 0


def note_hits(root: Path | None, signatures: list[tuple[str, ...]]) -> None:
    """Mark the launchers a runner found in its cache as used now: a full store evicts those used least lately."""
    for signature in signatures if root is not None else []:
        with contextlib.suppress(OSError):
            os.utime(root / READY / f"{key(signature)}.json")


def seed(root: Path | None, runner_cache: Path) -> int:
    """Copy the store's launchers (the ``MAX_SEEDED`` folders of the markers used most lately, each checked against
    its marker) into a runner's Triton cache, those it lacks only; how many."""
    if root is None or not (root / READY).is_dir():
        return 0
    copied = 0
    for name in _newest_folders(root, MAX_SEEDED):
        target = runner_cache / name
        if target.exists():
            continue
        try:
            shutil.copytree(root / LAUNCHERS / name, target, symlinks=False)
            copied += 1
        except OSError:
            remove_tree(target)  # half a launcher is worse than none
    return copied


def _markers(root: Path) -> list[tuple[int, Path]]:
    """The ready markers, used most lately first."""
    out = []
    for marker in (root / READY).glob("*.json"):
        with contextlib.suppress(OSError):  # removed while listed
            out.append((marker.stat().st_mtime_ns, marker))
    return sorted(out, reverse=True)


def _newest_folders(root: Path, limit: int) -> list[str]:
    """The folders verified markers name, the markers used most lately first, at most ``limit``."""
    names: dict[str, None] = {}
    for _, marker in _markers(root):
        for name in _verified(root, marker):
            names.setdefault(name)
        if len(names) >= limit:
            break
    return list(names)[:limit]


def _files(folder: Path) -> list[list[Any]]:
    """What any write to a launcher's files changes: each file's name, size, inode and change time."""
    out = []
    for path in sorted(folder.iterdir()):
        st = path.lstat()
        out.append([path.name, st.st_size, st.st_ino, st.st_ctime_ns, int(path.is_file() and not path.is_symlink())])
    return out


def _plain_folder(path: Path) -> bool:
    """A folder itself, not a link to one (round 34: a marker naming a link out of the store was seeded)."""
    return stat.S_ISDIR(path.lstat().st_mode)


def _verified(root: Path, marker: Path) -> list[str]:
    """The folders a ready marker names, if every file is as built; a marker whose files changed is removed with
    them (where runners are not confined some process may have written there)."""
    try:
        folders = json.loads(marker.read_text())["folders"]
        if isinstance(folders, dict) and all(
                isinstance(n, str) and "/" not in n and n not in ("", ".", "..") and _plain_folder(root / LAUNCHERS / n)
                and _files(root / LAUNCHERS / n) == f for n, f in folders.items()):
            return list(folders)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    with contextlib.suppress(OSError):
        marker.unlink()
    return []


# -- the builder (a process of its own: python -m kb_gym.worker.triton_launchers ROOT REQUEST) -----------------

def build(root: Path, signatures: list[tuple[str, ...]]) -> dict[str, str]:
    """Build each signature's launcher with Triton's own generator and compiler into a staging cache, move it into
    the store and mark it ready (or failed, with why); what became of each, by key."""
    driver = _driver()
    done: dict[str, str] = {}
    if driver is None:
        return done
    from triton.runtime.build import compile_module_from_src

    for sub in (READY, FAILED, LAUNCHERS):
        (root / sub).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="staging-", dir=root))
    os.environ["TRITON_CACHE_DIR"] = str(staging)  # Triton reads it at each cache lookup
    try:
        for signature in signatures:
            k = key(signature)
            if (root / READY / f"{k}.json").is_file() or (root / FAILED / k).exists():
                continue
            before = set(os.listdir(staging))
            try:
                src = driver.make_launcher({}, dict(enumerate(canonical(signature))), None)
                compile_module_from_src(src=src, name=NAME, library_dirs=driver.library_dirs(),
                                        include_dirs=driver.include_dirs, libraries=driver.libraries)
                folders = {}
                for name in sorted(set(os.listdir(staging)) - before):
                    with contextlib.suppress(OSError):  # a judge beside this one moved the same launcher first
                        os.rename(staging / name, root / LAUNCHERS / name)
                    folders[name] = _files(root / LAUNCHERS / name)
                _write(root / READY / f"{k}.json", json.dumps({"signature": list(signature), "folders": folders}))
                done[k] = "ready"
            except Exception as exc:  # noqa: BLE001 - a launcher not built is a build in the runner, never a verdict
                _write(root / FAILED / k, f"{type(exc).__name__}: {str(exc)[:500]}")
                done[k] = "failed"
    finally:
        remove_tree(staging)
    _evict(root)
    return done


def _evict(root: Path) -> None:
    """Keep the store within MAX_LAUNCHERS folders: the launchers used least lately go first, with their markers; a
    folder no marker names goes once it is ORPHAN_AGE_S old (a builder beside this one may be about to mark it)."""
    markers = _markers(root)
    named: set[str] = set()
    for _, marker in markers:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            named.update(json.loads(marker.read_text())["folders"])
    now = time.time()
    for folder in (root / LAUNCHERS).iterdir():
        with contextlib.suppress(OSError):
            if folder.name not in named and now - folder.lstat().st_mtime > ORPHAN_AGE_S:
                remove_tree(folder)
    excess = sum(1 for _ in (root / LAUNCHERS).iterdir()) - MAX_LAUNCHERS
    for _, marker in reversed(markers):
        if excess <= 0:
            break
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            folders = json.loads(marker.read_text())["folders"]
            marker.unlink()
            for name in folders:
                if isinstance(name, str) and "/" not in name and name not in ("", ".", ".."):
                    remove_tree(root / LAUNCHERS / name)
                    excess -= 1


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    root, request = Path(argv[0]), Path(argv[1])
    try:
        signatures = [s for s in (signature_of(v) for v in json.loads(request.read_text())) if s is not None]
    finally:
        request.unlink(missing_ok=True)
    print(json.dumps(build(root, signatures)), flush=True)
    return 0


if __name__ == "__main__":
    os.nice(15)  # beside a judge that may be timing: the compiler yields the cores
    sys.exit(main(sys.argv[1:]))
