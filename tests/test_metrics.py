"""fast_p and friends, loading JSONL results, and the text/PNG report (CPU only, fast)."""

from __future__ import annotations

import json
import math

import pytest

from kb_gym.metrics import (
    best_of_k,
    correctness_rate,
    fast_key,
    fast_p,
    fast_p_at_k,
    geometric_mean_speedup,
    load_results,
    summarize,
    task_key,
)
from kb_gym.report import format_table, plot_fast_p, report
from kb_gym.result import EvalResult


def res(name: str, status: str = "correct", speedup: float | None = None, level: int = 1, **kw) -> EvalResult:
    return EvalResult(
        status=status, problem_name=name, level=level, correct=status == "correct", speedup=speedup, **kw
    )


@pytest.fixture
def mixed() -> list[EvalResult]:
    """Four level-1 tasks (2 correct) and two level-2 tasks (1 correct)."""
    return [
        res("1_ReLU", "correct", 1.3),
        res("2_GELU", "correct", 0.8),
        res("3_Conv", "compile_error"),
        res("4_Matmul", "incorrect"),
        res("1_MLP", "correct", 2.5, level=2),
        res("2_Attn", "timeout", level=2),
    ]


def test_task_key():
    assert task_key(res("1_ReLU")) == "level1/1_ReLU"
    assert task_key({"level": 2, "problem_name": "x"}) == "level2/x"


def test_fast_p_counts_failures_in_denominator(mixed):
    assert fast_p(mixed, 1.0) == pytest.approx(2 / 6)  # 1.3 and 2.5
    assert fast_p(mixed, 0.0) == pytest.approx(3 / 6)  # = correctness here
    assert fast_p(mixed, 2.0) == pytest.approx(1 / 6)
    assert fast_p(mixed, 3.0) == 0.0
    assert fast_p([], 1.0) == 0.0
    # dicts work the same as EvalResult objects
    assert fast_p([r.to_dict() for r in mixed], 1.0) == pytest.approx(2 / 6)


def test_fast_p_is_strict():
    results = [res("a", "correct", 1.0), res("b", "correct", 1.5), res("c", "correct", 1.5000001)]
    assert fast_p(results, 1.0) == pytest.approx(2 / 3)
    assert fast_p(results, 1.5) == pytest.approx(1 / 3)
    assert fast_p([res("a", "correct", 1.0)], 1.0) == 0.0


def test_fast_p_ignores_unusable_speedups():
    results = [
        res("a", "correct", None),
        res("b", "correct", math.nan),
        res("c", "correct", math.inf),
        res("d", "correct", 0.0),
        res("e", "incorrect", 5.0),  # a failure's speedup never counts
    ]
    assert fast_p(results, 0.0) == 0.0
    assert correctness_rate(results) == pytest.approx(4 / 5)


def test_fast_p_tasks_argument_counts_missing_as_failures(mixed):
    keys = [task_key(r) for r in mixed] + ["level1/99_Missing", "level3/1_Missing"]
    assert fast_p(mixed, 1.0, tasks=keys) == pytest.approx(2 / 8)
    assert correctness_rate(mixed, tasks=keys) == pytest.approx(3 / 8)
    # results of tasks outside the set are ignored
    assert fast_p(mixed, 1.0, tasks={"level1/1_ReLU", "level1/3_Conv"}) == pytest.approx(1 / 2)
    assert fast_p(mixed, 1.0, tasks=["level9/nothing"]) == 0.0


def test_penalised_flags_option():
    results = [res("a", "correct", 2.0, flags=["fallback"]), res("b", "correct", 2.0)]
    assert fast_p(results, 1.0) == 1.0  # KernelBench: flags are not looked at
    assert fast_p(results, 1.0, penalised_flags={"fallback"}) == pytest.approx(0.5)


def test_best_of_k_and_fast_p_over_samples():
    samples = [
        res("a", "compile_error"),
        res("a", "correct", 1.2),
        res("a", "correct", 0.9),
        res("b", "incorrect"),
        res("b", "runtime_error"),
        res("c", "correct", 0.5),
        res("c", "incorrect"),
        res("c", "correct", 3.0),
        res("c", "format_error"),
    ]
    best = best_of_k(samples)
    assert [(r.problem_name, r.status, r.speedup) for r in best] == [
        ("a", "correct", 1.2),
        ("b", "incorrect", None),  # got further than runtime_error
        ("c", "correct", 3.0),
    ]
    assert fast_p(best, 1.0) == pytest.approx(2 / 3)
    assert fast_p_at_k(samples, 1.0) == pytest.approx(2 / 3)  # k=None: all samples
    # plain fast_p averages samples within a task: a 1/3, b 0, c 1/4
    assert fast_p(samples, 1.0) == pytest.approx((1 / 3 + 0 + 1 / 4) / 3)
    assert fast_p_at_k(samples, 1.0, k=1) == pytest.approx(fast_p(samples, 1.0))
    # unbiased pass@k: task a has n=3, c=1 -> 1 - C(2,2)/C(3,2) = 2/3; c: n=4, c=1 -> 1 - C(3,2)/C(4,2) = 1/2
    assert fast_p_at_k(samples, 1.0, k=2) == pytest.approx((2 / 3 + 0 + 1 / 2) / 3)
    assert fast_p_at_k(samples, 1.0, k=10) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        fast_p_at_k(samples, 1.0, k=0)


def test_geometric_mean_speedup(mixed):
    assert geometric_mean_speedup(mixed) == pytest.approx((1.3 * 0.8 * 2.5) ** (1 / 3))
    assert geometric_mean_speedup([res("a", "correct", 2.0), res("b", "correct", 0.5)]) == pytest.approx(1.0)
    # best sample per task: task a contributes 4.0, not 1.0
    assert geometric_mean_speedup([res("a", "correct", 1.0), res("a", "correct", 4.0)]) == pytest.approx(4.0)
    assert geometric_mean_speedup([res("a", "incorrect")]) is None
    assert geometric_mean_speedup([]) is None


def test_correctness_rate(mixed):
    assert correctness_rate(mixed) == pytest.approx(3 / 6)
    assert correctness_rate([]) == 0.0


def test_summarize_by_level(mixed):
    summary = summarize(mixed)
    assert list(summary) == ["level1", "level2", "all"]
    l1, l2, total = summary["level1"], summary["level2"], summary["all"]
    assert (l1["n_tasks"], l2["n_tasks"], total["n_tasks"]) == (4, 2, 6)
    assert total["n_samples"] == 6
    assert l1["correct"] == pytest.approx(0.5)
    assert l1[fast_key(1.0)] == pytest.approx(1 / 4)
    assert l2["fast_1"] == pytest.approx(1 / 2)
    assert total["fast_0.8"] == pytest.approx(2 / 6)  # 0.8 itself is not > 0.8
    assert set(total) >= {"fast_0", "fast_0.5", "fast_0.8", "fast_1", "fast_1.5", "fast_2"}
    assert l2["geomean_speedup"] == pytest.approx(2.5)
    assert total["best_of"]["fast_1"] == pytest.approx(total["fast_1"])
    json.dumps(summary)  # serialisable as is


def test_summarize_levels_sort_numerically_and_tasks_fill_levels():
    results = [res("a", "correct", 2.0, level=10), res("b", "correct", 2.0, level=2)]
    summary = summarize(results, ps=(1.0,), tasks=["level10/a", "level2/b", "level3/c"])
    assert list(summary) == ["level2", "level3", "level10", "all"]
    assert summary["level3"]["n_tasks"] == 1 and summary["level3"]["fast_1"] == 0.0
    assert summary["all"]["fast_1"] == pytest.approx(2 / 3)


def test_load_results_skips_corrupt_lines(tmp_path, mixed):
    path = tmp_path / "results.jsonl"
    lines = [r.to_json() for r in mixed]
    lines.insert(2, '{"status": "correct", "problem_na')  # truncated write
    lines.insert(4, "")
    lines.insert(5, "[1, 2, 3]")  # JSON, but not an object
    path.write_text("\n".join(lines) + "\n   \n", encoding="utf-8")
    with open(path, "ab") as handle:
        handle.write(b"\xff\xfe not utf-8\n")
    loaded = load_results(path)
    assert len(loaded) == len(mixed)
    assert all(isinstance(r, dict) for r in loaded)
    assert loaded.n_corrupt == 3 and loaded.corrupt_lines == [3, 6, 11]
    assert loaded.n_blank == 2
    assert fast_p(loaded, 1.0) == pytest.approx(fast_p(mixed, 1.0))


def test_format_table_and_report(tmp_path, mixed):
    table = format_table(summarize(mixed))
    header = table.splitlines()[0].split()
    assert header == [
        "level",
        "n",
        "correct",
        "fast_0",
        "fast_0.5",
        "fast_0.8",
        "fast_1",
        "fast_1.5",
        "fast_2",
        "geomean(best)",
    ]
    assert [line.split()[0] for line in table.splitlines()[2:-1]] == ["level1", "level2", "all"]
    assert table.splitlines()[-1].startswith("geomean(best): geometric-mean speedup over the tasks whose best")

    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(r.to_json() for r in mixed) + "\nnot json\n", encoding="utf-8")
    png = tmp_path / "plots" / "fast_p.png"
    text = report(path, png)
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for col in ("fast_0", "fast_0.5", "fast_0.8", "fast_1", "fast_1.5", "fast_2", "geomean"):
        assert col in text
    assert "skipped 1 corrupt line" in text
    assert "level1" in text and "all" in text
    assert report(path).count("\n") < text.count("\n")  # no plot note without a png


def test_plot_fast_p_from_summary(tmp_path, mixed):
    out = plot_fast_p(summarize(mixed), tmp_path / "summary.png")
    assert out.exists() and out.stat().st_size > 1000
    assert plot_fast_p([], tmp_path / "empty.png").exists()


def test_speed_of_light_share_is_summarised_and_shown_when_results_carry_it(mixed):
    """The report says how close to the hardware the best correct samples got, not only how much faster."""
    assert summarize(mixed)["all"]["median_sol_fraction"] is None
    assert "sol" not in format_table(summarize(mixed)).splitlines()[0].split()
    results = [res("a", "correct", 2.0, speed_of_light_fraction=0.4), res("a", "correct", 1.0, speed_of_light_fraction=0.2),
               res("b", "correct", 3.0, speed_of_light_fraction=0.8), res("c", "incorrect", speed_of_light_fraction=0.9)]
    summary = summarize(results)
    # best samples: a at 2.0x (0.4), b (0.8); c is not correct
    assert summary["all"]["median_sol_fraction"] == pytest.approx(0.6)
    table = format_table(summary)
    assert table.splitlines()[0].split()[-1] == "sol"
    assert table.splitlines()[-2].split()[-1] == "60%"


def test_several_samples_show_best_of_fast_p_at_k_and_small_speedups_keep_their_digits():
    results = [res("a", "correct", 2.0), res("a", "incorrect"), res("b", "correct", 0.002), res("b", "correct", 0.5)]
    summary = summarize(results, ks=(1, 2))
    assert summary["all"]["fast_1@1"] == pytest.approx(0.25)  # a: 1 of 2 fast; b: none
    assert summary["all"]["fast_1@2"] == pytest.approx(0.5)  # a: one of its 2 samples is fast for sure
    table = format_table(summary)
    header = table.splitlines()[0].split()
    assert {"samples", "fast_1@1", "fast_1@2", "best:correct", "best:fast_1", "geomean(best)"} <= set(header)
    last = dict(zip(header, table.splitlines()[-2].split(), strict=True))
    assert last["best:correct"] == "1.000" and last["best:fast_1"] == "0.500"
    assert format_table(summarize([res("b", "correct", 0.002)])).splitlines()[-2].split()[-1] == "0.002x"
    with pytest.raises(ValueError, match="positive integer"):
        summarize(results, ks=(0,))


def test_report_compares_two_runs_in_one_table_and_one_plot(tmp_path):
    """`kb-gym report base/results.jsonl trained/results.jsonl --png cmp.png`: each run's rows, named by folder."""
    for run, speedup in (("base", 0.5), ("trained", 1.5)):
        (tmp_path / run).mkdir()
        rows = [res("a", "correct", speedup), res("b", "incorrect")]
        (tmp_path / run / "results.jsonl").write_text("\n".join(r.to_json() for r in rows) + "\n")
    png = tmp_path / "cmp.png"
    text = report([tmp_path / "base" / "results.jsonl", tmp_path / "trained" / "results.jsonl"], png)
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["run", "level"]
    by_run = {(line.split()[0], line.split()[1]): line.split() for line in lines[2:] if line.split()[1] == "all"}
    header = lines[0].split()
    assert dict(zip(header, by_run[("base", "all")], strict=True))["fast_1"] == "0.000"
    assert dict(zip(header, by_run[("trained", "all")], strict=True))["fast_1"] == "0.500"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and text.count("plot written") == 1
