"""Red team, round 32: the state kb_gym keeps between candidates for builds: the ``load_inline`` build cache
(``worker/build_cache.py``), the precompiled header (``pch.py``), the header diet, and Triton's kept kernels
(``triton_cache.py``), read as a policy with millions of tries and the source open would, looking for a way one
candidate's build or kernels reach ANOTHER source's evaluation, an entry that loads what its source did not build,
the bound and eviction, and honest builds refused or rebuilt every time.

Each test asserts what a sound system does; holes were ``xfail(strict=True)`` until fixed. Measured on the 2-core CPU machine
(Python 3.11.7, torch 2.13 CPU, Landlock ABI 7, PID namespaces on), each hole in two variants (the parametrised
cases) and in 2 of 2 runs of this file (~105 s a run, two real C++ builds). Candidates run with ``integrity="off"``.

GOT THROUGH (all six fixed in the same session, 42; what each fix is follows its hole):

1. ``test_a_deep_folder_chain_in_a_kept_folder_is_the_candidates_verdict_alone`` (the worst: another source's
   verdict). A pure-Python candidate makes 1,500 nested folders (a few ms of ``mkdir``) in its build folder or in a
   Triton cache folder. ``copy_regular_files`` (``os.fwalk``, recursive in 3.11) raises RecursionError, which
   ``store`` does not catch: its staging folder ``.{key}.1.tmp`` (4 MB pad + ~1,000 folders, 7.9 MB) stays in the
   cache's root, uncounted and never evicted. Kept at load it fails the pipeline; either way the runner's removal
   (``shutil.rmtree``: recursive, and ``ignore_errors`` covers OSError only) raises out of ``run_job``'s ``finally`` and
   the judge dies; the evaluator's ``WorkerHandle.kill`` then raises the same from its own ``rmtree`` of the judge's
   scratch before it forgets the dead process. Measured (both variants, 2 of 2): the attack ``crash`` "evaluator
   error: RecursionError", the honest GELU after it ``crash`` (the same), every later evaluation on that worker the
   same, ``Evaluator.close`` raises RecursionError into the caller, and the judge's scratch folder stays in /tmp.
   ``test_keeping_a_deep_folder_chain_fails_cleanly_and_leaves_nothing``: the same through ``keep`` alone (build and
   Triton): RecursionError, ~6 MB of staging left.
   Fixed: the copy keeps its own stack (a descriptor a level) and refuses past ENTRY_MAX_DEPTH levels and
   ENTRY_MAX_FILES files and folders (TooLarge: nothing kept); ``store`` catches every failure and removes its staging;
   a folder a candidate shaped is removed by ``file_tree.remove_tree`` (``rm -rf`` where ``rmtree`` fails); the worker
   handle forgets a dead judge before it cleans up.
2. ``test_a_candidate_that_builds_nothing_keeps_nothing_and_evicts_no_honest_build``. ``job._pipeline`` keeps the
   build folder after every load that restored nothing (``may_build`` gates only the lock), and ``triton_cache.keep``
   keeps for any source containing the word "triton" (a comment). A hard link is copied once per name. Measured with
   the bound at 40 MB and a 12 MB honest entry last used 10 min ago: a pure-Python candidate writing 30 MB in
   TORCH_EXTENSIONS_DIR, and one writing 1 MB in its Triton folder and linking it 29 times, each got a 31,457,280-byte
   entry and the honest entry was evicted (2 of 2 each). At the default 20 GB bound and 1 GB an entry: ~20 such
   candidates, 1 GB written (or 1 MB + links) each, flush every honest build of the host.
   Fixed: a build folder is kept only for a source whose code names the builder (``may_build``) and only its
   extensions' folders that hold a library (``ext/NAME/*.so``); Triton's only for a source whose code names Triton and
   where a new folder holds a compiled ``.cubin``; files with more than one link are not copied; an entry holds at most
   256 MB. A source that names the builder and writes a file called ``.so`` is still kept, under its own key: up to
   256 MB of the cache's 20 GB an evaluation, never a verdict.
3. ``test_the_cache_bound_holds_what_its_entries_take_on_disk``. The bound sums ``st_size`` (the marker); an empty
   folder or a 1-byte file is a 4 KB block and an inode on the disk. Three entries of 3,000 empty folders (or 1-byte
   files): recorded 0 (9,000) bytes, 37.2 MB on disk against a 4 MB bound, nothing evicted. A runner may hold
   100,000 entries (scratch_disk): ~400 MB of disk a candidate counted as nothing; the cache grows without bound.
   Fixed: a file counts its blocks and one more, a folder one block (BLOCK_BYTES), and an entry holds at most
   ENTRY_MAX_FILES files and folders.
4. ``test_two_judges_keeping_one_source_at_once_keep_one_whole_folder``. ``store`` stages in
   ``.{key}.{os.getpid()}.tmp`` and every judge is PID 1 of its namespace (``worker.info["pid"] == 1``; the leaked
   ``.{key}.1.tmp`` of hole 1), so two judges keeping one source share the staging folder. With judge B descheduled
   between the two folders of its copy while judge A keeps the same source: the entry left marked complete holds B's
   second folder only (5 of 10 files; the marker says 10,000 bytes), build and Triton alike. Two keeps of one source
   meet where no lock is held: a source ``may_build`` misses, a lock wait past its timeout, a build kept at exit
   (outside ``building``). A restore then "hits" a partial build: rebuilt at every evaluation and never kept again
   (a restore's load is never kept), or Triton's kernels compiled again each time.
   Fixed: each keep stages in a folder of its own (``tempfile.mkdtemp``) and gives up where a complete entry appeared
   meanwhile; staging and evicted folders older than an hour (a judge that died mid-copy) are swept.
5. ``test_restoring_kept_kernels_reads_a_bounded_group_file`` (Triton's cache, off by default). ``_repoint`` reads
   every kept ``__grp__*.json`` whole in the judge (``read_text``, ``json.loads``, ``json.dumps``). A 3.9 MB group of
   100,000 small children cost the judge a 57-61 MB peak (15x), a 16 MB one with one long value 50 MB (3x); a 1 GB group
   (ENTRY_MAX_BYTES) would cost the judge gigabytes, memory no candidate limit counts. Only the same source's next
   evaluation restores it, but the judge and the host pay (the OOM killer takes runners, any judge's, first).
   Fixed: a group file over 64 KB (Triton's are under 1 KB), or a link, is dropped unread (a miss for its kernel).
6. ``test_a_build_made_in_the_first_call_is_kept_stand_in`` and ``..._is_a_cache_hit_the_second_time`` (a false
   negative). The keep runs at load only; an empty build folder then keeps nothing, ``build_kept`` is "at_load", and
   nothing is kept at exit. An honest candidate that builds lazily (``if self.ext is None: self.ext =
   load_inline(...)`` in ``forward``) is built again at every evaluation: a real C++ build, evaluated twice, paid
   30.7 and 32.9 s of its correctness stage (27.0 and 20.2 s in the second run; ``build_cached`` False both times),
   where tests/test_build_cache.py holds an eager build's second load under 3 s.
   Fixed: where a source that may build has built nothing by the end of its load, the build is kept at exit.

HELD (plain tests):

- The runner reaches no entry: its working folder is the mount point ``<cache>/.runner``, one ``..`` from the cache,
  but listing it and reading an entry's file are refused (EACCES, Landlock reads), writing there too, and linking an
  entry's file into its build folder (which the judge would copy into its own entry) is EXDEV (Landlock REFER). Links
  and a FIFO it leaves in its build folder are not kept (``test_a_runner_reaches_no_cache_entry_...``).
- A build folder, or a Triton kernel folder, that is itself a link to a folder of the judge's keeps nothing.
- The key: the whole source (so every ``extra_cflags``, ``extra_include_paths``, ``functions``, extension name and
  environment variable the source sets) and the toolchain (CXX, CC, TORCH_CUDA_ARCH_LIST, CUDA_HOME change it); a
  build entry and a Triton entry of one source never share a folder. No key can be steered onto another source's.
- Triton group files restored name only files of the restored folder: hostile children (``../../etc/passwd``, absolute
  paths, the cache's root) are cut to their last component; ``..`` and ``/`` name a folder of the runner's own cache.
- Not tried again, pinned elsewhere: the precompiled header is never written by a runner and a changed one is never
  used (tests/test_build_cache.py); symlinks, FIFOs and sparse files in the build folder (rounds 4, 5, 7); a half-
  written (unmarked) entry is never restored (tests/test_build_cache.py, tests/test_triton_cache.py). The header diet
  and its fallback marker live in the build folder and reach only the same source. A library replaced between
  ``native_guard.check_library`` and its load is the runner's own process (defence in depth, round 22), not the
  cache's: a kept entry is checked again at every load.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from device import DEVICE, ON_GPU
from test_judge_isolation import CHECK, CPP_EXTENSION, GELU, HONEST, cand

from kb_gym import Evaluator
from kb_gym.worker import build_cache, triton_cache

TOOLS = "torch|cuda|sm_90"
# a source whose code names the extension builder and Triton (build_cache.may_build, triton_cache.uses_triton): what
# the caches keep for at all since round 32's fixes
SOURCE = "from torch.utils.cpp_extension import load_inline\nimport triton\n"
MB = 1 << 20
# The module's judges hold their cache to 40 MB (KB_GYM_EXTENSIONS_MAX_GB): eviction is then seen with small files.
BOUND = 40 * MB

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("ninja") is None,
                                    reason="needs g++ and ninja")


def _rm_rf(path: str | Path | None) -> None:
    """Remove a folder however deep (shutil.rmtree stops at Python's recursion limit; GNU rm does not)."""
    if path:
        subprocess.run(["rm", "-rf", "--", str(path)], check=False)


def _allocated(folder: Path) -> int:
    """Bytes ``folder`` takes on disk: every file's and folder's blocks (what fills a disk)."""
    total = 0
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def _leftovers(root: Path) -> list[str]:
    """Staging and trash folders left in the cache's root: never loaded, never counted, never evicted."""
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.name.endswith((".tmp", ".evicted")))


def _planted_entry(root: Path, key: str, size: int, age_s: float) -> Path:
    """A complete entry as keep leaves one (an honest build kept earlier), last used ``age_s`` ago."""
    folder = root / key
    (folder / "ext" / "honest").mkdir(parents=True)
    (folder / "ext" / "honest" / "honest.so").write_bytes(os.urandom(size))
    (folder / build_cache.MARKER).write_text(str(size))
    used = time.time() - age_s
    os.utime(folder / build_cache.MARKER, (used, used))
    return folder


def _deep_chain(top: Path, depth: int) -> None:
    """``depth`` nested folders under ``top``, made through descriptors (no path is ever longer than a name)."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    """The module's judges: a cache of their own, bounded to BOUND, with Triton's kept kernels on."""
    root = tmp_path_factory.mktemp("round32") / "extensions"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KB_GYM_EXTENSIONS_DIR", str(root))
        mp.setenv("KB_GYM_EXTENSIONS_MAX_GB", str(BOUND / (1 << 30)))
        mp.setenv(triton_cache.ENV, "1")
        yield root
    _rm_rf(root)


@pytest.fixture(scope="module")
def ev(cache_env):
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        e.warm()
        yield e


def _entry_holding(root: Path, relative: str) -> Path | None:
    """The complete entry whose files include ``relative`` (e.g. ``ext/junk``), None where there is none."""
    for entry in root.iterdir() if root.is_dir() else []:
        if not entry.name.startswith(".") and (entry / build_cache.MARKER).is_file() and (entry / relative).exists():
            return entry
    return None


# --- 1. a candidate that builds nothing keeps a build folder, and evicts honest builds with it -----------------------
#
# Mechanism: ``job._pipeline`` calls ``build_cache.keep`` after every load that restored nothing, whatever the source
# (``may_build`` gates only the lock), and ``keep`` copies whatever regular files the runner's TORCH_EXTENSIONS_DIR
# holds; ``triton_cache.keep`` does the same for any source that merely contains the word "triton" (a comment). Each
# entry may hold up to ENTRY_MAX_BYTES (1 GB), and a hard link is copied once per name, so a runner that wrote 1 MB and
# linked it 29 times gets a 30 MB entry. Past the bound the least recently used entries go: honest builds.

JUNK_IN_BUILD_FOLDER = cand('''
import os
_dir = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "junk")
os.makedirs(_dir, exist_ok=True)
with open(os.path.join(_dir, "junk.so"), "wb") as _f:
    _f.write(os.urandom(30 << 20))
''')

LINKED_JUNK_IN_TRITON_FOLDER = cand('''
import os
# triton (the word alone has this runner's Triton cache folder kept)
_dir = os.path.join(os.environ["TRITON_CACHE_DIR"], "feedbeef")
os.makedirs(_dir, exist_ok=True)
_first = os.path.join(_dir, "k0.cubin")
with open(_first, "wb") as _f:
    _f.write(os.urandom(1 << 20))
for _i in range(1, 30):
    os.link(_first, os.path.join(_dir, f"k{_i}.cubin"))
''')


@pytest.mark.parametrize("source, kept", [(JUNK_IN_BUILD_FOLDER, "ext/junk"),
                                          (LINKED_JUNK_IN_TRITON_FOLDER, "triton/feedbeef")],
                         ids=["junk_in_build_folder", "hard_linked_junk_in_triton_folder"])
def test_a_candidate_that_builds_nothing_keeps_nothing_and_evicts_no_honest_build(ev, cache_env, source, kept):
    honest = _planted_entry(cache_env, ("a" if kept.startswith("ext") else "b") * 24, 12 * MB, 600)
    r = ev.evaluate(GELU, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    junk = _entry_holding(cache_env, kept)
    measured = {"junk_entry_bytes": int((junk / build_cache.MARKER).read_text()) if junk else None,
                "honest_entry_left": (honest / build_cache.MARKER).is_file()}
    assert junk is None and measured["honest_entry_left"], measured


# --- 2. the bound counts bytes of content, not what an entry takes on disk --------------------------------------------
#
# Mechanism: ``copy_regular_files`` returns the sum of ``st_size``, ``store`` writes it in the marker and ``evict``
# sums the markers. An empty folder or a one-byte file is 0 or 1 byte there and a 4 KB block (plus an inode) on the
# disk. A runner may hold 100,000 entries (scratch_disk.MAX_ENTRIES): about 400 MB of disk a candidate, counted as
# nothing, so the cache grows without bound however low KB_GYM_EXTENSIONS_MAX_GB is set.

def _many_small(ext: Path, shape: str, count: int) -> None:
    folder = ext / "e"
    folder.mkdir(parents=True)
    (folder / "e.so").write_bytes(b"built")  # a build's library: what keep keeps a folder for
    for i in range(count):
        if shape == "empty_folders":
            (folder / f"d{i}").mkdir()
        else:
            (folder / f"f{i}.o").write_bytes(b"x")


@pytest.mark.parametrize("shape", ["empty_folders", "one_byte_files"])
def test_the_cache_bound_holds_what_its_entries_take_on_disk(shape, tmp_path, monkeypatch):
    root = tmp_path / "extensions"
    bound = 4 * MB
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(root))
    monkeypatch.setenv("KB_GYM_EXTENSIONS_MAX_GB", str(bound / (1 << 30)))
    for k in range(3):
        ext = tmp_path / f"runner{k}" / "ext"
        _many_small(ext, shape, 3000)
        build_cache.keep(f"{SOURCE}# {k} {shape}", ext, TOOLS)
    recorded = sum(size for _, size, _ in build_cache.entries(root))
    on_disk = _allocated(root)
    assert on_disk <= 2 * bound, {"recorded_bytes": recorded, "on_disk_bytes": on_disk, "bound": bound,
                                  "entries": len(build_cache.entries(root))}


# --- 3. a folder chain deeper than Python's recursion limit in a kept folder ---------------------------------------------
#
# Mechanism: ``copy_regular_files`` walks with ``os.fwalk``, recursive in Python 3.11: a chain of ~1,000 nested folders
# raises RecursionError, which ``store`` does not catch (only OSError and TooLarge), so its staging folder (and the
# bytes copied so far: up to ENTRY_MAX_BYTES) is left in the cache's root, where ``entries`` and ``evict`` never look
# (names starting with "."). Kept at load (build folder) the error leaves the pipeline: "the judge failed", a restart.
# Then ``shutil.rmtree`` (recursive too; RecursionError is no OSError, so ``ignore_errors`` does not cover it) raises
# out of ``RunnerProcess.kill`` in ``run_job``'s ``finally``: the judge process dies, and the evaluator's
# ``WorkerHandle.kill`` raises the same from ITS ``shutil.rmtree`` of the judge's scratch folder, before it forgets the
# dead process: every later evaluation on that worker is a crash ("evaluator error: RecursionError"), and
# ``Evaluator.close`` raises RecursionError into the caller. 1,500 folders: 1,500 mkdir calls in a pure-Python
# candidate, a few ms.

def _deep_candidate(variable: str, sub: str) -> str:
    return cand(f'''
import os
# triton (the word alone has this runner's Triton cache folder kept)
_top = os.path.join(os.environ["{variable}"], "{sub}")
os.makedirs(_top, exist_ok=True)
with open(os.path.join(_top, "pad.so"), "wb") as _f:
    _f.write(os.urandom(4 << 20))
_fd = os.open(_top, os.O_RDONLY)
for _ in range(1500):
    os.mkdir("d", dir_fd=_fd)
    _next = os.open("d", os.O_RDONLY, dir_fd=_fd)
    os.close(_fd)
    _fd = _next
os.close(_fd)
''')


def _scratches(evaluator: Evaluator) -> set[str]:
    return {w.info.get("scratch") for w in evaluator._workers if getattr(w, "info", None) and w.info.get("scratch")}


@pytest.mark.parametrize("variable, sub", [("TORCH_EXTENSIONS_DIR", "deep"), ("TRITON_CACHE_DIR", "feedbeef")],
                         ids=["build_folder", "triton_folder"])
def test_a_deep_folder_chain_in_a_kept_folder_is_the_candidates_verdict_alone(variable, sub, tmp_path, monkeypatch):
    root = tmp_path / "extensions"
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(root))
    monkeypatch.setenv(triton_cache.ENV, "1")
    evaluator = Evaluator(DEVICE, results_path=False, baseline_cache=False).warm()
    scratches = _scratches(evaluator)
    closing = attack = honest = None
    try:
        attack = evaluator.evaluate(GELU, _deep_candidate(variable, sub), config=CHECK)
        scratches |= _scratches(evaluator)
        honest = evaluator.evaluate(GELU, HONEST, config=CHECK)
        scratches |= _scratches(evaluator)
    finally:
        try:
            evaluator.close()
        except RecursionError as exc:
            closing = exc
        for folder in scratches:
            _rm_rf(folder)
        for handle in evaluator._workers:
            handle.kill()  # nothing left to remove now: forgets the process the failed close kept
        left = _leftovers(root)
        _rm_rf(root)
    problems = []
    if attack is None or honest is None:
        problems.append("an evaluation raised")
    elif attack.status == "crash":
        problems.append(f"the attack: crash ({(attack.error or '')[:100]})")
    if honest is not None and honest.status != "correct":
        problems.append(f"the honest candidate after it: {honest.status} ({(honest.error or '')[:100]})")
    if closing is not None:
        problems.append("Evaluator.close raised RecursionError")
    if left:
        problems.append(f"left in the cache's root: {left}")
    assert not problems, problems


@pytest.mark.parametrize("cache", ["build", "triton"])
def test_keeping_a_deep_folder_chain_fails_cleanly_and_leaves_nothing(cache, tmp_path, monkeypatch):
    root = tmp_path / "extensions"
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(root))
    folder = tmp_path / "runner" / ("ext" if cache == "build" else "triton")
    top = folder / ("deep" if cache == "build" else "feedbeef")
    top.mkdir(parents=True)
    (top / "pad.so").write_bytes(os.urandom(2 * MB))
    _deep_chain(top, 1500)
    raised = None
    try:
        if cache == "build":
            build_cache.keep(SOURCE, folder, TOOLS)
        else:
            triton_cache.keep(SOURCE, folder, TOOLS, seeded=set())
    except RecursionError as exc:
        raised = exc
    left = _leftovers(root)
    left_bytes = sum(_allocated(root / name) for name in left) if left else 0
    for name in left:
        _rm_rf(root / name)
    _rm_rf(tmp_path / "runner")
    assert raised is None and not left, {"raised": type(raised).__name__ if raised else None, "left": left,
                                         "left_bytes": left_bytes}


# --- 4. two judges keep one source at once: one staging folder for both ----------------------------------------------
#
# Mechanism: ``store`` stages in ``.{key}.{os.getpid()}.tmp``, and every judge is PID 1 of its own PID namespace
# (``worker.info["pid"]``), so two judges keeping the same source share the staging folder: one's ``rmtree(staging)``
# empties the other's copy, its ``os.replace`` moves the other's partial copy into place and marks it complete, and
# the other, resuming, re-creates the staging folder (``mkdir(parents=True)``), removes that complete entry and puts
# the rest of its copy in its place, marked complete too. Two judges keep one source at once where no lock is held:
# a source ``may_build`` misses, a lock wait past its timeout, or a build kept at exit (``build_kept == "at_exit"``,
# outside ``building``) beside another judge's build of it. Here judge B is descheduled between two folders of its
# copy (threads stand in for the two judges: they share a pid, as the judges do).

def _runner_folder(base: Path, cache: str, tag: bytes) -> Path:
    folder = base / ("ext" if cache == "build" else "triton")
    for sub in (("e", "f") if cache == "build" else ("aaa", "bbb")):
        (folder / sub).mkdir(parents=True)
        for i in range(5):  # what a build (a library) and a compile (a cubin) leave: kept since round 32's fixes
            (folder / sub / f"{i}.{'so' if cache == 'build' else 'cubin'}").write_bytes(tag * 1000)
    return folder


def _tree(folder: Path) -> dict[str, str]:
    """Each file and whose copy it is (the runner's tag, its first byte)."""
    return {str(p.relative_to(folder)): p.read_bytes()[:1].decode() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("cache", ["build", "triton"])
def test_two_judges_keeping_one_source_at_once_keep_one_whole_folder(ev, cache, tmp_path, monkeypatch):
    pids = [w.info.get("pid") for w in ev._workers]
    if pids != [1]:
        pytest.skip(f"judges are not PID 1 of their own namespaces here ({pids}): their staging names differ")
    root = tmp_path / "extensions"
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(root))
    a, b = _runner_folder(tmp_path / "a", cache, b"A"), _runner_folder(tmp_path / "b", cache, b"B")
    paused, resume = threading.Event(), threading.Event()
    folders_begun = []
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if (threading.current_thread().name == "judge-b" and self.parent.name in ("ext", "triton")
                and self.name not in folders_begun):
            folders_begun.append(self.name)
            if len(folders_begun) == 2:  # between the first folder of its copy and the second
                paused.set()
                resume.wait(30)
        return real_mkdir(self, *args, **kwargs)

    def keep(folder: Path) -> None:
        if cache == "build":
            build_cache.keep(SOURCE, folder, TOOLS)
        else:
            triton_cache.keep(SOURCE, folder, TOOLS, seeded=set())

    monkeypatch.setattr(Path, "mkdir", mkdir)
    judge_b = threading.Thread(target=keep, args=(b,), name="judge-b")
    judge_b.start()
    assert paused.wait(30)
    keep(a)  # judge A keeps the same source whole meanwhile
    resume.set()
    judge_b.join(30)
    monkeypatch.undo()
    key = build_cache.source_key(SOURCE, TOOLS) if cache == "build" else triton_cache.entry_key(SOURCE, TOOLS)
    entry = root / key
    assert (entry / build_cache.MARKER).is_file()  # a complete entry is there
    kept = _tree(entry / ("ext" if cache == "build" else triton_cache.FOLDER))
    assert kept in (_tree(a), _tree(b)), {"kept": kept, "marker_bytes": (entry / build_cache.MARKER).read_text(),
                                          "runner_files": len(_tree(b))}


# --- 5. Triton's group files are read whole into the judge --------------------------------------------------------------
#
# Mechanism: ``triton_cache._repoint`` runs in the judge at every restore and reads each ``__grp__*.json`` of the
# entry with ``read_text`` + ``json.loads`` (and writes it back with ``json.dumps``), however large: the candidate
# wrote the file in its Triton cache folder, up to ENTRY_MAX_BYTES. Triton's own group files are under 1 KB. The judge's
# memory is not held to the candidate's limit (host_memory.candidate_memory_bytes leaves the judge's pages out), and
# the host's OOM killer takes runners first (score 1000), any judge's. Only the same source's next evaluation
# restores the entry, but the memory is the judge's and the host's.

@pytest.mark.parametrize("shape", ["many_children", "one_long_value"])
def test_restoring_kept_kernels_reads_a_bounded_group_file(shape, tmp_path, monkeypatch):
    root = tmp_path / "extensions"
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(root))
    runner = tmp_path / "r1" / "triton"
    (runner / "aaa").mkdir(parents=True)
    (runner / "aaa" / "k.cubin").write_bytes(b"compiled")
    if shape == "many_children":
        group = {"child_paths": {f"c{i}.cubin": f"/r/aaa/c{i}.cubin" for i in range(100_000)}}
    else:
        group = {"child_paths": {"k.cubin": "/r/aaa/k.cubin"}, "pad": "x" * (16 * MB)}
    (runner / "aaa" / "__grp__k.json").write_text(json.dumps(group))
    del group
    size = (runner / "aaa" / "__grp__k.json").stat().st_size
    triton_cache.keep(SOURCE, runner, TOOLS, seeded=set())
    tracemalloc.start()
    try:
        assert triton_cache.restore(SOURCE, tmp_path / "r2" / "triton", TOOLS) == 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MB, {"group_file_bytes": size, "judge_peak_bytes": peak}


# --- 6. a build made after the load (in the first forward) is never kept ------------------------------------------------
#
# Mechanism: ``job._pipeline`` keeps at load, with the tree held still: an empty build folder keeps nothing (``keep``
# returns at once), and ``build_kept`` is "at_load" all the same, so ``_keeper`` keeps nothing at exit either. A
# candidate that builds its extension lazily, on its first call (an honest pattern: ``if self.ext is None:
# self.ext = load_inline(...)``), is built again at every evaluation, inside its correctness stage's limit.

LAZY_STAND_IN = cand('''
import os
from torch.utils.cpp_extension import load_inline  # named: a source that may build
_built = []
''', forward='''if not _built:  # a stand-in for a build made in the first call
    _dir = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "lazy_stand_in")
    os.makedirs(_dir, exist_ok=True)
    with open(os.path.join(_dir, "lazy_stand_in.so"), "wb") as _f:
        _f.write(b"built in the first call")
    _built.append(1)
return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))''')

# CPP_EXTENSION's build (test_judge_isolation), made in the first call instead of at import
LAZY_BUILD = CPP_EXTENSION.replace(
    'ext = load_inline(name="guard_gelu_cpu", cpp_sources=source, functions=["gelu"], verbose=False)\n', "").replace(
    "    def forward(self, x):\n        return ext.gelu(x)\n", """    def __init__(self):
        super().__init__()
        self.ext = None

    def forward(self, x):
        if self.ext is None:  # built on the first call
            self.ext = load_inline(name="round32_lazy_gelu", cpp_sources=source, functions=["gelu"], verbose=False)
        return self.ext.gelu(x)
""")
assert "round32_lazy_gelu" in LAZY_BUILD and "guard_gelu_cpu" not in LAZY_BUILD


def test_a_build_made_in_the_first_call_is_kept_stand_in(ev, cache_env):
    r = ev.evaluate(GELU, LAZY_STAND_IN, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert _entry_holding(cache_env, "ext/lazy_stand_in") is not None, r.worker.get("build_kept")


@needs_compiler
@pytest.mark.skipif(ON_GPU, reason="a C++ loop over data_ptr, for CPU tensors only")
def test_a_real_build_made_in_the_first_call_is_a_cache_hit_the_second_time(ev):
    config = CHECK.replace(correctness_timeout=300)  # a cold build on two busy cores: 17-60 s
    first = ev.evaluate(GELU, LAZY_BUILD, config=config)
    second = ev.evaluate(GELU, LAZY_BUILD, config=config)
    assert first.status == second.status == "correct", (first.error, second.error)
    assert second.worker["build_cached"], {
        "build_kept": [first.worker.get("build_kept"), second.worker.get("build_kept")],
        "correctness_s": [round(r.stage_seconds.get("correctness", 0), 1) for r in (first, second)]}


# --- defences that held ---------------------------------------------------------------------------------------------

# The runner reaches neither the cache nor another source's entry: its working folder is the runners' mount point
# inside the cache's root, so the root is one ``..`` away. It may not list it, write there, or link a file of it into
# its own build folder (which the judge would copy into its own entry); the links, FIFO and socket it leaves in its
# build folder are not kept.
PROBE = cand('''
import os
from torch.utils.cpp_extension import load_inline  # named: a source that may build, whose build folder is kept
_ext = os.environ["TORCH_EXTENSIONS_DIR"]
_root = os.path.dirname(os.getcwd())
_secret = os.path.join(_root, "@SECRET@", "ext", "honest", "honest.so")
_escaped = []
for _name, _try in (
    ("list the cache", lambda: os.listdir(_root)),
    ("write in the cache", lambda: open(os.path.join(_root, "planted"), "w").close()),
    ("make an entry", lambda: os.mkdir(os.path.join(_root, "0" * 24))),
    ("read an entry", lambda: open(_secret, "rb").read()),
    ("link an entry's file", lambda: os.link(_secret, os.path.join(_ext, "linked.so"))),
):
    try:
        _try()
        _escaped.append(_name)
    except OSError:
        pass
_mine = os.path.join(_ext, "probe")
os.makedirs(_mine, exist_ok=True)
with open(os.path.join(_mine, "probe.so"), "wb") as _f:
    _f.write(b"plain")
os.symlink("/etc/passwd", os.path.join(_mine, "to_passwd.so"))
os.symlink(_secret, os.path.join(_mine, "to_secret.so"))
try:
    os.mkfifo(os.path.join(_mine, "pipe.so"))
except OSError:
    pass
if _escaped:
    raise RuntimeError(f"escaped: {_escaped} (root {_root})")
''')


def test_a_runner_reaches_no_cache_entry_and_only_its_regular_files_are_kept(ev, cache_env):
    secret_key = "f" * 24
    _planted_entry(cache_env, secret_key, 1000, 0)
    r = ev.evaluate(GELU, PROBE.replace("@SECRET@", secret_key), config=CHECK)
    if not r.worker.get("landlock"):
        pytest.skip("no Landlock here: an unconfined runner may write anywhere its user may")
    assert r.status == "correct", (r.status, r.error)
    assert not (cache_env / "planted").exists() and not (cache_env / ("0" * 24)).exists()
    entry = _entry_holding(cache_env, "ext/probe")
    assert entry is not None
    assert sorted(p.name for p in (entry / "ext" / "probe").iterdir()) == ["probe.so"]
    assert not (entry / "ext" / "linked.so").exists()


def test_the_key_covers_every_build_input_the_source_names_and_the_toolchain(monkeypatch):
    base = 'load_inline(name="op", cpp_sources=s, functions=["f"], extra_cflags=["-O2"])'
    variants = [base, base.replace('"-O2"', '"-O3"'), base.replace('["f"]', '["f", "g"]'),
                base.replace('"op"', '"op2"'), 'import os; os.environ["CXX"] = "clang++"\n' + base,
                base.replace("extra_cflags", "extra_include_paths")]
    assert len({build_cache.source_key(v, TOOLS) for v in variants}) == len(variants)
    # a build entry and a Triton entry of one source never share a folder
    assert build_cache.source_key(base, TOOLS) != triton_cache.entry_key(base, TOOLS)
    device = torch.device("cpu")
    tools = {build_cache.toolchain(device)}
    for name in ("CXX", "CC", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME"):
        monkeypatch.setenv(name, f"/opt/other/{name}")
        tools.add(build_cache.toolchain(device))
    assert len(tools) == 5


def test_restored_group_files_name_only_files_of_their_own_folder(tmp_path, monkeypatch):
    root = tmp_path / "extensions"
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(root))
    runner = tmp_path / "r1" / "triton"
    (runner / "aaa").mkdir(parents=True)
    (runner / "aaa" / "k.cubin").write_bytes(b"compiled")
    hostile = {"a": "../../../../etc/passwd", "b": "/root/.ssh/id_rsa", "c": str(root), "d": "..", "e": "/"}
    (runner / "aaa" / "__grp__k.json").write_text(json.dumps({"child_paths": hostile}))
    triton_cache.keep(SOURCE, runner, TOOLS, seeded=set())
    target = tmp_path / "r2" / "triton"
    assert triton_cache.restore(SOURCE, target, TOOLS) == 1
    paths = json.loads((target / "aaa" / "__grp__k.json").read_text())["child_paths"]
    # each names a file of the restored folder, or (".." and "/" as a name) a folder of the runner's own Triton cache
    own = target.resolve()
    assert all(Path(p).resolve() == own or own in Path(p).resolve().parents for p in paths.values()), paths


def test_a_build_or_triton_folder_swapped_for_a_link_keeps_nothing(tmp_path, monkeypatch):
    """Round 5 swapped a folder inside the build folder for a link mid-copy; here the whole folder is a link (to a
    folder of the judge's) when the judge keeps it, and a kernel folder of Triton's cache is one: nothing is kept."""
    root = tmp_path / "extensions"
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(root))
    judges = tmp_path / "judges_folder"
    (judges / "lib").mkdir(parents=True)
    (judges / "lib" / "secret.so").write_bytes(b"the judge's")
    runner = tmp_path / "runner"
    runner.mkdir()
    (runner / "ext").symlink_to(judges)
    build_cache.keep(SOURCE, runner / "ext", TOOLS)
    (runner / "triton").mkdir()
    (runner / "triton" / "feedbeef").symlink_to(judges / "lib")
    triton_cache.keep(SOURCE, runner / "triton", TOOLS, seeded=set())
    assert not root.exists() or not [p for p in root.rglob("*") if p.is_file()], list(root.rglob("*"))
