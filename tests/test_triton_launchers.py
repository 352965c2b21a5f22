"""Triton launchers built by the judge's side and seeded into runners (kb_gym/worker/triton_launchers.py).

The Triton here (3.9) builds no launcher per signature, and this machine has no CUDA, so a stand-in driver plays
Triton 3.6's part: its ``make_launcher`` writes a real C extension named as Triton's launcher is, whose source
depends on the signature's argument kinds only, and Triton's own ``compile_module_from_src`` builds and caches
it. On a GPU with Triton 3.6, tests/gpu/test_gpu_triton_launchers.py runs the real thing.
"""

from __future__ import annotations

import json
import shutil
import sys
import sysconfig
import types
from pathlib import Path

import pytest
import torch
from adversarial.stand_ins import fake_driver

from kb_gym.worker import triton_launchers

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None and shutil.which("clang") is None
    or not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file(),
    reason="needs a C compiler and Python's headers")

SIGNATURE = {0: "*fp32", 1: "*fp32", 2: "i32", 3: "constexpr"}


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    fake = fake_driver()
    monkeypatch.setattr(triton_launchers, "_driver", lambda: fake)
    return fake


def _runner_launch(driver: types.ModuleType, cache: Path, monkeypatch: pytest.MonkeyPatch,
                   signature: dict[int, str] = SIGNATURE) -> types.ModuleType:
    """What Triton 3.6's CudaLauncher does at a kernel's first call, in a runner whose Triton cache is ``cache``."""
    from triton.runtime.build import compile_module_from_src

    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    src = driver.make_launcher({}, signature, None)
    return compile_module_from_src(src=src, name="__triton_launcher", library_dirs=driver.library_dirs(),
                                   include_dirs=driver.include_dirs, libraries=driver.libraries)


def test_a_launcher_a_runner_built_is_built_by_the_judge_and_found_by_the_next_runner(
        driver: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import triton.runtime.build as triton_build

    pristine = driver.make_launcher, triton_build._build
    monkeypatch.setattr(triton_build, "_build", triton_build._build)  # record() wraps both: undone after the test
    root = tmp_path / "store"
    notes = triton_launchers.record()
    assert _runner_launch(driver, tmp_path / "runner1", monkeypatch).kinds == "ptr,ptr,i32,constexpr"
    assert notes == [{"signature": ["*fp32", "*fp32", "i32", "constexpr"], "hit": False}]
    missed = [s for s, hit in triton_launchers.reported(notes) if not hit]
    runner_wrappers = driver.make_launcher, triton_build._build
    driver.make_launcher, triton_build._build = pristine  # the builder is a process of its own

    assert triton_launchers.build(root, missed) == {triton_launchers.key(missed[0]): "ready"}
    assert list(root.glob("staging-*")) == []  # the staging cache is gone
    runner2 = tmp_path / "runner2"
    runner2.mkdir()
    assert triton_launchers.seed(root, runner2) == 1
    assert triton_launchers.seed(root, runner2) == 0  # folders it has are not copied again

    def no_build(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the runner compiled a launcher the judge had built")

    triton_build._build = no_build
    driver.make_launcher = runner_wrappers[0]
    triton_launchers_build = runner_wrappers[1]
    assert triton_launchers_build is not no_build
    # another kernel, other element types, the same kinds of arguments: the same launcher
    other = {0: "*bf16", 1: "*bf16", 2: "i32", 3: "constexpr"}
    assert _runner_launch(driver, runner2, monkeypatch, other).kinds == "ptr,ptr,i32,constexpr"
    assert notes[-1] == {"signature": ["*bf16", "*bf16", "i32", "constexpr"], "hit": True}


def test_a_launcher_changed_in_the_store_is_removed_never_seeded(
        driver: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "unused"))
    root = tmp_path / "store"
    signature = ("*fp32", "i64")
    triton_launchers.build(root, [signature])
    (folder,) = (root / "launchers").iterdir()
    (library,) = folder.iterdir()
    # the same bytes, replaced by some unconfined process (not written in place: the builder, here this very
    # process, has the library loaded)
    planted = library.with_name("planted")
    planted.write_bytes(library.read_bytes())
    planted.replace(library)
    runner = tmp_path / "runner"
    runner.mkdir()
    assert triton_launchers.seed(root, runner) == 0
    assert list(runner.iterdir()) == []
    assert not (root / "ready" / f"{triton_launchers.key(signature)}.json").exists()  # built again when next asked


def test_a_launcher_whose_mode_changed_is_not_seeded(
        driver: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "unused"))
    root = tmp_path / "store"
    triton_launchers.build(root, [("*fp32", "fp32")])
    (library,) = next((root / "launchers").iterdir()).iterdir()
    library.chmod(0o777)  # made writable for all: its change time moves, which no process can set back
    runner = tmp_path / "runner"
    runner.mkdir()
    assert triton_launchers.seed(root, runner) == 0


def test_only_folders_a_valid_marker_names_are_seeded(tmp_path: Path) -> None:
    root = tmp_path / "store"
    (root / "launchers" / "planted").mkdir(parents=True)
    (root / "launchers" / "planted" / "__triton_launcher.so").write_bytes(b"\x7fELF")
    (root / "ready").mkdir()
    (tmp_path / "outside").mkdir()
    for name, folders in [("a", {"../outside": []}), ("b", {"planted": "files"}), ("c", ["planted"]),
                          ("d", {"planted": [["__triton_launcher.so", 4, 0, 0, 1]]})]:  # wrong inode and time
        (root / "ready" / f"{name}.json").write_text(json.dumps({"folders": folders}))
    (root / "ready" / "e.json").write_text("{not json")
    runner = tmp_path / "runner"
    runner.mkdir()
    assert triton_launchers.seed(root, runner) == 0
    assert list(runner.iterdir()) == []
    assert list((root / "ready").iterdir()) == []  # every bad marker removed


@pytest.mark.parametrize("value", [
    "i32", ["i32"] * 65, ["tensordesc<fp32[64, 64]>"], ["nvTmaDesc"], [("i32", "i32")], ["*fp32); system(\"x\""],
    ["i32 "], [3], [None], ["*"], ["*" + "f" * 40],
])
def test_a_signature_of_unknown_argument_kinds_is_dropped(value: object) -> None:
    assert triton_launchers.signature_of(value) is None
    assert triton_launchers.reported([{"signature": value, "hit": False}]) == []


def test_reported_notes_are_bounded_and_hits_are_only_true() -> None:
    notes = [{"signature": ["*fp32", "i32"], "hit": "yes"}, "junk", {"signature": ["u8", "fp16", "constexpr"]}]
    assert triton_launchers.reported(notes) == [(("*fp32", "i32"), False), (("u8", "fp16", "constexpr"), False)]
    many = [{"signature": ["i32"] * (i % 60 + 1), "hit": False} for i in range(100)]
    assert len(triton_launchers.reported(many)) == triton_launchers.MAX_REPORTED
    assert triton_launchers.reported({"signature": ["i32"]}) == []


def test_start_build_gives_the_builder_new_signatures_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr(triton_launchers.subprocess, "Popen", lambda args, **kw: started.append(args))
    monkeypatch.setattr(triton_launchers, "_started", {})
    root = tmp_path / "store"
    built, failed, new = ("*fp32",), ("*fp32", "i32"), ("*fp32", "i64")
    (root / "ready").mkdir(parents=True)
    (root / "failed").mkdir()
    (root / "ready" / f"{triton_launchers.key(built)}.json").write_text("{}")
    (root / "failed" / triton_launchers.key(failed)).write_text("no compiler")
    assert triton_launchers.start_build(root, [built, failed, new, new]) == 1
    assert triton_launchers.start_build(root, [new]) == 0  # started lately: not again
    assert triton_launchers.start_build(None, [new]) == 0
    (args,) = started
    assert args[:4] == [sys.executable, "-P", "-m", "kb_gym.worker.triton_launchers"]
    assert json.loads(Path(args[5]).read_text()) == [list(new)]


def test_the_builder_reads_its_request_and_drops_what_is_not_a_signature(
        driver: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "unused"))
    root = tmp_path / "store"
    root.mkdir()
    request = root / "request-1.json"
    request.write_text(json.dumps([["*fp32", "i32"], ["system('x')"], "i32"]))
    assert triton_launchers.main([str(root), str(request)]) == 0
    assert not request.exists()
    assert [p.name for p in (root / "ready").iterdir()] == [f"{triton_launchers.key(('*fp32', 'i32'))}.json"]


def test_a_launcher_that_does_not_build_is_marked_failed_and_not_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_driver()
    fake.make_launcher = lambda constants, signature, meta: "this is not C"
    monkeypatch.setattr(triton_launchers, "_driver", lambda: fake)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "unused"))
    root = tmp_path / "store"
    signature = ("*fp32",)
    assert triton_launchers.build(root, [signature]) == {triton_launchers.key(signature): "failed"}
    assert triton_launchers.build(root, [signature]) == {}
    assert list((root / "launchers").iterdir()) == []


def test_nothing_is_recorded_or_built_where_triton_builds_no_launcher_per_signature(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_launchers, "_driver", lambda: None)
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv(triton_launchers.ENV, "1")
    assert triton_launchers.record() is None
    assert triton_launchers.store_root() is None
    assert triton_launchers.build(tmp_path / "store", [("i32",)]) == {}


def test_the_store_is_on_where_a_gpu_is_unless_switched_off(driver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.delenv(triton_launchers.ENV, raising=False)
    assert (triton_launchers.store_root() is not None) == torch.cuda.is_available()  # on by default where a GPU is
    monkeypatch.setenv(triton_launchers.ENV, "0")
    assert triton_launchers.store_root() is None
    monkeypatch.setenv(triton_launchers.ENV, "1")
    assert triton_launchers.store_root() is not None
