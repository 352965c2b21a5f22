"""The extension build cache (worker/build_cache.py): one per machine, keyed by source and toolchain, never by
the extension's name; a source two judges get at once is built once."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from adversarial.test_judge_isolation import CHECK, CPP_EXTENSION, GELU

from kb_gym import Evaluator
from kb_gym.worker import build_cache, pch
from kb_gym.worker.runner_replies import pch_record

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("ninja") is None,
                                    reason="needs g++ and ninja")


def test_the_key_is_the_source_and_the_toolchain():
    key = build_cache.source_key("src", "torch 2|sm_90")
    assert key == build_cache.source_key("src", "torch 2|sm_90")
    assert key != build_cache.source_key("src", "torch 2|sm_80") != build_cache.source_key("src2", "torch 2|sm_90")


@needs_compiler
def test_two_evaluators_given_the_same_new_source_build_it_once(monkeypatch, tmp_path):
    """Two judges (two Evaluators, as two trainer processes would have) get one new load_inline source at the
    same moment: one builds, the other waits for it and loads its build."""
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    source = CPP_EXTENSION.replace("guard_gelu_cpu", "built_once_gelu")
    # The waiting judge's load stage covers the other's whole cold build (17-34 s alone, over 60 s on two busy cores)
    config = CHECK.replace(load_timeout=300)
    with Evaluator("cpu", results_path=False) as a, Evaluator("cpu", results_path=False) as b:
        a.warm()
        b.warm()
        results = {}
        threads = [threading.Thread(target=lambda name, ev: results.__setitem__(name, ev.evaluate(GELU, source,
                                                                                                  config=config)),
                                    args=(name, ev)) for name, ev in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [r.status for r in results.values()] == ["correct", "correct"], [r.error for r in results.values()]
    assert sorted(r.worker["build_cached"] for r in results.values()) == [False, True]
    assert len([p for p in (tmp_path / "extensions").iterdir() if not p.name.startswith(".")]) == 1
    # and the waiting judge's runner found that build up to date: every runner on the host sees its scratch
    # folder at one path, so the build's absolute paths match (with one path per judge, a hit was built again)
    hit = next(r for r in results.values() if r.worker["build_cached"])
    assert hit.worker["build_reused"] is hit.worker["pid_namespace"], hit.worker
    # the same for a runner started as a fresh interpreter (no zygote) under a third judge
    monkeypatch.setenv("KB_GYM_ZYGOTE", "0")
    with Evaluator("cpu", results_path=False) as c:
        fresh = c.evaluate(GELU, source, config=config)
    assert fresh.status == "correct" and not fresh.worker["runner_forked"], (fresh.error, fresh.worker)
    assert fresh.worker["build_cached"] and fresh.worker["build_reused"] is fresh.worker["pid_namespace"], fresh.worker


@needs_compiler
def test_one_extension_name_for_two_sources_is_two_entries(monkeypatch, tmp_path):
    """LLMs reuse names such as "custom_op": two sources under one extension name, evaluated in turn and then
    again, are each built once and each judged as its own code."""
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    right = CPP_EXTENSION.replace("guard_gelu_cpu", "custom_op")
    wrong = right.replace("0.5f * xp[i]", "0.25f * xp[i]")
    with Evaluator("cpu", results_path=False) as ev:
        first = [ev.evaluate(GELU, s, config=CHECK) for s in (right, wrong)]
        again = [ev.evaluate(GELU, s, config=CHECK) for s in (right, wrong)]
    assert [r.status for r in first] == [r.status for r in again] == ["correct", "incorrect"]
    assert [r.worker["build_cached"] for r in first + again] == [False, False, True, True]
    assert max(r.stage_seconds["load"] for r in again) < 0.5 * min(r.stage_seconds["load"] for r in first)


def test_only_sources_that_may_build_an_extension_wait_for_each_other(monkeypatch, tmp_path):
    """Two copies of a Triton or PyTorch candidate load side by side (tests/test_evaluator.py times it);
    only a source naming torch's extension builder takes the per-source lock."""
    import time

    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    assert build_cache.may_build(CPP_EXTENSION) and not build_cache.may_build("import triton\nclass ModelNew: ...")
    assert not build_cache.may_build("import time  # stands in for a load_inline build")  # comments do not count
    assert build_cache.may_build("import torch.utils.cpp_extension as c") and build_cache.may_build(
        'f = getattr(c, "load_inline")')
    with build_cache.building("import torch", "t", timeout=5):
        t0 = time.monotonic()
        with build_cache.building("import torch", "t", timeout=5):
            assert time.monotonic() - t0 < 0.5
    with build_cache.building(CPP_EXTENSION, "t", timeout=5):
        t0 = time.monotonic()
        with build_cache.building(CPP_EXTENSION, "t", timeout=0.3):  # held: waits, then goes on
            assert time.monotonic() - t0 >= 0.3


def test_a_precompiled_header_variant_is_chosen_only_for_flags_it_matches():
    assert pch.variant_for(None, {}) == "cpp"
    assert pch.variant_for("__global__ void k() {}", {"extra_cflags": ["-O3"]}) == "cuda-O3"
    assert pch.variant_for(None, {"extra_cflags": "-O2"}) == "cpp-O2"
    for kwargs in ({"extra_cflags": ["-O3", "-ffast-math"]}, {"extra_cflags": ["-DX=1"]},
                   {"extra_include_paths": ["inc"]}, {"no_implicit_headers": True}, {"use_pch": True}):
        assert pch.variant_for(None, kwargs) is None, kwargs
    assert set(pch.VARIANTS) >= {"cpp", "cpp-O3", "cuda", "cuda-O3"}
    # KernelBench's example answer passes blank flags: they change no compile, so the header still serves
    assert pch.variant_for("__global__ void k() {}", {"extra_cflags": [""], "extra_ldflags": [""]}) == "cuda"
    assert pch.variant_for(None, {"extra_cflags": ["", "-O3"]}) == "cpp-O3"


def test_a_cuda_judge_starts_the_cuda_header_before_any_candidate_asks(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(pch, "start_build", lambda root, variant: started.append((root, variant)) or True)
    assert pch.prebuild(tmp_path, "cuda") and started == [(tmp_path, "cuda")]
    assert not pch.prebuild(tmp_path, "cpu") and not pch.prebuild(None, "cuda") and len(started) == 1
    # what the batch benchmark waits for before its clock: ready, failed, or out of time
    assert not pch.wait_ready(None, "cuda", 5.0)
    (tmp_path / "cuda.failed").write_text("no compiler")
    t0 = time.monotonic()
    assert not pch.wait_ready(tmp_path, "cuda", 5.0) and time.monotonic() - t0 < 1.0
    (tmp_path / "cpp").mkdir()
    assert not pch.wait_ready(tmp_path, "cpp", 0.6)
    (tmp_path / "cpp" / pch.READY).write_text("{}")
    assert pch.wait_ready(tmp_path, "cpp", 0.0)


def test_the_runners_header_record_is_cut_to_known_variant_names():
    """What a runner says it wanted becomes background builds: only names from pch.VARIANTS, a bounded list."""
    assert pch_record({"used": ["cpp"], "wanted": ["../../etc", "cuda-O3", 7] * 50}) == {
        "used": ["cpp"], "wanted": ["cuda-O3"] * 6}
    assert pch_record("junk") == pch_record(None) == {"used": [], "wanted": []}
    assert pch.start_build(Path("/nonexistent"), "../../etc") is False


@needs_compiler
def test_a_precompiled_header_is_built_once_beside_the_cache_and_speeds_up_later_builds(monkeypatch, tmp_path):
    """The first C++ candidate asks for the header, the judge builds it in the background; a later candidate's
    build uses it (a cold CPU build here: 16.9 s without, 7.2 s with), and an extension kept before the header
    existed is still a cache hit after (its build arguments did not change)."""
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setenv("KB_GYM_PCH", "1")
    first, second = (CPP_EXTENSION.replace("guard_gelu_cpu", name) for name in ("pch_first", "pch_second"))
    with Evaluator("cpu", results_path=False) as ev:
        a = ev.evaluate(GELU, first, config=CHECK)
        assert a.status == "correct", a.error
        if not a.worker["landlock"]:
            pytest.skip("no Landlock here: an unconfined runner gets no precompiled header")
        assert a.worker["pch"] == {"used": [], "wanted": ["cpp"], "removed": []}
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("pch/*/cpp/ready")) and time.monotonic() < deadline:
            assert not list(tmp_path.glob("pch/*/cpp.failed")), list(tmp_path.glob("pch/*/*.log"))[0].read_text()
            time.sleep(1)
        header = next(tmp_path.glob("pch/*/cpp/torch/extension.h.gch"))
        assert not header.stat().st_mode & 0o222  # read-only, and the runner's Landlock rules allow no writes
        b = ev.evaluate(GELU, second, config=CHECK)
        again = ev.evaluate(GELU, first, config=CHECK)
    assert b.status == again.status == "correct", (b.error, again.error)
    assert b.worker["pch"]["used"] == ["cpp"] and not b.worker["build_cached"]
    assert again.worker["build_cached"] and again.stage_seconds["load"] < 3.0  # loaded, not rebuilt


# Finds the precompiled header through the runner's environment and tries to rewrite it, to plant a file
# beside it, and to make it writable first; raises (a verdict other than correct) if any of it worked.
POISON_PCH = '''
import glob, os
import torch
import torch.nn as nn
root = os.environ.get("KB_GYM_PCH_DIR", "")
headers = glob.glob(root + "/*/torch/extension.h.gch")
done = []
for h in headers:
    try:
        os.chmod(h, 0o644)
    except OSError:
        pass
    try:
        with open(h, "r+b") as f:
            f.write(b"#error poisoned")
        done.append("rewrote " + h)
    except OSError:
        pass
try:
    with open(os.path.join(root, "cpp", "torch", "planted.h"), "w") as f:
        f.write("x")
    done.append("planted")
except OSError:
    pass
if done or not headers:
    raise RuntimeError(f"{done} headers={headers}")

class ModelNew(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))
'''


@needs_compiler
def test_a_runner_cannot_rewrite_the_precompiled_header_and_a_changed_one_is_never_used(monkeypatch, tmp_path):
    """Landlock keeps runners from writing the header every later build includes; a header changed anyway
    (chmod is not a write, or an unconfined process on the host) is removed by the judge before the next build
    and built again, never used."""
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setenv("KB_GYM_PCH", "1")
    root = pch.root_for(tmp_path / "extensions", build_cache.toolchain(torch.device("cpu")), "cpu")
    assert pch.build(root, "cpp") is not None, list(root.glob("*.failed"))
    header = root / "cpp" / "torch" / "extension.h.gch"
    with Evaluator("cpu", results_path=False) as ev:
        attack = ev.evaluate(GELU, POISON_PCH, config=CHECK)
        if not attack.worker["landlock"]:
            pytest.skip("no Landlock here: an unconfined runner gets no precompiled header")
        assert attack.status == "correct", attack.error  # found the header, wrote nothing
        assert not (root / "cpp" / "torch" / "planted.h").exists()
        with open(header, "r+b") as f:  # as an unconfined process on the host would
            f.write(b"#error poisoned")
        after = ev.evaluate(GELU, CPP_EXTENSION.replace("guard_gelu_cpu", "pch_after_change"), config=CHECK)
    assert after.status == "correct", after.error
    assert after.worker["pch"]["removed"] == ["cpp"] and after.worker["pch"]["used"] == []
    assert not header.exists() or b"poisoned" not in header.read_bytes()[:64]


def _entry(root: Path, name: str, size: int, used: float) -> Path:
    """A complete entry of ``size`` bytes last used at ``used`` (as keep leaves one)."""
    folder = root / name
    (folder / "ext" / "e").mkdir(parents=True)
    (folder / "ext" / "e" / "e.so").write_bytes(b"\x7f" * size)
    (folder / build_cache.MARKER).write_text(str(size))
    os.utime(folder / build_cache.MARKER, (used, used))
    return folder


def test_the_cache_evicts_the_least_recently_used_entries_past_its_bound(monkeypatch, tmp_path):
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path))
    now = time.time()
    old, mid, new = (_entry(tmp_path, n, 400, now - age) for n, age in (("old", 300), ("mid", 200), ("new", 100)))
    assert build_cache.evict(tmp_path, 1200) == []  # within the bound: nothing goes
    os.utime(old / build_cache.MARKER)  # used again (a hit: the next test)
    gone = build_cache.evict(tmp_path, 1000)  # 1,200 > 1,000: down to 800 at most, oldest use first
    assert gone == [mid] and not mid.exists() and old.exists() and new.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".evicted")] == []


def test_a_hit_marks_its_entry_used_and_a_miss_mid_copy_leaves_nothing_half_copied(monkeypatch, tmp_path):
    root = tmp_path / "extensions"
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(root))
    tools = "tools"
    entry = _entry(root, build_cache.source_key("src", tools), 10, time.time() - 1000)
    before = (entry / build_cache.MARKER).stat().st_mtime
    assert build_cache.restore("src", tmp_path / "runner" / "ext", tools)
    assert (entry / build_cache.MARKER).stat().st_mtime > before
    shutil.rmtree(entry / "ext")  # evicted under the restore: a miss, and the runner's folder emptied
    (tmp_path / "runner" / "ext" / "e" / "stale.o").write_bytes(b"x")
    assert not build_cache.restore("src", tmp_path / "runner" / "ext", tools)
    assert not (tmp_path / "runner" / "ext").exists()


BUILDS = "from torch.utils.cpp_extension import load_inline\n"  # a source that may build: what keep keeps for


def test_keep_records_the_size_skips_sparse_files_and_refuses_a_folder_over_the_entry_bound(monkeypatch, tmp_path):
    root = tmp_path / "extensions"
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(root))
    ext = tmp_path / "runner_ext"
    (ext / "e").mkdir(parents=True)
    (ext / "e" / "e.so").write_bytes(os.urandom(200_000))
    with open(ext / "e" / "holes.so", "wb") as fh:
        fh.truncate(64 << 20)  # 64 MB that holds no block
    build_cache.keep(BUILDS, ext, "tools")
    entry = root / build_cache.source_key(BUILDS, "tools")
    # the disk the copy takes: the library's blocks, a block for it and one for its folder
    assert (entry / build_cache.MARKER).read_text() == str(4096 * (49 + 1 + 1))
    assert sorted(p.name for p in (entry / "ext" / "e").iterdir()) == ["e.so"]
    monkeypatch.setattr(build_cache, "ENTRY_MAX_BYTES", 100_000)
    build_cache.keep(BUILDS + "# 2", ext, "tools")
    assert not (root / build_cache.source_key(BUILDS + "# 2", "tools")).exists()
    assert [p.name for p in root.iterdir() if p.name.endswith(".tmp")] == []


def test_keep_evicts_past_the_bound_set_in_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("KB_GYM_EXTENSIONS_MAX_GB", str(300_000 / (1 << 30)))
    stale = _entry(tmp_path, "stale", 200_000, time.time() - 1000)
    ext = tmp_path.parent / f"{tmp_path.name}_ext"
    (ext / "e").mkdir(parents=True)
    (ext / "e" / "e.so").write_bytes(os.urandom(150_000))
    build_cache.keep(BUILDS, ext, "tools")
    assert not stale.exists() and (tmp_path / build_cache.source_key(BUILDS, "tools") / build_cache.MARKER).is_file()
