"""The kb-gym command line: eval, baseline, report, audit and their bad-input errors."""

from __future__ import annotations

import json
import shutil

import pytest

from kb_gym.cli import main
from kb_gym.problems import BUILTIN_DIR


@pytest.fixture()
def one_problem(tmp_path):
    folder = tmp_path / "problems" / "level1"
    folder.mkdir(parents=True)
    shutil.copy(BUILTIN_DIR / "level1" / "1_ReLU.py", folder / "1_ReLU.py")
    return tmp_path / "problems"


def test_eval_prints_verdict_and_appends_result(tmp_path, capsys):
    candidate = BUILTIN_DIR / "solutions" / "level1" / "1_ReLU.py"
    results = tmp_path / "r.jsonl"
    code = main(["eval", str(candidate), "--problem", "1/1", "--dataset", "builtin", "--device", "cpu",
                 "--results", str(results), "--json"])
    out = capsys.readouterr().out
    assert code == 0
    assert "status:   correct" in out and "speedup:" in out and "feedback:" in out
    assert json.loads(out.strip().splitlines()[-1])["status"] == "correct"
    assert len(results.read_text().splitlines()) == 1


def test_eval_of_a_wrong_file_exits_nonzero(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("no code here")
    assert main(["eval", str(bad), "--problem", "level1/1_ReLU", "--dataset", "builtin", "--device", "cpu"]) == 1
    assert "format_error" in capsys.readouterr().out


def test_bad_problem_and_missing_file_are_one_line_errors(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "missing.py"), "--problem", "1/1", "--dataset", "builtin"]) == 2
    assert main(["eval", str(BUILTIN_DIR / "level1" / "1_ReLU.py"), "--problem", "9/99",
                 "--dataset", "builtin"]) == 2
    err = capsys.readouterr().err
    assert err.count("kb-gym:") == 2 and "Traceback" not in err


def test_baseline_fills_the_cache(one_problem, capsys):
    assert main(["baseline", "--dataset", str(one_problem), "--device", "cpu", "-v"]) == 0
    out = capsys.readouterr().out
    assert "cached 1/1 baselines" in out


def test_report_table_and_plot(tmp_path, capsys):
    from kb_gym.result import EvalResult

    results = tmp_path / "r.jsonl"
    rows = [EvalResult(status="correct", problem_name="1_A", level=1, correct=True, speedup=1.6),
            EvalResult(status="incorrect", problem_name="2_B", level=1),
            EvalResult(status="correct", problem_name="1_C", level=2, correct=True, speedup=0.7)]
    results.write_text("".join(r.to_json() + "\n" for r in rows))
    png = tmp_path / "fast_p.png"
    assert main(["report", str(results), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "fast_1" in out and "fast_1.5" in out and "level1" in out
    assert png.stat().st_size > 1000


def test_audit_on_a_folder(one_problem, tmp_path, capsys):
    out = tmp_path / "audit.jsonl"
    assert main(["audit", "--dataset", str(one_problem), "--device", "cpu", "--trials", "1", "--out", str(out)]) == 0
    assert "passed by a trivial candidate: 0" in capsys.readouterr().out
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["passed_by"] == [] and row["reference"] == "correct" and row["fp64_reference"] == "correct"


def test_audit_runs_the_kinds_asked_for_and_names_unknown_ones(one_problem, tmp_path, capsys):
    out = tmp_path / "audit.jsonl"
    args = ["audit", "--dataset", str(one_problem), "--device", "cpu", "--trials", "1", "--out", str(out)]
    assert main([*args, "--kinds", "zeros,bogus"]) == 2
    assert "bogus" in capsys.readouterr().err and not out.exists()
    assert main([*args, "--kinds", "zeros,fp16_reference"]) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert {"zeros", "fp16_reference", "reference", "fp64_reference"} <= set(row) and "constant" not in row


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("demo", "list", "eval", "baseline", "bench", "audit", "soak", "report", "train"):
        assert command in out


def test_a_typo_in_a_training_or_evaluation_option_is_one_line_and_exit_code_2(capsys):
    """Checked before any model loads: the bad key with the nearest valid one, or the bad value."""
    cases = [(["train", "--model", "no-such-model", "--grpo", "max_step=2"], "did you mean 'max_steps'?"),
             (["train", "--model", "no-such-model", "--eval", "trial=2"], "did you mean 'trials'?"),
             (["train", "--model", "no-such-model", "--grpo", "max_steps=ten"], "takes an int"),
             (["evaluate-model", "--model", "no-such-model", "--eval", "trial=2"], "did you mean 'trials'?"),
             (["evaluate-model", "--model", "no-such-model", "--eval", "trials=0"], "trials must be >= 1"),
             (["train", "--model", "no-such-model", "--evaluator", "grpc://head:1"], "use 'local', 'ray' or")]
    for argv, said in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1, (argv, err)
