"""The learning check (issue 14) on the CPU at tiny scale: the corpus's answers get the verdicts their kinds
promise, the intervals, the time budget, deduplication, and every phase end to end (a tiny model, CPU-size
problems, one GRPO step against a CPU evaluator) with resuming and the report."""

from __future__ import annotations

import json
import math
import random
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from kb_gym import EvalConfig, Evaluator
from kb_gym.problems import get_problem, load_problems, reference_as_candidate
from kb_gym.training.dedup import DedupEvaluator
from kb_gym.training.learning_check import main, parse_phases, run
from kb_gym.training.learning_check.common import Deadline, Layout, LearningCheckConfig, budget_callback, read_jsonl
from kb_gym.training.learning_check.corpus import (
    BROKEN_KINDS,
    allocate,
    answer_text,
    broken_code,
    build_corpus,
    check_corpus,
    correct_code,
    parse_mix,
    slow_code,
    solution_for,
)
from kb_gym.training.learning_check.eval import run_eval
from kb_gym.training.learning_check.stats import (
    bootstrap_mean,
    paired_difference,
    problem_bootstrap,
    summarize_samples,
    wilson,
)

SMALL = EvalConfig(trials=1, timing=False)


def test_the_mix_is_split_exactly_and_the_corpus_is_the_same_for_a_seed():
    mix = parse_mix("correct=0.4,slow=0.2,broken=0.4")
    assert mix == pytest.approx({"correct": 0.4, "slow": 0.2, "broken": 0.4})
    assert allocate(12, mix) == {"correct": 5, "slow": 2, "broken": 5} and sum(allocate(7, mix).values()) == 7
    assert parse_mix("correct=1") == {"correct": 1.0, "slow": 0.0, "broken": 0.0}
    with pytest.raises(ValueError, match="unknown answer kind"):
        parse_mix("right=1")
    problems = load_problems("builtin", size="cpu", split="train")[:3]
    first = [r.to_dict() for r in build_corpus(problems, per_problem=6, mix=mix, seed=1)]
    again = [r.to_dict() for r in build_corpus(problems, per_problem=6, mix=mix, seed=1)]
    other = [r.to_dict() for r in build_corpus(problems, per_problem=6, mix=mix, seed=2)]
    assert first == again and first != other and len(first) == 18
    # the prompt is the dataset's (no one-shot example), the same for every answer of a problem
    assert [m["role"] for m in first[0]["prompt"]] == ["system", "user"] and "Example reference" not in json.dumps(first)


def test_every_kind_of_answer_gets_the_verdict_it_promises():
    """The real evaluator on CPU-size problems: the correct and slow answers are correct (the Triton solution of
    ReLU through the interpreter; a reference copy for a problem without one), every broken kind is not."""
    problems = load_problems("builtin", size="cpu", split="train")
    relu, matmul = get_problem(problems, name="level1/1_ReLU"), get_problem(problems, name="level1/9_SquareMatmul")
    assert correct_code(relu)[1] == "triton_solution" and correct_code(matmul)[1] == "reference_copy"
    rows = []
    for problem in (relu, matmul):
        code = correct_code(problem)[0]
        rows += [{"problem_key": problem.key, "kind": "correct", "variant": "c", "completion": answer_text(code),
                  "expect_correct": True},
                 {"problem_key": problem.key, "kind": "slow", "variant": "x2",
                  "completion": answer_text(slow_code(code, 2)), "expect_correct": True}]
    rng = random.Random(0)
    for kind in BROKEN_KINDS:
        rows.append({"problem_key": relu.key, "kind": "broken", "variant": kind, "expect_correct": False,
                     "completion": answer_text(broken_code(correct_code(relu)[0], kind, rng),
                                               closed=kind != "truncated")})
    with Evaluator("cpu", config=SMALL, results_path=False, workers_per_device=2) as ev:
        verdicts = check_corpus(rows, [relu, matmul], ev)
    assert [v for v in verdicts if not v["agrees"]] == []
    broken = {v["variant"]: v["status"] for v in verdicts if v["kind"] == "broken"}
    assert broken["no_code"] == broken["no_modelnew"] == "format_error" and broken["syntax_error"] == "compile_error"
    assert broken["wrong_value"] == "incorrect" and broken["runtime_error"] == "runtime_error"


def test_intervals():
    lo, hi = wilson(5, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.2366, 0.7634)
    assert wilson(0, 4)[0] == 0.0 and round(wilson(0, 4)[1], 3) == 0.490 and wilson(0, 0) == (0.0, 1.0)
    values = [0.0, 1.0] * 20
    lo, hi = bootstrap_mean(values, seed=3)
    assert lo < 0.5 < hi and (lo, hi) == bootstrap_mean(values, seed=3)
    same = {"a": [1.0, 1.0], "b": [0.0, 0.0]}
    assert problem_bootstrap({"a": [1.0, 1.0]}) == (1.0, 1.0) and problem_bootstrap(same)[0] < 0.5
    diff = paired_difference(same, same)
    assert diff["value"] == 0.0 and diff["problem_bootstrap"] == [0.0, 0.0]
    rows = [{"problem_key": "p", "status": "correct", "speedup": 2.0, "speed_credit": True},
            {"problem_key": "p", "status": "correct", "speedup": 2.0, "speed_credit": False},
            {"problem_key": "q", "status": "incorrect"}, {"problem_key": "q", "status": "correct", "speedup": 0.5}]
    m = summarize_samples(rows, lambda r: 1.0 if r["status"] == "correct" else -1.0)
    assert (m["fast_0"]["k"], m["fast_1"]["k"], m["credited"]["k"]) == (3, 1, 2)
    assert m["mean_reward"]["value"] == 0.5 and m["statuses"] == {"correct": 3, "incorrect": 1}


def test_the_budget_callback_stops_for_the_phase_or_for_the_call():
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    seen = []
    cb = budget_callback(Deadline(10), phase_seconds_left=3600, on_step=seen.append)
    cb.on_step_begin(None, None, control)
    cb.on_step_end(None, None, control)
    assert cb.stop_reason is None and not control.should_training_stop and len(seen) == 1
    call = budget_callback(Deadline(0.2), phase_seconds_left=3600)  # 12 s left: less than a checkpoint's margin
    call.on_step_end(None, None, control)
    assert call.stop_reason == "call" and control.should_save and control.should_training_stop
    phase = budget_callback(Deadline(10), phase_seconds_left=0.0)
    phase.step_started -= 1.0  # a one-second step, with no phase budget left for another
    phase.on_step_end(None, None, SimpleNamespace(should_save=False, should_training_stop=False))
    assert phase.stop_reason == "phase"


def test_dedup_evaluates_each_program_once():
    submitted = []

    class Inner:
        store = "the inner store"

        def submit(self, problem, text, **kwargs):
            submitted.append(text)
            future: Future = Future()
            future.set_result(len(submitted))
            return future

    relu = get_problem(load_problems("builtin", size="cpu"), name="level1/1_ReLU")
    code = correct_code(relu)[0]
    ev = DedupEvaluator(Inner())
    first = ev.submit(relu, answer_text(code))
    again = ev.submit(relu, "Other words, same program:\n```python\n" + code + "```")
    other = ev.submit(relu, answer_text(slow_code(code, 2)))
    assert first is again and other is not first and len(submitted) == 2 and (ev.hits, ev.misses) == (1, 2)
    assert ev.store == "the inner store"  # everything else is the inner evaluator's


def _tiny(tmp_path, **changes) -> LearningCheckConfig:
    fields = dict(out=str(tmp_path / "run"), model_size="tiny", vocab_size=400, size="cpu", eval_devices="cpu",
                  train_limit=2, test_limit=2, per_problem=4, sft_epochs=1, sft_batch_size=4, max_length=2048,
                  samples=2, train_samples=2, max_new_tokens=12, gen_batch_size=4, grpo_steps=1, grpo_batch_size=2, num_generations=2,
                  max_completion_length=8, eval_config={"trials": 1, "timing": False}, max_minutes=5)
    return LearningCheckConfig(**{**fields, **changes})


def test_the_eval_phase_stops_at_its_deadline_carries_on_and_evaluates_each_program_once(tmp_path):
    """A fixed policy (the reference copied back, so every answer of a problem is the same program): the first
    call runs out of time after one generation batch, the second generates only the rest, runs out of time
    before evaluating, and the third evaluates one program per problem and gives its copy the same verdict."""
    cfg = _tiny(tmp_path, gen_batch_size=2)
    layout = Layout(cfg.out)
    problems = load_problems("builtin", size="cpu", split="test")[:2]
    by_code = {p.code.strip(): p for p in problems}
    calls: list[int] = []
    deadline = Deadline(5)

    def policy(batch):
        calls.append(len(batch))
        deadline.end = time.monotonic()  # the call's time is up after this batch
        return [answer_text(reference_as_candidate(next(p for c, p in by_code.items() if c in m[-1]["content"])))
                for m in batch]

    first = run_eval(cfg, layout, deadline, "before", problems, generate=policy)
    assert first.status == "stopped" and calls == [2]
    second = run_eval(cfg, layout, deadline := Deadline(5), "before", problems, generate=policy)
    assert second.status == "stopped" and calls == [2, 2]  # generated the rest; no time left to evaluate
    assert not (layout.eval_before / "results.jsonl").exists()
    third = run_eval(cfg, layout, Deadline(5), "before", problems, generate=policy)
    assert third.status == "done" and calls == [2, 2]
    rows = read_jsonl(layout.eval_before / "results.jsonl")
    assert len(rows) == 4 and sorted((r["problem_key"], r["sample"]) for r in rows) == sorted(
        (p.key, k) for p in problems for k in range(2))
    assert sum("duplicate_of" in r for r in rows) == 2 and {r["status"] for r in rows} == {"correct"}
    done = json.loads(layout.done_file("eval-before").read_text())
    m = done["metrics"]
    # a reference copy is correct but has no kernel of its own: no speed credit, and the reward of a wrong answer
    assert m["fast_0"]["value"] == 1.0 and m["credited"]["value"] == 0.0 and m["mean_reward"]["value"] == -0.1
    assert done["evaluations"] == 2 and done["duplicates"] == 2
    assert (layout.eval_before / "summary.json").exists() and (layout.eval_before / "fast_p.png").exists()


def test_every_phase_end_to_end_resumes_and_reports(tmp_path, capsys):
    """corpus, sft, eval-before and -train, grpo (one step against the CPU evaluator), eval-after and -train,
    report; then the same command again skips every phase; other options on the same folder are refused."""
    cfg = _tiny(tmp_path)
    layout = Layout(cfg.out)
    results = run(cfg, parse_phases("all"))
    assert [r.phase for r in results] == ["corpus", "sft", "eval-before", "eval-before-train", "grpo", "eval-after",
                                          "eval-after-train", "report"]
    assert [r.status for r in results] == ["done"] * 8, capsys.readouterr().out

    corpus = read_jsonl(layout.corpus_file)
    assert len(corpus) == 2 * 4 and {r["kind"] for r in corpus} <= {"correct", "slow", "broken"}
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(layout.sft_model)
    assert tokenizer.chat_template and tokenizer.eos_token == "<|end|>"
    assert AutoModelForCausalLM.from_pretrained(layout.sft_model).config.num_hidden_layers == 2
    losses = [r["loss"] for r in read_jsonl(layout.sft / "log.jsonl")]
    assert losses and all(math.isfinite(x) for x in losses)

    splits = {"test": {p.key for p in load_problems("builtin", size="cpu", split="test")[:2]},
              "train": {p.key for p in load_problems("builtin", size="cpu", split="train")[:2]}}
    for which, split in (("eval_before", "test"), ("eval_after", "test"), ("eval_before_train", "train"),
                         ("eval_after_train", "train")):
        rows = read_jsonl(layout.root / which / "results.jsonl")
        assert len(rows) == 2 * 2 and len(read_jsonl(layout.root / which / "completions.jsonl")) == 4
        assert {r["problem_key"] for r in rows} == splits[split], which  # each split's own problems
        assert (layout.root / which / "summary.json").exists()
    for which in ("eval_after", "eval_after_train"):
        assert {r["model"] for r in read_jsonl(layout.root / which / "results.jsonl")} == {str(layout.grpo_trainer)}

    steps = read_jsonl(layout.grpo_steps)
    assert [s["step"] for s in steps] == [1] and (layout.grpo_trainer / "config.json").exists()
    s = steps[0]
    assert s["generation_s"] > 0 and s["evaluation_s"] > 0 and s["update_s"] >= 0
    assert s["generation_s"] + s["evaluation_s"] + s["update_s"] == pytest.approx(s["wall_s"])
    assert {"reward", "correct", "eval_seconds", "status/format_error"} <= set(s)
    assert len(read_jsonl(layout.grpo / "results.jsonl")) >= 1  # the reward function recorded what it evaluated

    report = json.loads((layout.report / "report.json").read_text())
    assert report["status"] == "complete"
    for which in ("before", "after"):
        m = report[which]["metrics"]
        rows = read_jsonl(layout.root / f"eval_{which}" / "results.jsonl")
        assert m["samples"] == 4 and m["fast_0"]["k"] == sum(r["status"] == "correct" for r in rows)
        for name in ("fast_0", "fast_1"):
            lo, hi = m[name]["wilson"]
            assert lo <= m[name]["value"] <= hi and hi > lo
        lo, hi = m["mean_reward"]["bootstrap"]
        assert lo <= m["mean_reward"]["value"] <= hi
    assert set(report["difference"]) == {"fast_0", "fast_1", "credited", "mean_reward"}
    train = report["train"]
    assert set(train["difference"]) == set(report["difference"]) and train["before"]["split"] == "train"
    assert train["before"]["metrics"]["samples"] == train["after"]["metrics"]["samples"] == 4
    assert (layout.report / "learning_check.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (layout.report / "report.md").read_text()
    assert "| fast_1 | before |" in md and "## Held-out problems" in md and "## In distribution" in md

    before = {p: p.stat().st_mtime_ns for p in layout.root.rglob("*.jsonl")}
    again = run(cfg, parse_phases("all"))
    assert [r.status for r in again] == ["skipped"] * 8
    assert {p: p.stat().st_mtime_ns for p in layout.root.rglob("*.jsonl")} == before  # nothing redone
    capsys.readouterr()
    assert main(["--out", cfg.out, "--model-size", "small", "--phase", "report"]) == 2
    assert "model_size" in capsys.readouterr().err
    off = run(_tiny(tmp_path, out=str(tmp_path / "off"), train_samples=0), ["eval-before-train"])
    assert [r.status for r in off] == ["not used"]
    held_out_off = _tiny(tmp_path, out=str(tmp_path / "held_out_off"), samples=0)
    assert [r.status for r in run(held_out_off, ["eval-before", "eval-after"])] == ["not used"] * 2
    from kb_gym.training.learning_check.report import build_report

    report = build_report(held_out_off, Layout(held_out_off.out))  # what such a run waits for: grpo and *-train
    assert report["status"] == "partial (missing: grpo, eval-before-train, eval-after-train)"


def test_bad_options_are_one_line_and_exit_code_2(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--phase", "sft,train"]) == 2
    assert "unknown phase" in capsys.readouterr().err
    assert main(["--out", str(tmp_path), "--mix", "correct=-1"]) == 2
    assert main(["--out", str(tmp_path), "--eval", "trial=3"]) == 2
    assert "did you mean 'trials'" in capsys.readouterr().err
    from kb_gym.cli import main as kb_gym_main

    assert kb_gym_main(["learning-check", "--out", str(tmp_path), "--phase", "nope"]) == 2  # the subcommand hands on
    assert "unknown phase" in capsys.readouterr().err


def test_grpo_can_train_and_read_only_where_the_corpus_holds_a_kernel(tmp_path, capsys):
    """``--grpo-problems kernels``: GRPO and the in-distribution reading use the train problems whose corpus
    answer is one of our kernels (a faster answer is within the policy's reach only there); the corpus, and so
    the supervised phase, still cover every train problem."""
    from kb_gym.training.learning_check.phases import split_problems, trained_problems

    cfg = LearningCheckConfig(out=str(tmp_path), size="cpu", grpo_problems="kernels")
    train = split_problems(cfg, "train")
    kernels = trained_problems(cfg)
    assert kernels and len(kernels) < len(train)
    assert {p.key for p in kernels} == {p.key for p in train if solution_for(p, "triton") is not None}
    assert trained_problems(LearningCheckConfig(out=str(tmp_path), size="cpu")) == train
    with pytest.raises(ValueError, match="grpo_problems must be one of"):
        trained_problems(LearningCheckConfig(out=str(tmp_path), size="cpu", grpo_problems="fast"))
    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal of a choice: exit code 2, one line
        main(["--out", str(tmp_path), "--grpo-problems", "fast"])
    assert exit_.value.code == 2 and "--grpo-problems" in capsys.readouterr().err
