"""What a runner forked from the judge's zygote inherits (kb_gym/worker/zygote.py): work that reads only files is done
once there, not at each runner's start."""

from __future__ import annotations

import re

import pytest

from kb_gym import EvalConfig, Evaluator, get_problem, load_problems

pytest.importorskip("triton")

# The candidate reports, from its runner, whether Triton's cache key (a hash of Triton's sources and libtriton, computed
# at a process's first kernel) was already computed when it was imported
REPORT = ("import torch\nfrom triton.runtime.cache import triton_key\n"
          "raise RuntimeError(f'TRITON_KEY_COMPUTED={triton_key.cache_info().currsize}')\n"
          "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n")


def _computed(monkeypatch, zygote: str) -> int:
    monkeypatch.setenv("KB_GYM_ZYGOTE", zygote)
    relu = get_problem(load_problems("builtin"), name="level1/1_ReLU")
    with Evaluator("cpu", config=EvalConfig(trials=1, integrity="off"), results_path=False) as ev:
        result = ev.evaluate(relu, REPORT)
    found = re.search(r"TRITON_KEY_COMPUTED=(\d+)", result.error or "")
    assert found, (result.status, result.error)
    return int(found.group(1))


def test_a_forked_runner_starts_with_tritons_cache_key_computed(monkeypatch):
    assert _computed(monkeypatch, "1") == 1
    assert _computed(monkeypatch, "0") == 0  # a fresh interpreter: computed at its first kernel, as before
