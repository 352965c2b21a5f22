"""The extension build cache (worker/build_cache.py): one per machine, keyed by source and toolchain, never by
the extension's name; a source two judges get at once is built once."""

from __future__ import annotations

import shutil
import threading

import pytest
from adversarial.test_judge_isolation import CHECK, CPP_EXTENSION, GELU

from kb_gym import Evaluator
from kb_gym.worker import build_cache

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
    with Evaluator("cpu", results_path=False) as a, Evaluator("cpu", results_path=False) as b:
        a.warm()
        b.warm()
        results = {}
        threads = [threading.Thread(target=lambda name, ev: results.__setitem__(name, ev.evaluate(GELU, source,
                                                                                                  config=CHECK)),
                                    args=(name, ev)) for name, ev in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [r.status for r in results.values()] == ["correct", "correct"], [r.error for r in results.values()]
    assert sorted(r.worker["build_cached"] for r in results.values()) == [False, True]
    assert len([p for p in (tmp_path / "extensions").iterdir() if not p.name.startswith(".")]) == 1


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
