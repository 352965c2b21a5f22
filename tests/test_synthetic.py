"""Synthetic problems: deterministic, well-formed, and not degenerate (the official audit's lessons)."""

from __future__ import annotations

import pytest
import torch

from kb_gym import ProblemError, load_problems
from kb_gym.audit import run_audit
from kb_gym.problems import check_problem_code
from kb_gym.problems.synthetic import generate_problems, parse_spec
from kb_gym.worker.checks import compare_outputs


def _run(problem, seed):
    ns: dict = {}
    exec(compile(problem.code, problem.key, "exec"), ns)  # noqa: S102 - our own generated code
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]()).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        return model(*ns["get_inputs"]())


def test_same_seed_same_problems_other_seed_other_problems():
    a, b, c = generate_problems(20, seed=3), generate_problems(20, seed=3), generate_problems(20, seed=4)
    assert [p.code for p in a] == [p.code for p in b]
    assert [p.code for p in a] != [p.code for p in c]
    assert len({p.key for p in a}) == 20 and all("_Syn_" in p.name for p in a)


def test_specs_levels_and_errors():
    assert parse_spec("synthetic") == (100, 0) and parse_spec("synthetic:7:2") == (7, 2)
    assert len(load_problems("synthetic")) == 100
    assert [p.level for p in load_problems("synthetic:12", level=1)] == [1] * 12
    for bad in ("synthetic:x", "synthetic:1:2:3", "synthetic:0"):
        with pytest.raises(ProblemError):
            load_problems(bad)


def test_every_default_problem_runs_and_no_trivial_output_passes_its_tolerance():
    """Zeros, the input and another input's answer all fail the default fp32 comparison: no synthetic
    problem is degenerate in the audit's sense."""
    problems = load_problems("synthetic")
    assert {p.level for p in problems} == {1, 2}
    for problem in problems:
        check_problem_code(problem.code, problem.key)
        one, two = _run(problem, 1), _run(problem, 2)
        assert one.shape == two.shape and torch.isfinite(one).all(), problem.key
        trivial = {"zeros": torch.zeros_like(one), "another input's answer": two}
        for name, output in trivial.items():
            assert not compare_outputs(output, one, 1e-4, 1e-4).ok, (problem.key, name)


def test_trivial_candidates_fail_synthetic_problems_and_the_reference_passes():
    sample = generate_problems(8, seed=11)
    rows = run_audit(sample, device="cpu", trials=2, progress=False)
    assert [r["problem"] for r in rows if r["passed_by"] or r["unverifiable"]] == []
    assert all(r["reference"] == "correct" for r in rows), [r["errors"] for r in rows]


def test_synthetic_environment():
    import gymnasium as gym

    import kb_gym  # noqa: F401 - registers the environments

    env = gym.make("KernelBench-L2-v0", dataset="synthetic:10", device="cpu")
    try:
        obs, info = env.reset(seed=0)
        assert "class Model" in obs["reference"] and "_Syn_" in info["problem_name"]
        assert all(p.level == 2 for p in env.unwrapped.problems)
    finally:
        env.close()
