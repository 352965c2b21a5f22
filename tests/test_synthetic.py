"""Synthetic problems: deterministic, well-formed, and not degenerate (the official audit's lessons)."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from kb_gym import ProblemError, load_problems
from kb_gym.audit import run_audit
from kb_gym.problems import check_problem_code
from kb_gym.problems.synthetic import generate_problems, parse_spec, recorded_estimate
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


# The default set (100, seed 0) as generate_problems drew it before sizes: these positions repeated an
# earlier problem's code and now draw new shapes; every other problem's code hashes to this.
REPEATS_BEFORE_SIZES = (23, 38, 57, 68, 88)
DEFAULT_SET_DIGEST = "ef92af8e0de9d1f4527b362cec71dbd121f6baa08827f5baa0f24cf204306417"
HEADS = {"Linear": "linear", "Conv2d": "conv2d", "BatchedMatmul": "bmm"}
REDUCTIONS = {"Sum", "Max", "LogSumExp"}


def test_cpu_size_draws_the_problems_it_always_drew():
    problems = generate_problems(100, 0)
    assert [p.code for p in problems] == [p.code for p in generate_problems(100, 0, size="cpu")]
    kept = "".join(p.code for i, p in enumerate(problems) if i not in REPEATS_BEFORE_SIZES)
    assert hashlib.sha256(kept.encode()).hexdigest() == DEFAULT_SET_DIGEST
    assert len({p.code for p in problems}) == 100 and {p.size for p in problems} == {"cpu"}
    assert "estimated eager time" not in problems[0].code


def test_gpu_size_same_seed_same_problems_and_the_same_operators_as_the_cpu_size():
    a, b = generate_problems(40, seed=3, size="gpu"), generate_problems(40, seed=3, size="gpu")
    assert [p.code for p in a] == [p.code for p in b]
    assert [p.code for p in a] != [p.code for p in generate_problems(40, seed=4, size="gpu")]
    assert [p.code for p in a[:10]] == [p.code for p in generate_problems(10, seed=3, size="gpu")]
    cpu = generate_problems(40, seed=3)
    assert [p.key for p in a] == [p.key for p in cpu] and {p.size for p in a} == {"gpu"}
    assert all(g.code != c.code for g, c in zip(a, cpu, strict=True))


@pytest.mark.parametrize("size", ["cpu", "gpu"])
def test_ten_thousand_distinct_problems(size):
    problems = generate_problems(10_000, seed=5, size=size)
    assert len({p.code for p in problems}) == len({p.key for p in problems}) == 10_000


def test_gpu_size_estimates_within_one_to_fifteen_ms_and_eight_gb():
    problems = generate_problems(200, seed=0, size="gpu")
    for problem in problems:
        estimate = recorded_estimate(problem.code)
        assert estimate is not None, problem.key
        ms, gb = estimate
        assert 1.0 <= ms <= 15.0 and gb < 8.0, (problem.key, ms, gb)
    assert {p.level for p in problems} == {1, 2}
    assert {p.name.split("_")[2] for p in problems} >= set(HEADS)


def _expected_shape(problem, ns) -> tuple[int, ...]:
    ops = problem.name.split("_")[2:]
    reduced = ops[-1] in REDUCTIONS
    head = HEADS.get(ops[0], "input")
    if head == "linear":
        return ns["batch_size"], 1 if reduced else ns["out_features"]
    if head == "conv2d":
        return ns["batch_size"], 1 if reduced else ns["out_channels"], ns["height"], ns["width"]
    if head == "bmm":
        return ns["batch_size"], ns["m"], 1 if reduced else ns["n"]
    return ns["batch_size"], 1 if reduced else ns["dim"]


def test_gpu_size_problems_build_and_run_on_the_meta_device():
    sample = generate_problems(60, seed=2, size="gpu")[::3]  # 20 of them
    assert {HEADS.get(p.name.split("_")[2], "input") for p in sample} == {*HEADS.values(), "input"}
    for problem in sample:
        check_problem_code(problem.code, problem.key)
        ns: dict = {}
        exec(compile(problem.code, problem.key, "exec"), ns)  # noqa: S102 - our own generated code
        with torch.device("meta"):
            model = ns["Model"](*ns["get_init_inputs"]())
            inputs = ns["get_inputs"]()
            out = model(*inputs)
        assert out.is_meta and tuple(out.shape) == _expected_shape(problem, ns), problem.key
        resident = sum(t.numel() * t.element_size() for t in [*inputs, *model.parameters(), out])
        assert resident <= recorded_estimate(problem.code)[1] * 1e9 + 5e6, problem.key  # the note counts these


def test_invalid_size_raises():
    for bad in ("GPU", "tpu", "", None):
        with pytest.raises(ValueError, match="size"):
            generate_problems(3, size=bad)
    assert math.isclose(recorded_estimate("# estimated eager time on an H200: 3.25 ms; memory 1.50 GB")[0], 3.25)
