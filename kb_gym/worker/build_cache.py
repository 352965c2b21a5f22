"""Compiled extensions kept between runners: a runner builds in its own scratch folder, the judge keeps
the build.

A ``load_inline`` build takes nvcc tens of seconds; each runner is new, so without this every
evaluation of a CUDA candidate would rebuild. One cache per machine (``KB_GYM_EXTENSIONS_DIR``, under
the kb_gym cache folder), shared by every judge of every Evaluator on the host. An entry is keyed by the
candidate's source and the toolchain (torch, CUDA and Python versions, the GPU's architecture, the
compilers named in the environment), never by the name the candidate gives its extension. The runner
never sees the cache: before it loads a candidate, the judge copies in the entry for that key (and
nothing else); after a load that built something, the judge copies the runner's build folder out
under the same key with the runner and all its processes stopped (nothing can change the folder
mid-copy), regular files only. An entry counts only once its ``complete`` marker is written after
the copy, so a half-written one (a judge killed mid-copy) is rebuilt, never loaded. While one judge
builds a source no entry has, others given the same source wait for it (``building``) and then load
its entry. What a candidate leaves in its own build folder can only ever reach later evaluations of
the very same source.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from kb_gym.file_tree import remove_tree

MARKER = "complete"
# A kept entry holds at most this much disk (an nvcc build folder is 10-100 MB); a larger folder is not kept. Files
# that hold fewer blocks than their size (sparse: a runner's truncate()) are never copied: the copy would write
# every byte, outside the disk limit the runner's blocks are held to (round 7: 1 GB of host disk per file).
ENTRY_MAX_BYTES = 256 << 20
# What a kept folder may hold besides bytes: every file and folder counts a block at least (round 32: 37 MB of empty
# folders and 1-byte files counted as 9 KB against the bound), files and folders are bounded in number, and folders
# in depth (1,500 nested folders raised RecursionError out of the judge's copy and clean-up).
BLOCK_BYTES = 4096
ENTRY_MAX_FILES = 4096
ENTRY_MAX_DEPTH = 8
STALE_STAGING_S = 3600.0  # a staging folder this old was left by a judge that died mid-copy: removed
# The whole cache is held under KB_GYM_EXTENSIONS_MAX_GB (default 20): an RL run builds a new extension for
# almost every CUDA candidate, so past the bound the least recently used entries go.
DEFAULT_MAX_GB = 20.0
_EVICT_TO = 0.8  # eviction brings the cache down to this share of its bound, so it does not run on every keep


def extensions_root() -> Path | None:
    """The build cache's folder (``KB_GYM_EXTENSIONS_DIR``), None where no cache is configured."""
    root = os.environ.get("KB_GYM_EXTENSIONS_DIR")
    return Path(root) if root else None


def mount_point(scratch: Path) -> Path:
    """The one path at which every runner sees its own scratch folder, bound over it in the runner's mount
    namespace (process.bind_scratch). A build's files name absolute paths (ninja's commands), so a kept build
    is up to date only in a runner that sees the same path: one per build cache, shared by every judge of
    every Evaluator and Ray worker on the host. Only a mount point: no process writes there (without a
    namespace, a runner uses its own folder). Without a cache, one beside the judge's own folder."""
    root = extensions_root()
    return root / ".runner" if root is not None else scratch.parent / "runner"


def toolchain(device: torch.device) -> str:
    """What a build depends on besides its source: the same source built for another GPU architecture or
    torch is another entry."""
    parts = [torch.__version__, str(torch.version.cuda), sys.version.split()[0], platform.machine(),
             *(os.environ.get(name, "") for name in ("TORCH_CUDA_ARCH_LIST", "CXX", "CC", "CUDA_HOME"))]
    if device.type == "cuda":
        parts.append("sm_{}{}".format(*torch.cuda.get_device_capability(device)))
    return "|".join(parts)


def source_key(source: str, tools: str) -> str:
    return hashlib.sha256(tools.encode() + b"\0" + source.encode(errors="surrogatepass")).hexdigest()[:24]


_BUILDER_NAMES = ("cpp_extension", "load_inline")


def may_build(source: str) -> bool:
    """Whether loading ``source`` may compile an extension: its code (not its comments) names torch's
    extension builder, as a name, an attribute, an import or a string. Only such sources are serialised
    by ``building`` and kept: two copies of a Python or Triton candidate load side by side. A miss costs only a
    second build, never a wrong one."""
    return code_names(source, _BUILDER_NAMES, unparsable=True)


def code_names(source: str, names: tuple[str, ...], unparsable: bool) -> bool:
    """Whether the code of ``source`` (not its comments) holds one of ``names`` in a name, an attribute, an import or
    a string; ``unparsable`` for a source that does not parse."""
    if not any(name in source for name in names):
        return False
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return unparsable
    for node in ast.walk(tree):
        text = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                else node.module or "" if isinstance(node, ast.ImportFrom)
                else " ".join(a.name for a in node.names) if isinstance(node, ast.Import)
                else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else "")
        if any(name in text for name in names):
            return True
    return False


@contextlib.contextmanager
def building(source: str, tools: str, timeout: float) -> Iterator[None]:
    """Held around restore, load and keep: a second judge given the same source while the first builds it
    waits here (up to ``timeout``, then builds itself) and finds the entry when it gets in. A source that
    builds nothing (``may_build``) never waits."""
    root = extensions_root()
    if root is None or not may_build(source):
        yield
        return
    locks = root / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    fd = os.open(locks / f"{source_key(source, tools)}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    deadline = time.monotonic() + max(0.0, timeout)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break  # the other build is taking too long: build here too
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock; a judge that dies releases it too


def restore(source: str, runner_ext: Path, tools: str) -> bool:
    """Copy the cached build of ``source`` into a runner's build folder; True on a hit."""
    root = extensions_root()
    entry = root / source_key(source, tools) if root else None
    if entry is None or not (entry / MARKER).is_file():
        return False
    try:
        shutil.copytree(entry / "ext", runner_ext, dirs_exist_ok=True, symlinks=False)
        os.utime(entry / MARKER)  # recently used: the last to be evicted
    except OSError:  # evicted mid-copy: a miss, and nothing half-copied left for the runner's build to trust
        remove_tree(runner_ext)
        return False
    return True


def libraries(runner_ext: Path) -> dict[str, int]:
    """The built libraries in a runner's build folder (``ext/NAME/*.so``) and their modification times: the
    same before and after a load that restored them means ninja found the build up to date and did not rebuild
    it. A diagnostic (``build_reused``), never part of a verdict."""
    found = {}
    with contextlib.suppress(OSError):
        for folder in runner_ext.iterdir():
            if folder.is_dir() and not folder.is_symlink():
                for lib in folder.glob("*.so"):
                    found[str(lib.relative_to(runner_ext))] = lib.lstat().st_mtime_ns
    return found


def keep(source: str, runner_ext: Path, tools: str) -> None:
    """With the runner stopped or dead: keep what it built for ``source``, where it built a library (a folder
    with no ``ext/NAME/*.so`` is no build: round 32 kept 30 MB of a candidate's files that built nothing, and evicted
    an honest build with them). Regular files only, opened without following links (a link planted to a file of the
    judge's would otherwise be copied in)."""
    root = extensions_root()
    # a build folder that is itself a link (to a folder of the judge's) is no build: nothing below follows one
    built = (sorted({Path(lib).parts[0] for lib in libraries(runner_ext)})
             if runner_ext.is_dir() and not runner_ext.is_symlink() else [])
    if root is None or not may_build(source) or not built:
        return

    def fill(staging: Path) -> int:  # the folders of the extensions it built (ext/NAME), nothing beside them
        size = 0
        for name in built:
            size += copy_regular_files(runner_ext / name, staging / "ext" / name, ENTRY_MAX_BYTES - size)
        return size

    store(root / source_key(source, tools), fill)


def store(entry: Path, fill: Callable[[Path], int]) -> None:
    """Write a cache entry unless a complete one is there: ``fill(staging)`` copies into a staging folder of this
    call's own and returns the disk it takes; the folder then takes the entry's place and its marker is written last
    (a half-written entry is never loaded); then the least recently used entries go past the cache's bound. A copy
    that fails (or is TooLarge) keeps nothing and leaves nothing. The staging folder's name is unique: every judge is
    pid 1 of its own namespace, and a name made of the pid let two judges keeping one source fill one folder (round
    32: an entry marked complete with half its files)."""
    if (entry / MARKER).is_file():
        return
    root = entry.parent
    staging = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=root))
        size = fill(staging)
        if (entry / MARKER).is_file():  # another judge kept it meanwhile
            remove_tree(staging)
            return
        remove_tree(entry)  # a half-written one
        os.replace(staging, entry)
        (entry / MARKER).write_text(str(size))
    except Exception:  # noqa: BLE001 - OSError, TooLarge, or a tree no copy should follow: nothing is kept
        if staging is not None:
            remove_tree(staging)
        return
    _sweep_stale(root)
    evict(root, max_bytes())


def _sweep_stale(root: Path) -> None:
    """Staging and evicted folders left behind by judges that died mid-copy (never counted in ``entries``)."""
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(root) as listing:
        for item in listing:
            if item.name.startswith(".") and item.name.endswith((".tmp", ".evicted")):
                with contextlib.suppress(OSError):
                    if now - item.stat(follow_symlinks=False).st_mtime > STALE_STAGING_S:
                        remove_tree(item.path)


def max_bytes() -> int:
    """The cache's bound in bytes (``KB_GYM_EXTENSIONS_MAX_GB``, default 20 GB)."""
    try:
        gb = float(os.environ.get("KB_GYM_EXTENSIONS_MAX_GB", DEFAULT_MAX_GB))
    except ValueError:
        gb = DEFAULT_MAX_GB
    return int(max(gb, 0.0) * (1 << 30))


def entries(root: Path) -> list[tuple[float, int, Path]]:
    """The complete entries under ``root``: (last used, bytes, folder), least recently used first."""
    found = []
    with contextlib.suppress(OSError), os.scandir(root) as listing:
        for item in listing:
            if item.name.startswith(".") or not item.is_dir(follow_symlinks=False):
                continue
            marker = Path(item.path) / MARKER
            try:
                used = marker.stat().st_mtime
                text = marker.read_text()
            except OSError:
                continue  # half-written: never loaded, never counted
            size = int(text) if text.isdigit() else _du(Path(item.path))  # kept before sizes were recorded
            found.append((used, size, Path(item.path)))
    return sorted(found)


def _du(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def evict(root: Path, limit: int) -> list[Path]:
    """Remove the least recently used entries until the cache holds at most ``limit`` bytes (down to 80% of it
    once it is over). One judge of the host evicts at a time; an entry goes by its marker first (a judge
    restoring it then misses), then out of sight by a rename, then from the disk."""
    found = entries(root)
    total = sum(size for _, size, _ in found)
    if total <= limit:
        return []
    gone = []
    fd = os.open(root / ".evict.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return []  # another judge is evicting
        for _, size, folder in found:
            if total <= limit * _EVICT_TO:
                break
            with contextlib.suppress(OSError):
                (folder / MARKER).unlink()
                trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".evicted", dir=root))
                os.replace(folder, trash / "entry")
                remove_tree(trash)
                gone.append(folder)
                total -= size
    finally:
        os.close(fd)
    return gone


def discard(source: str, tools: str) -> None:
    """Drop the entry kept for ``source`` (a copy made while the runner's processes ran)."""
    root = extensions_root()
    if root is not None:
        entry = root / source_key(source, tools)
        with contextlib.suppress(OSError):
            (entry / MARKER).unlink()
        remove_tree(entry)


class TooLarge(Exception):
    """A build folder over ENTRY_MAX_BYTES: not kept."""


def copy_regular_files(src: Path, dst: Path, max_total: int | None = None) -> int:
    """Copy the regular files under ``src`` to ``dst``; the disk they take (BLOCK_BYTES a file and a folder at
    least). Folders are opened one by one from their parent's descriptor, never through a link, and files relative
    to their folder's descriptor: nothing is resolved by path twice (a path walk opened ``folder/name`` by name after
    listing it, and a runner that swapped the folder for a link to a host folder mid-copy got that folder's files
    into its cache entry: round 5). The walk keeps its own stack (no recursion) and holds a descriptor per level.
    Sparse files and files with more than one link (copied once per name: round 32) are skipped. Past ``max_total``
    bytes, ENTRY_MAX_FILES files and folders, or ENTRY_MAX_DEPTH levels: TooLarge."""
    total = count = 0
    stack: list[tuple[int, Path, Iterator[tuple[str, bool]] | None]] = []
    try:
        stack.append((os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW), Path("."), None))
        while stack:
            dir_fd, rel, listing = stack[-1]
            if listing is None:
                (dst / rel).mkdir(parents=True, exist_ok=True)
                with os.scandir(dir_fd) as found:
                    names = [(e.name, e.is_dir(follow_symlinks=False)) for e in found]
                count += len(names) + 1
                total += BLOCK_BYTES
                if count > ENTRY_MAX_FILES:
                    raise TooLarge(f"the folder holds more than {ENTRY_MAX_FILES:,} files and folders")
                listing = iter(names)
                stack[-1] = (dir_fd, rel, listing)
            for name, is_dir in listing:
                if is_dir:
                    if len(stack) >= ENTRY_MAX_DEPTH:
                        raise TooLarge(f"the folder nests more than {ENTRY_MAX_DEPTH} levels of folders")
                    try:
                        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                    except OSError:
                        continue  # a link, or gone
                    stack.append((child, rel / name, None))
                    break
                total += _copy_file(dir_fd, name, dst / rel / name, None if max_total is None else max_total - total)
            else:
                os.close(stack.pop()[0])
    finally:
        for dir_fd, _rel, _listing in stack:
            with contextlib.suppress(OSError):
                os.close(dir_fd)
    return total


def _copy_file(dir_fd: int, name: str, target: Path, room: int | None) -> int:
    """One regular file, opened relative to its folder without following a link; the disk the copy takes (0 where
    it is skipped). TooLarge, before anything is copied, where that is more than ``room``."""
    try:
        # O_NONBLOCK: a FIFO the runner planted would block the open until a writer came (round 4: the judge hung
        # until the evaluator's watchdog); a device node is no regular file either.
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return 0  # a link, or gone
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or _sparse(info) or info.st_nlink > 1:
            return 0
        cost = BLOCK_BYTES * (1 + -(-info.st_size // BLOCK_BYTES))
        if room is not None and cost > room:
            raise TooLarge("the folder takes more disk than a kept entry may")
        with open(target, "wb") as out:
            shutil.copyfileobj(fh, out, 1 << 20)
    # ninja compares modification times: the copy keeps the build's
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
    os.chmod(target, info.st_mode & 0o755)
    return cost


def _sparse(info: os.stat_result) -> bool:
    """Whether a file holds far fewer blocks than its size (small files may live in their inode: no block)."""
    return info.st_size > 1 << 16 and info.st_blocks * 512 < info.st_size // 2
