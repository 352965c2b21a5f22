"""Triton's compiled kernels kept between runners, keyed by the candidate's whole source (kb_gym/worker/triton_cache.py).

On the CPU Triton interprets and compiles nothing, so a candidate here writes its own "kernel" into its runner's Triton
cache folder, as Triton would on a GPU: the keeping and restoring are what is tested, not that a kernel loads.
"""

from __future__ import annotations

import json

import pytest

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.worker import triton_cache
from kb_gym.worker.build_cache import MARKER

TOOLS = "torch|cuda|sm_90"
SOURCE = "import triton\n"  # a source whose code names Triton: only such a source's kernels are kept


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "extensions"
    root.mkdir()
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(root))
    return root


def _runner_cache(folder, kernels):
    """A runner's Triton cache: the judge's seeded digest kernel, and ``kernels`` as Triton writes them (a group
    file naming its children by the absolute path the runner saw)."""
    (folder / "digest").mkdir(parents=True)
    (folder / "digest" / "digest.cubin").write_bytes(b"trusted")
    for name in kernels:
        kernel = folder / name
        kernel.mkdir()
        (kernel / "k.cubin").write_bytes(b"compiled " + name.encode())
        (kernel / "k.json").write_text("{}")
        (kernel / "__grp__k.json").write_text(json.dumps({"child_paths": {
            "k.cubin": f"/runners/mount/triton/{name}/k.cubin", "k.json": f"/runners/mount/triton/{name}/k.json"}}))
    return folder


def test_a_kept_kernel_reaches_the_same_source_only_and_never_the_seeded_folders(cache_root, tmp_path):
    first = _runner_cache(tmp_path / "r1" / "triton", ["aaa", "bbb"])
    (first / "aaa" / "link").symlink_to(tmp_path)  # a link the runner planted: never copied
    triton_cache.keep(SOURCE, first, TOOLS, seeded={"digest"})
    entry = cache_root / triton_cache.entry_key(SOURCE, TOOLS)
    assert (entry / MARKER).is_file()
    assert sorted(p.name for p in (entry / triton_cache.FOLDER).iterdir()) == ["aaa", "bbb"]  # no digest
    assert not (entry / triton_cache.FOLDER / "aaa" / "link").exists()

    second = tmp_path / "r2" / "triton"
    (second / "digest").mkdir(parents=True)
    (second / "digest" / "digest.cubin").write_bytes(b"trusted")
    assert triton_cache.restore(SOURCE, second, TOOLS) == 2
    assert (second / "aaa" / "k.cubin").read_bytes() == b"compiled aaa"
    assert (second / "digest" / "digest.cubin").read_bytes() == b"trusted"
    group = json.loads((second / "bbb" / "__grp__k.json").read_text())
    assert group["child_paths"] == {"k.cubin": str(second / "bbb" / "k.cubin"), "k.json": str(second / "bbb" / "k.json")}

    assert triton_cache.restore("OTHER SOURCE", tmp_path / "r3", TOOLS) == 0  # keyed by the whole source
    assert triton_cache.restore(SOURCE, tmp_path / "r4", TOOLS + "|sm_80") == 0  # and the toolchain


def test_a_half_written_entry_is_never_restored_and_a_kept_one_never_replaced(cache_root, tmp_path):
    triton_cache.keep(SOURCE, _runner_cache(tmp_path / "r1" / "triton", ["aaa"]), TOOLS, seeded={"digest"})
    entry = cache_root / triton_cache.entry_key(SOURCE, TOOLS)
    triton_cache.keep(SOURCE, _runner_cache(tmp_path / "r2" / "triton", ["zzz"]), TOOLS, seeded={"digest"})
    assert [p.name for p in (entry / triton_cache.FOLDER).iterdir()] == ["aaa"]  # the first stands
    (entry / MARKER).unlink()  # a judge killed mid-copy
    assert triton_cache.restore(SOURCE, tmp_path / "r3", TOOLS) == 0
    triton_cache.keep("NOTHING NEW", _runner_cache(tmp_path / "r4" / "triton", []), TOOLS, seeded={"digest"})
    assert not (cache_root / triton_cache.entry_key("NOTHING NEW", TOOLS)).exists()


def test_an_unreadable_group_file_is_dropped_not_pointed_anywhere(cache_root, tmp_path):
    runner = _runner_cache(tmp_path / "r1" / "triton", ["aaa"])
    (runner / "aaa" / "__grp__k.json").write_text("not json")
    triton_cache.keep(SOURCE, runner, TOOLS, seeded={"digest"})
    assert triton_cache.restore(SOURCE, tmp_path / "r2", TOOLS) == 1
    assert not (tmp_path / "r2" / "aaa" / "__grp__k.json").exists()  # Triton compiles that kernel again
    assert (tmp_path / "r2" / "aaa" / "k.cubin").is_file()


PROBLEM = Problem(id=1, name="1_Scale", level=1, code='''import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2
def get_inputs():
    return [torch.randn(64, 64)]
def get_init_inputs():
    return []
''')

# Writes a "kernel" into its Triton cache as Triton's JIT would on a GPU, and says in its answer whether it found one
# there when it loaded (x * 2 where it did, x * 3 where not: wrong on a first evaluation, right on a second).
WRITER = '''import os
import torch
import triton  # named: only a source that names Triton has its kernels kept
_CACHE = os.environ["TRITON_CACHE_DIR"]
_FOUND = os.path.isfile(os.path.join(_CACHE, "feedbeef", "k.cubin"))
os.makedirs(os.path.join(_CACHE, "feedbeef"), exist_ok=True)
with open(os.path.join(_CACHE, "feedbeef", "k.cubin"), "wb") as f:
    f.write(b"compiled")
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x * (2 if _FOUND else 3)
'''


def test_a_second_evaluation_of_a_source_finds_its_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv(triton_cache.ENV, "1")  # the judges read it: set before they start
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    config = EvalConfig(trials=1, timing=False)
    with Evaluator("cpu", results_path=False, baseline_cache=False) as ev:
        first = ev.evaluate(PROBLEM, WRITER, config=config)
        second = ev.evaluate(PROBLEM, WRITER, config=config)
        other = ev.evaluate(PROBLEM, WRITER + "\n# another source\n", config=config)
    assert first.status == "incorrect" and first.worker["triton_cached"] == 0, (first.status, first.error)
    assert second.status == "correct" and second.worker["triton_cached"] == 1, (second.status, second.error)
    assert other.status == "incorrect" and other.worker["triton_cached"] == 0, (other.status, other.worker)


def test_off_nothing_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(triton_cache.ENV, "0")  # unset: on where the machine has a GPU
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    config = EvalConfig(trials=1, timing=False)
    with Evaluator("cpu", results_path=False, baseline_cache=False) as ev:
        results = [ev.evaluate(PROBLEM, WRITER, config=config) for _ in range(2)]
    assert [r.status for r in results] == ["incorrect", "incorrect"]
    assert not list((tmp_path / "extensions").glob(f"*/{triton_cache.FOLDER}"))
