"""The GPU digest (device_digest.py): the Triton kernel is BLAKE2s in tree mode, exactly as hashlib computes it.

On the CPU the kernel runs under Triton's interpreter (in a subprocess: the interpreter is chosen when the
kernel module is imported); on a GPU the judge's own self-check is run at full size.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kb_gym.worker import device_digest
from kb_gym.worker.device_digest import reference_digest


def test_a_single_leaf_is_one_blake2s_call_with_the_tree_parameters():
    data = bytes(range(200))
    want = hashlib.blake2s(data, digest_size=32, salt=(5).to_bytes(8, "little"),
                           person=(1).to_bytes(4, "little") + (-1).to_bytes(4, "little", signed=True),
                           fanout=32, depth=255, leaf_size=1024, node_offset=0, node_depth=0, inner_size=32,
                           last_node=True).digest()
    assert reference_digest(data, 5, 1) == int.from_bytes(want[:8], "little") & device_digest.MASK


def test_the_reference_digest_binds_every_byte_the_length_the_nonce_the_output_and_the_chunk():
    data = bytearray(os.urandom(70_000))  # 69 leaves: two levels
    base = reference_digest(data, 7, 0, 3)
    nudged = bytearray(data)
    nudged[50_001] ^= 1
    variants = {base, reference_digest(nudged, 7, 0, 3), reference_digest(data + b"\0", 7, 0, 3),
                reference_digest(data[:-1], 7, 0, 3), reference_digest(data, 8, 0, 3),
                reference_digest(data, 7, 1, 3), reference_digest(data, 7, 0, 4)}
    assert len(variants) == 7


_INTERPRETED = """
import torch
from kb_gym.worker.device_digest import self_check
print(self_check(torch.device("cpu"), sizes={sizes!r}))
"""


def test_the_kernel_gives_hashlibs_digests_under_the_interpreter():
    """Partial words and blocks, one and several leaves, two levels, segments and a chunk by itself."""
    sizes = ((0, 0), (3, 0), (64, 0), (1025, 0), (40_000, 0), (9000, 4096))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-P", "-c", _INTERPRETED.format(sizes=sizes)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "None", out.stdout + out.stderr[-2000:]


def test_no_gpu_means_the_host_digest():
    assert not device_digest.trusted(torch.device("cpu"))


@pytest.mark.gpu
def test_the_kernel_gives_hashlibs_digests_on_the_gpu_and_is_fast():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    dev = torch.device("cuda:0")
    assert device_digest.self_check(dev) is None
    big = torch.randn(128 << 20, device=dev)  # 512 MB
    device_digest.tree_digests(big, 1, 0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    device_digest.tree_digests(big, 2, 0)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end)
    chunked = device_digest.tree_digests(big, 2, 0, 1 << 20)
    print(f"device digest of 512 MB: {ms:.2f} ms; {len(chunked)} chunk digests")
    assert len(chunked) == 512


def test_a_seeded_runner_cache_names_only_its_own_copies(tmp_path, monkeypatch):
    """Triton's group files list their files by absolute path; a runner Landlocked to its scratch folder
    cannot open the judge's, so the copies must name the copies (on the H200 every kernel load failed so)."""
    import json

    judge = tmp_path / "judge" / "ABC"
    judge.mkdir(parents=True)
    (judge / "level.json").write_text("{}")
    (judge / "level.cubin").write_bytes(b"\0")
    (judge / "__grp__level.json").write_text(json.dumps({"child_paths": {
        "level.json": str(judge / "level.json"), "level.cubin": str(judge / "level.cubin")}}))
    odd = tmp_path / "judge" / "ODD"
    odd.mkdir()
    (odd / "__grp__x.json").write_text("not json")
    monkeypatch.setattr(device_digest, "_seed", [judge, odd])
    runner = tmp_path / "runner" / "triton"
    device_digest.seed(runner)
    paths = json.loads((runner / "ABC" / "__grp__level.json").read_text())["child_paths"]
    assert paths == {"level.json": str(runner / "ABC" / "level.json"), "level.cubin": str(runner / "ABC" / "level.cubin")}
    assert all(Path(p).exists() for p in paths.values())
    assert not (runner / "ODD" / "__grp__x.json").exists()  # an unknown layout: compiled again, not misread
