"""``kb-gym bench --batch`` at a CPU size: the mixed batch, its verdicts, and the KernelBench way beside it."""

from __future__ import annotations

import os

from kb_gym import load_problems
from kb_gym.batch_bench import build_batch, format_batch, kernelbench_way, run_batch


def test_the_batch_is_four_candidates_a_problem_with_our_triton_solutions():
    batch = build_batch("cpu", problems=16, device="cpu")
    keys = [p.key for p, _, _ in batch]
    assert len(batch) == 64 and len(set(keys)) == 16
    assert {kind for _, kind, _ in batch} == {"reference", "triton", "wrong", "raises"}
    assert all(p.size == "cpu" for p, _, _ in batch)
    # on a GPU our CUDA solutions join, labelled as such (they need nvcc and a GPU to build)
    on_gpu = build_batch("cpu", problems=16, device="cuda")
    cuda = [source for _, kind, source in on_gpu if kind == "cuda"]
    assert cuda and all("load_inline" in source for source in cuda)


def test_a_small_batch_gets_the_verdicts_it_should_and_the_kernelbench_way_runs_beside_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    report = run_batch(device="cpu", size="cpu", problems=2, out=str(tmp_path / "batch.json"))
    assert report["candidates"] == 8 and report["problems"] == 2
    assert set(report["statuses"]["reference"]) == {"correct"} and set(report["statuses"]["triton"]) == {"correct"}
    assert set(report["statuses"]["wrong"]) == {"incorrect"}
    assert set(report["statuses"]["raises"]) == {"runtime_error"}
    kb = report["kernelbench_way"]
    assert kb["statuses"].count("correct") == 4 and "incorrect" in kb["statuses"]
    assert report["speedup_over_kernelbench_way"] > 0 and report["gpu_busy"] is None
    assert "KernelBench way" in format_batch(report) and os.path.getsize(tmp_path / "batch.json") > 100


def test_the_kernelbench_way_reports_a_broken_candidate():
    relu = next(p for p in load_problems("builtin", size="cpu") if p.name == "1_ReLU")
    assert kernelbench_way(relu, "syntax error(", "cpu", trials=1, reps=1)["status"] == "compile_error"
