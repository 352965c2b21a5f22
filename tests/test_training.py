"""TRL integration on the CPU: the prompt dataset and the evaluator as a GRPO reward function."""

from __future__ import annotations

import json

import pytest

from kb_gym import EvalConfig, EvalResult, Evaluator
from kb_gym.demo import WRONG_RELU
from kb_gym.problems import BUILTIN_DIR, load_problems
from kb_gym.training import (
    KernelRewardConfig,
    KernelRewardFunction,
    batch_metrics,
    build_prompt_dataset,
    completion_text,
)

SOLUTION = (BUILTIN_DIR / "solutions" / "level1" / "1_ReLU.py").read_text()
RELU = "level1/1_ReLU"
SMALL = EvalConfig(trials=2, timing_min_reps=3, timing_max_reps=6, timing_max_seconds=2)


def answer(code: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": f"Here it is:\n\n```python\n{code}```\n"}]


@pytest.fixture(scope="module")
def reward_fn(tmp_path_factory):
    store = tmp_path_factory.mktemp("rewards") / "results.jsonl"
    with Evaluator("cpu", config=SMALL, results_path=store) as ev:
        yield KernelRewardFunction(KernelRewardConfig(reward="default"), evaluator=ev)


def test_prompt_dataset_has_one_row_per_problem_with_its_key():
    ds = build_prompt_dataset("builtin")
    problems = load_problems("builtin")
    assert len(ds) == len(problems) and set(ds.column_names) == {"prompt", "problem_key", "level", "name"}
    row = ds[[p.key for p in problems].index(RELU)]
    assert row["problem_key"] == RELU and [m["role"] for m in row["prompt"]] == ["system", "user"]
    relu_code = next(p.code for p in problems if p.key == RELU)
    assert relu_code.strip() in row["prompt"][1]["content"]


def test_prompt_dataset_as_strings_repeated_and_one_level():
    ds = build_prompt_dataset("builtin", level=2, conversational=False, repeat=3)
    assert len(ds) == 3 * len(load_problems("builtin", level=2))
    assert all(isinstance(p, str) and "ModelNew" in p for p in ds["prompt"]) and set(ds["level"]) == {2}
    with pytest.raises(ValueError, match="repeat"):
        build_prompt_dataset("builtin", repeat=0)


def test_completion_text_takes_strings_messages_and_conversations():
    assert completion_text("abc") == "abc"
    assert completion_text({"role": "assistant", "content": "x"}) == "x"
    assert completion_text([{"role": "assistant", "content": "y"}]) == "y"
    assert completion_text([]) == ""


def test_rewards_order_a_batch_and_log_metrics(reward_fn):
    """The call TRL makes: the batch is scored in one go, in order, and the metrics reach log_metric."""
    logged: dict[str, float] = {}
    extra: dict[str, list] = {}
    completions = [answer(SOLUTION), answer(WRONG_RELU), [{"role": "assistant", "content": "no code, sorry"}],
                   answer(SOLUTION)]
    keys = [RELU, RELU, RELU, "level9/404_Missing"]
    with pytest.warns(UserWarning, match="level9/404_Missing"):
        rewards = reward_fn(prompts=[[]] * 4, completions=completions, completion_ids=[[]] * 4, problem_key=keys,
                            log_metric=logged.__setitem__, log_extra=lambda col, vals: extra.setdefault(col, vals),
                            trainer_state=None)
    statuses = [r.status for r in reward_fn.last_results]
    assert statuses == ["correct", "incorrect", "format_error", "format_error"], [r.error for r in
                                                                                  reward_fn.last_results]
    assert rewards[0] > rewards[1] > rewards[2] and rewards[3] == rewards[2]
    assert "level9/404_Missing" in reward_fn.last_results[3].error
    recorded = reward_fn.evaluator.store.path.read_text().splitlines()[-4:]  # every sample, the unknown one too
    assert sorted(json.loads(line)["status"] for line in recorded) == sorted(statuses)
    assert logged["kernel_reward/correct"] == 0.25 and logged["kernel_reward/compiled"] == 0.5
    # the share of every status (all of them, so the columns stay put), flag rates, reward components, time
    assert logged["kernel_reward/status/format_error"] == 0.5 and logged["kernel_reward/status/incorrect"] == 0.25
    assert logged["kernel_reward/status/timeout"] == 0.0
    assert {"kernel_reward/reward/status", "kernel_reward/reward/speed", "kernel_reward/reward/integrity_penalty"} \
        <= set(logged)
    assert logged["kernel_reward/eval_seconds"] > 0
    assert extra["status"] == statuses and len(extra["speedup"]) == 4
    assert reward_fn.__name__ == "kernel_reward"


def test_reward_function_picks_its_preset_by_name():
    # "kernelbench" integrity: the name lookup is under test, not the CPU envelope (an honest Triton-interpreter
    # kernel's excess, 1.4-1.95 ms, sits under the 3 ms CPU floor but not far)
    with Evaluator("cpu", config=SMALL.replace(integrity="kernelbench"), results_path=False) as ev:
        fast = KernelRewardFunction(KernelRewardConfig(reward="fast_p", reward_kwargs={"p": 0.0}, name="fast0"),
                                    evaluator=ev)
        rewards = fast(completions=[answer(SOLUTION), answer(WRONG_RELU)], problem_key=[RELU, RELU])
    assert rewards == [1.0, 0.0] and fast.__name__ == "fast0"


def test_identical_programs_of_a_batch_are_evaluated_once_and_every_sample_is_recorded(reward_fn, tmp_path):
    """A GRPO group that repeats itself: the same code (whatever prose is around it) is evaluated once per call
    (dedup="batch", the default) or once per run ("run"); each copy gets the verdict and a row in the store."""
    same = [{"role": "assistant", "content": f"Sure! A Triton kernel:\n```python\n{SOLUTION}```\nDone."}]
    completions = [answer(SOLUTION), same, answer(WRONG_RELU), answer(SOLUTION)]
    store = reward_fn.evaluator.store.path

    def call(fn) -> tuple[list[float], list[dict], dict]:
        logged: dict[str, float] = {}
        before = len(store.read_text().splitlines())
        rewards = fn(completions=completions, problem_key=[RELU] * 4, log_metric=logged.__setitem__)
        return rewards, [json.loads(line) for line in store.read_text().splitlines()[before:]], logged

    for _ in range(2):  # per call: the second call evaluates its programs again
        rewards, rows, logged = call(reward_fn)
        assert len(rows) == 4 and sum(bool(r.get("duplicate")) for r in rows) == 2, rows
        assert rewards[0] == rewards[1] == rewards[3] > rewards[2] and logged["kernel_reward/duplicates"] == 0.5
        results = reward_fn.last_results
        assert [r.status for r in results] == ["correct", "correct", "incorrect", "correct"]
        assert len({id(r) for r in results}) == 4  # each sample its own result object
    run = KernelRewardFunction(KernelRewardConfig(reward="default", dedup="run"), evaluator=reward_fn.evaluator)
    call(run)
    rewards, rows, logged = call(run)  # every program of the second call was evaluated by the first
    assert sum(bool(r.get("duplicate")) for r in rows) == 4 and logged["kernel_reward/duplicates"] == 1.0
    off = KernelRewardFunction(KernelRewardConfig(reward="default", dedup="off"), evaluator=reward_fn.evaluator)
    _, rows, logged = call(off)
    assert not any(r.get("duplicate") for r in rows) and logged["kernel_reward/duplicates"] == 0.0
    with pytest.raises(ValueError, match="dedup must be one of"):
        KernelRewardConfig(dedup="always")


def test_mismatched_columns_are_a_clear_error(reward_fn):
    with pytest.raises(ValueError, match="2 completions but 1 problem keys"):
        reward_fn(completions=["a", "b"], problem_key=[RELU])
    # a dataset of the user's own without the column: the error names it, and the columns there are
    with pytest.raises(ValueError, match=r"no 'problem_key' column.*columns given: level, task"):
        reward_fn(completions=["a"], task=["relu"], level=[1])


def test_batch_metrics_of_nothing_is_zero():
    metrics = batch_metrics([])
    assert {k: metrics[k] for k in ("correct", "compiled", "fast_1", "speedup_mean_correct")} == dict.fromkeys(
        ("correct", "compiled", "fast_1", "speedup_mean_correct"), 0.0)
    assert all(v == 0.0 for k, v in metrics.items() if k.startswith("status/")) and "status/correct" in metrics


def test_batch_metrics_count_each_flag_once_per_result_and_average_the_reward_parts():
    results = [EvalResult(status="correct", speedup=2.0, flags=["side_stream", "side_stream"]),
               EvalResult(status="correct", speedup=1.0, flags=["no_custom_kernel"]),
               EvalResult(status="incorrect")]
    metrics = batch_metrics(results, parts=[{"speed": 1.0, "label": "x"}, {"speed": 0.0}, {"speed": float("nan")}],
                            seconds=3.5)
    assert metrics["flag/side_stream"] == pytest.approx(1 / 3) and metrics["flag/no_custom_kernel"] == pytest.approx(1 / 3)
    assert metrics["status/correct"] == pytest.approx(2 / 3) and metrics["reward/speed"] == 0.5  # NaN and text left out
    assert metrics["eval_seconds"] == 3.5


GRPO_STEP = {"per_device_train_batch_size": 2, "num_generations": 2, "max_completion_length": 8, "max_steps": 1,
             "logging_steps": 1, "save_strategy": "no"}


def test_grpo_trainer_scores_its_generations_with_the_kernel_reward(tiny_lm, tmp_path):
    from kb_gym.training.grpo import GRPOKernelConfig, build_trainer

    model, tokenizer = tiny_lm
    cfg = GRPOKernelConfig(model="tiny", level=1, one_shot=False, eval_devices="cpu",
                           eval_config={"trials": 1, "timing": False}, results_path=str(tmp_path / "r.jsonl"),
                           grpo={**GRPO_STEP, "output_dir": str(tmp_path / "out")})
    trainer, reward_fn = build_trainer(cfg, model=model, processing_class=tokenizer)
    try:
        trainer.train()
    finally:
        reward_fn.close()
    logged = trainer.state.log_history[0]
    assert {"rewards/kernel_reward/mean", "kernel_reward/correct", "kernel_reward/compiled"} <= set(logged)
    # A random model writes no code: every sample is a format error, and every one was recorded.
    assert [r.status for r in reward_fn.last_results] == ["format_error"] * 2
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 2


def test_a_run_resumes_from_its_latest_checkpoint_and_a_finished_run_is_never_overwritten_unasked(tiny_lm, tmp_path):
    """`kb-gym train --resume latest`: the step count, optimizer and data position carry on from checkpoint-2;
    the same command without --resume (or --overwrite) is refused before any model loads."""
    from kb_gym.training.errors import ConfigError
    from kb_gym.training.grpo import GRPOKernelConfig, check_config, train

    model, tokenizer = tiny_lm
    results = tmp_path / "r.jsonl"
    out = tmp_path / "out"

    def config(max_steps: int, **extra) -> GRPOKernelConfig:
        grpo = {**GRPO_STEP, "max_steps": max_steps, "save_strategy": "steps", "save_steps": 1, "output_dir": str(out)}
        return GRPOKernelConfig(model="tiny", level=1, one_shot=False, eval_devices="cpu",
                                eval_config={"trials": 1, "timing": False}, results_path=str(results), grpo=grpo,
                                **extra)

    with pytest.raises(ConfigError, match="no checkpoint-N folder"):
        check_config(config(2, resume="latest"))
    first = train(config(2), model=model, processing_class=tokenizer)
    assert first.state.global_step == 2 and (out / "checkpoint-2").is_dir() and (out / "config.json").exists()
    with pytest.raises(ConfigError, match="--resume latest.*--overwrite"):
        check_config(config(3))
    again = train(config(3, resume="latest"), model=model, processing_class=tokenizer)
    assert again.state.global_step == 3
    # 2 completions a step: steps 1-2 in the first run, only step 3 in the resumed one
    assert len(results.read_text().splitlines()) == 6
    check_config(config(3, overwrite=True))  # asked for: allowed


def test_training_evaluates_with_the_rl_preset_unless_told_otherwise(tiny_lm, tmp_path):
    from kb_gym.training.grpo import GRPOKernelConfig, build_trainer

    model, tokenizer = tiny_lm
    for preset, reuse in (("rl", True), ("default", False)):
        cfg = GRPOKernelConfig(model="tiny", level=1, one_shot=False, eval_devices="cpu", eval_preset=preset,
                               eval_config={"trials": 1}, results_path=False,
                               grpo={**GRPO_STEP, "output_dir": str(tmp_path / preset)})
        trainer, reward_fn = build_trainer(cfg, model=model, processing_class=tokenizer)
        try:
            assert reward_fn.evaluator.config.reuse_cached_baseline is reuse
            assert reward_fn.evaluator.config.trials == 1  # the fields given sit on top of the preset
        finally:
            reward_fn.close()


def test_cli_train_runs_a_local_model_and_saves_it(tiny_lm, tmp_path, capsys):
    from kb_gym.cli import main

    model, tokenizer = tiny_lm
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "trained"
    audit = tmp_path / "audit.jsonl"
    audit.write_text('{"problem": "level1/1_ReLU", "passed_by": ["zeros"]}\n')
    argv = ["train", "--model", str(tmp_path / "tiny"), "--level", "1", "--device", "cpu", "--eval", "trials=1",
            "--eval", "timing=false", "--grpo", f"output_dir={out}", "--exclude-audit", str(audit)]
    argv += [f"--grpo={k}={v}" for k, v in GRPO_STEP.items()]
    assert main(argv) == 0
    assert "trained 1 step(s)" in capsys.readouterr().out and (out / "config.json").exists()


def test_train_config_errors_name_the_problem():
    from kb_gym.training.grpo import config_from_dict

    with pytest.raises(ValueError, match="unknown training option"):
        config_from_dict({"model": "m", "epochs": 3})
    with pytest.raises(ValueError, match="needs 'model'"):
        config_from_dict({})


def test_evaluate_model_writes_results_summaries_and_plot(tmp_path):
    """A fixed policy that answers ReLU with its solution and everything else with prose."""
    import json

    from kb_gym.training.evaluate_model import ModelEvalConfig, evaluate_model

    relu_code = next(p.code for p in load_problems("builtin") if p.key == RELU).strip()

    def policy(batch):
        return [f"```python\n{SOLUTION}```" if relu_code in messages[-1]["content"] else "I cannot do this one."
                for messages in batch]

    cfg = ModelEvalConfig(model="fixed-policy", level=1, samples=2, eval_devices="cpu", out_dir=str(tmp_path),
                          eval_config={"trials": 1, "timing_min_reps": 3, "timing_max_reps": 4}, batch_size=3)
    summary = evaluate_model(cfg, generate=policy)
    n = len(load_problems("builtin", level=1))
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2 * n
    statuses = {json.loads(line)["problem_name"]: json.loads(line)["status"] for line in lines}
    assert statuses["1_ReLU"] == "correct" and sum(s == "format_error" for s in statuses.values()) == n - 1
    assert summary["all"]["n_tasks"] == n and summary["all"]["fast_0"] == pytest.approx(1 / n)
    assert json.loads((tmp_path / "summary.json").read_text())["samples"] == 2
    assert (tmp_path / "summary.csv").read_text().startswith("group,") and (tmp_path / "fast_p.png").exists()
    assert "best_of:fast_1" in (tmp_path / "summary.csv").read_text().splitlines()[0]
    per_problem = (tmp_path / "per_problem.csv").read_text().splitlines()
    assert per_problem[0] == "problem,samples,correct,fast_1,best_status,best_speedup,best_flags"
    relu_row = next(line for line in per_problem if line.startswith("level1/1_ReLU,"))
    assert relu_row.split(",")[1:3] == ["2", "2"] and relu_row.split(",")[4] == "correct"
    assert len(per_problem) == n + 1


def test_evaluate_model_run_again_after_a_crash_does_only_what_is_missing(tmp_path):
    """Completions and results are on disk as they are made; a second run into the folder generates and
    evaluates only the rest, and a folder of another model is refused."""
    import json

    from kb_gym.training.evaluate_model import ModelEvalConfig, evaluate_model

    calls: list[int] = []

    def policy(batch):
        calls.append(len(batch))
        if len(calls) == 2:
            raise RuntimeError("preempted")  # the second generate call dies: the first batch is kept
        return ["I cannot do this one."] * len(batch)

    cfg = ModelEvalConfig(model="fixed-policy", level=3, samples=1, eval_devices="cpu", out_dir=str(tmp_path),
                          eval_config={"trials": 1, "timing": False}, batch_size=4)
    with pytest.raises(RuntimeError, match="preempted"):
        evaluate_model(cfg, generate=policy)
    n = len(load_problems("builtin", level=3))
    assert len((tmp_path / "completions.jsonl").read_text().splitlines()) == 4
    assert not (tmp_path / "results.jsonl").exists()
    summary = evaluate_model(cfg, generate=policy)  # generates the other n - 4, evaluates all n
    assert calls[2:] and sum(calls[2:]) == n - 4 and summary["all"]["n_tasks"] == n
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted(r["problem_key"] for r in rows) == sorted(p.key for p in load_problems("builtin", level=3))
    calls.clear()
    evaluate_model(cfg, generate=policy)  # all done: nothing generated or evaluated again
    assert calls == [] and len((tmp_path / "results.jsonl").read_text().splitlines()) == n
    with pytest.raises(ValueError, match="its own --out folder"):
        evaluate_model(ModelEvalConfig(**{**cfg.__dict__, "model": "another"}), generate=policy)


@pytest.mark.parametrize("chat", [True, False], ids=["chat-template", "base-model"])
def test_cli_evaluate_model_with_a_local_model(tiny_lm, tmp_path, capsys, chat):
    from kb_gym.cli import main

    model, tokenizer = tiny_lm
    if not chat:
        tokenizer.chat_template = None
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    assert main(["evaluate-model", "--model", str(tmp_path / "tiny"), "--level", "3", "--device", "cpu",
                 "--max-new-tokens", "4", "--out", str(tmp_path / "eval"), "--eval", "trials=1"]) == 0
    assert "fast_1" in capsys.readouterr().out.replace("fast_1.0", "fast_1")
    assert (tmp_path / "eval" / "summary.json").exists()


def test_tool_env_evaluates_submissions_and_rewards_the_best(reward_fn):
    from kb_gym.training import KernelToolEnvFactory

    factory = KernelToolEnvFactory("builtin", max_submissions=2, evaluator=reward_fn.evaluator)
    env = factory()
    nothing = env._episode_reward() if env.reset(problem_key=RELU) is None else None
    wrong = env.submit_kernel(WRONG_RELU)
    assert wrong.startswith("incorrect:") and "1 submission(s) left" in wrong
    right = env.submit_kernel(SOLUTION)
    assert right.startswith("correct:") and "0 submission(s) left" in right
    env_results = [env.results[1], env.results[0]]  # correct first, then wrong: "last" takes the wrong one
    assert "limit reached" in env.submit_kernel(SOLUTION) and len(env.results) == 2
    default = reward_fn._reward
    assert env._episode_reward() == max(default(r)[0] for r in env.results) > nothing
    assert nothing == default(EvalResult(status="format_error"))[0]
    env.reset(problem_key=RELU)
    assert env.results == [] and env._episode_reward() == nothing  # a new rollout starts clean
    assert "level9/404" in env.reset(problem_key="level9/404") and "No problem" in env.submit_kernel("x")
    last = KernelToolEnvFactory("builtin", score="last", evaluator=reward_fn.evaluator)()
    last.reset(problem_key=RELU)
    last.results = list(env_results)
    assert last._episode_reward() == default(env_results[-1])[0] < max(default(r)[0] for r in env_results)
    with pytest.raises(ValueError, match="score"):
        KernelToolEnvFactory("builtin", score="mean", evaluator=reward_fn.evaluator)
    factory.close()  # the shared evaluator is not the factory's to close
    assert reward_fn.evaluator.evaluate(factory.problems[RELU], SOLUTION).status == "correct"


def test_the_tool_reward_scores_each_rollout_and_evaluates_a_final_answer_that_made_no_tool_call(reward_fn):
    """Best submission where the model used the tool; a final fenced answer evaluated once where it did not;
    the no-code reward for prose; metrics through TRL's log_metric."""
    from kb_gym.training import KernelToolEnvFactory

    factory = KernelToolEnvFactory("builtin", max_submissions=2, evaluator=reward_fn.evaluator)
    envs = [factory() for _ in range(3)]
    for env in envs:
        env.reset(problem_key=RELU)
    envs[0].submit_kernel(WRONG_RELU)
    completions = [answer(SOLUTION), answer(SOLUTION), [{"role": "assistant", "content": "no idea, sorry"}]]
    logged: dict[str, float] = {}
    rewards = factory.reward_function()(completions=completions, environments=envs, log_metric=logged.__setitem__)
    default = reward_fn._reward
    assert envs[1].results == [] and envs[1].final_result.status == "correct"  # the block was evaluated, once
    assert rewards[0] == default(envs[0].results[0])[0]  # it used the tool: its submission counts, not its answer
    assert len(envs[0].results) == 1 and envs[0].final_result is None
    assert rewards[1] == default(envs[1].final_result)[0] > rewards[0] > rewards[2]
    assert rewards[2] == default(EvalResult(status="format_error"))[0]
    assert logged["kernel_tool/tool_use"] == pytest.approx(1 / 3) and logged["kernel_tool/submissions"] == pytest.approx(1 / 3)
    assert logged["kernel_tool/correct"] == 0.5 and "kernel_tool/status/incorrect" in logged
    with pytest.raises(ValueError, match="environment_factory"):
        factory.reward_function()(completions=completions, environments=envs[:1])


def test_tool_use_prompts_say_to_call_the_tool():
    rows = build_prompt_dataset("builtin", level=1, one_shot=False, tool_calls=3)
    last = rows[0]["prompt"][-1]["content"]
    assert "calling the `submit_kernel` tool" in last and "up to 3 time(s)" in last and "single" not in last
    with pytest.raises(ValueError, match="conversational"):
        build_prompt_dataset("builtin", level=1, conversational=False, tool_calls=3)


def test_grpo_trainer_accepts_the_tool_environment(tiny_lm, tmp_path):
    from trl import GRPOConfig, GRPOTrainer
    qwen3_chat_template = getattr(pytest.importorskip("trl.chat_template_utils"), "qwen3_chat_template", None)
    if qwen3_chat_template is None:
        pytest.skip("this TRL has no Qwen3 template to parse tool calls with")

    from kb_gym.training import KernelToolEnvFactory

    model, tokenizer = tiny_lm
    tokenizer.chat_template = qwen3_chat_template  # a template TRL knows how to parse tool calls from
    made = []

    class Recording(KernelToolEnvFactory):
        def __call__(self):
            made.append(super().__call__())
            return made[-1]

    with Evaluator("cpu", config=SMALL, results_path=False) as ev:
        factory = Recording("builtin", evaluator=ev)
        trainer = GRPOTrainer(model=model, args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False,
                                                           report_to=[], **GRPO_STEP),
                              train_dataset=build_prompt_dataset("builtin", level=1, one_shot=False, tool_calls=4),
                              processing_class=tokenizer, environment_factory=factory,
                              reward_funcs=[factory.reward_function()])
        trainer.train()
    # The one tool the policy is offered (TRL offers every public method of the environment).
    assert [tool.__name__ for tool in trainer.tools] == ["submit_kernel"]
    logged = trainer.state.log_history[0]
    # the tool path logs our metrics too: a random model calls no tool and writes no code block
    assert logged["kernel_tool/tool_use"] == 0.0 and logged["kernel_tool/submissions"] == 0.0
    # Each rollout's environment was reset onto its row's problem through the problem_key column.
    assert made and all(env.problem is not None and env.problem.level == 1 for env in made)
    # No tool call from a random model: every rollout earns the no-submission reward.
    assert logged["reward"] == pytest.approx(factory.reward(EvalResult(status="format_error"))[0])


def test_prompt_dataset_leaves_out_what_an_audit_found_passable(tmp_path):
    import json

    from kb_gym.audit import passable_problems

    audit = tmp_path / "audit.jsonl"
    audit.write_text("\n".join(json.dumps(r) for r in [
        {"problem": RELU, "passed_by": ["zeros"], "unverifiable": True},
        {"problem": "level1/3_RowSoftmax", "passed_by": [], "unverifiable": False},
        {"problem": "level2/80_Elsewhere", "passed_by": [], "unverifiable": True}]) + "\n")
    assert passable_problems(audit) == [RELU, "level2/80_Elsewhere"]
    ds = build_prompt_dataset("builtin", level=1, exclude=passable_problems(audit))
    assert RELU not in ds["problem_key"] and len(ds) == len(load_problems("builtin", level=1)) - 1


@pytest.mark.parametrize("command", ["train", "evaluate-model"])
def test_cli_names_a_model_it_cannot_load(command, tmp_path):
    from kb_gym.cli import main

    with pytest.raises(SystemExit, match="cannot load model '/nonexistent/model'"):
        main([command, "--model", "/nonexistent/model", "--device", "cpu", "--level", "1"]
             + (["--out", str(tmp_path)] if command == "evaluate-model" else
                ["--grpo", f"output_dir={tmp_path}"]))


def test_cli_train_builds_its_config_from_flags_file_and_audit(tmp_path, monkeypatch, capsys):
    import json

    import kb_gym.training.grpo as grpo
    from kb_gym.cli import main

    seen = {}

    class Done:
        state = type("S", (), {"global_step": 0})()
        args = type("A", (), {"output_dir": "x"})()

    monkeypatch.setattr(grpo, "train", lambda cfg: seen.setdefault("cfg", cfg) and Done())
    (tmp_path / "train.json").write_text(json.dumps({"model": "from-file", "reward": "kevin",
                                                     "grpo": {"max_steps": 5}, "exclude": ["level2/1_A"]}))
    (tmp_path / "audit.jsonl").write_text('{"problem": "level1/1_ReLU", "passed_by": ["zeros"]}\n')
    assert main(["train", "--config", str(tmp_path / "train.json"), "--model", "from-flag", "--grpo",
                 "learning_rate=1e-6", "--eval", "trials=2", "--exclude-audit", str(tmp_path / "audit.jsonl"),
                 "--plain-prompts", "--workers-per-device", "3"]) == 0
    cfg = seen["cfg"]
    assert cfg.conversational is False and cfg.workers_per_device == 3
    assert cfg.model == "from-flag" and cfg.reward == "kevin" and cfg.eval_config == {"trials": 2}
    assert cfg.grpo == {"max_steps": 5, "learning_rate": 1e-6}
    assert cfg.exclude == ["level1/1_ReLU", "level2/1_A"]
    (tmp_path / "bad.json").write_text(json.dumps({"model": "m", "epochs": 1}))
    assert main(["train", "--config", str(tmp_path / "bad.json")]) == 2  # checked before anything loads
    assert "unknown training option 'epochs'" in capsys.readouterr().err


def test_prompts_are_built_at_the_size_the_evaluator_will_run():
    """The policy sees the code it is judged on: GPU size for GPU evaluators, CPU size for CPU ones."""
    from kb_gym.training import build_prompt_dataset

    def relu_prompt(**kw) -> str:
        rows = build_prompt_dataset("builtin", level=1, conversational=False, one_shot=False, **kw)
        return next(r["prompt"] for r in rows if r["problem_key"] == "level1/1_ReLU")

    assert "16384" in relu_prompt(size="gpu") and "16384" not in relu_prompt(devices="cpu")
    assert relu_prompt(devices=["cuda:0"]) == relu_prompt(size="gpu")


def test_a_lora_run_trains_an_adapter_that_evaluate_model_loads(tiny_lm, tmp_path):
    """`kb-gym train --lora r=4 ...` trains a peft adapter (saved as adapter_config.json), and
    `kb-gym evaluate-model --model <that folder>` loads it on its base model."""
    pytest.importorskip("peft")
    from kb_gym.training.evaluate_model import load_hf_model
    from kb_gym.training.grpo import GRPOKernelConfig, train

    model, tokenizer = tiny_lm
    base = tmp_path / "base"
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    out = tmp_path / "lora"
    cfg = GRPOKernelConfig(model=str(base), level=1, one_shot=False, eval_devices="cpu", results_path=False,
                           eval_config={"trials": 1, "timing": False},
                           lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
                           grpo={**GRPO_STEP, "output_dir": str(out)})
    trainer = train(cfg)
    assert type(trainer.model).__name__.startswith("Peft") and (out / "adapter_config.json").is_file()
    tokenizer.save_pretrained(out)
    loaded, _ = load_hf_model(str(out))
    assert type(loaded).__name__.startswith("Peft")


def test_lora_and_vllm_settings_are_checked_before_any_model_loads(capsys):
    from kb_gym.cli import main

    pytest.importorskip("peft")
    assert main(["train", "--model", "no-such-model", "--lora", "lora_alpa=16"]) == 2
    assert "did you mean 'lora_alpha'?" in capsys.readouterr().err
    try:
        import vllm  # noqa: F401
    except ImportError:
        assert main(["train", "--model", "no-such-model", "--grpo", "use_vllm=true"]) == 2
        assert "needs vLLM" in capsys.readouterr().err
        with pytest.raises(SystemExit, match="vLLM is not installed"):
            main(["evaluate-model", "--model", "no-such-model", "--level", "3", "--device", "cpu", "--vllm"])


def test_a_multi_turn_rollout_masks_exactly_the_feedback_and_scores_the_episode(tiny_lm, reward_fn):
    """rollout_func with a scripted generator: turn 1 answers wrong, turn 2 right. The completion is both
    answers with the evaluator's feedback between them; env_mask is 0 on exactly the feedback's tokens."""
    from types import SimpleNamespace

    from kb_gym.training import KernelMultiTurnRollout
    from kb_gym.training.rollout import _ids, _render

    _, tokenizer = tiny_lm
    relu = next(p for p in load_problems("builtin", size="cpu") if p.key == RELU)
    answers = iter([f"```python\n{WRONG_RELU}```", f"```python\n{SOLUTION}```"])

    def generate(contexts, images, fields, n):
        return [_ids(tokenizer, next(answers)) for _ in contexts], None

    trainer = SimpleNamespace(_generate_single_turn=generate, processing_class=tokenizer, max_completion_length=100_000)
    rollout = KernelMultiTurnRollout([relu], max_turns=2, episode="best", evaluator=reward_fn.evaluator)
    prompt = build_prompt_dataset([relu], one_shot=False)[0]["prompt"]
    out = rollout([prompt], trainer)
    statuses = out["kernel_turn_statuses"][0]
    assert statuses == ["incorrect", "correct"]
    first, second = (_ids(tokenizer, f"```python\n{code}```") for code in (WRONG_RELU, SOLUTION))
    ids, mask = out["completion_ids"][0], out["env_mask"][0]
    n_feedback = len(ids) - len(first) - len(second)
    assert n_feedback > 0 and mask == [1] * len(first) + [0] * n_feedback + [1] * len(second)
    assert ids[:len(first)] == first and ids[len(first) + n_feedback:] == second
    between = tokenizer.decode(ids[len(first):len(first) + n_feedback])
    # the template's user turn with the verdict, then the next assistant header: nothing of the model's
    conv = [*prompt, {"role": "assistant", "content": tokenizer.decode(first)}]
    assert between.startswith("user: Evaluation of your answer: incorrect.") and between.endswith("assistant: ")
    # and it is what the template itself renders after this very conversation (the suffix is made from a fixed one)
    feedback = {"role": "user", "content": between[len("user: "):-len("\nassistant: ")]}
    base = _render(tokenizer, conv, generation_prompt=False)
    assert between == _render(tokenizer, [*conv, feedback], generation_prompt=True)[len(base):]
    turn = out["kernel_turn_rewards"][0]
    assert out["kernel_episode_reward"][0] == max(turn) == turn[1] > turn[0]
    logged: dict[str, float] = {}
    scores = rollout.reward_function()(completions=["x"], log_metric=logged.__setitem__, **{
        k: v for k, v in out.items() if k.startswith("kernel_")})
    assert scores == out["kernel_episode_reward"] and logged["kernel_multi_turn/turns"] == 2
    assert logged["kernel_multi_turn/turn1/correct"] == 0.0 and logged["kernel_multi_turn/turn2/correct"] == 1.0
    for episode, expected in (("last", turn[1]), ("discounted", turn[0] + 0.4 * turn[1])):
        assert KernelMultiTurnRollout([relu], max_turns=2, episode=episode,
                                      evaluator=reward_fn.evaluator).episode_reward(turn) == pytest.approx(expected)
    # a rollout the budget ended after its first turn counts that turn's reward for the turn it did not get
    three = KernelMultiTurnRollout([relu], max_turns=3, episode="discounted", evaluator=reward_fn.evaluator)
    assert three.episode_reward(turn[:1]) == pytest.approx(turn[0] * (1 + 0.4 + 0.16))


def test_grpo_runs_two_steps_through_the_multi_turn_rollout(tiny_lm, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    from kb_gym.training import KernelMultiTurnRollout

    model, tokenizer = tiny_lm
    with Evaluator("cpu", config=SMALL, results_path=False) as ev:
        rollout = KernelMultiTurnRollout("builtin", max_turns=2, evaluator=ev, size="cpu")
        trainer = GRPOTrainer(model=model, args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False,
                                                           report_to=[], **{**GRPO_STEP, "max_steps": 2,
                                                                            "max_completion_length": 1200}),
                              train_dataset=build_prompt_dataset("builtin", level=1, one_shot=False, size="cpu"),
                              processing_class=tokenizer, rollout_func=rollout,
                              reward_funcs=[rollout.reward_function()])
        trainer.train()
    assert trainer.state.global_step == 2
    logged = trainer.state.log_history[0]
    assert logged["kernel_multi_turn/turns"] == 2.0 and "kernel_multi_turn/turn2/reward" in logged
    assert "rewards/kernel_multi_turn/mean" in logged


SLOW_COPY = '''
import time
import torch
class ModelNew(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        time.sleep(1.5)  # a slow build, as an nvcc compile is
    def forward(self, x):
        return torch.relu(x)
'''


def test_submit_kernel_calls_of_different_rollouts_overlap(tiny_lm, tmp_path):
    """TRL's tool loop calls one rollout's tools after another's; overlap_tool_calls submits every call of a
    turn to the Evaluator as soon as the turn is generated. Two rollouts, two workers: the two evaluations run
    at the same time. The policy is scripted: each rollout calls submit_kernel once, then stops."""
    import threading
    import time

    from trl import GRPOConfig, GRPOTrainer
    qwen3_chat_template = getattr(pytest.importorskip("trl.chat_template_utils"), "qwen3_chat_template", None)
    if qwen3_chat_template is None:
        pytest.skip("this TRL has no Qwen3 template to parse tool calls with")

    from kb_gym.training import KernelToolEnvFactory, overlap_tool_calls

    model, tokenizer = tiny_lm
    tokenizer.chat_template = qwen3_chat_template
    relu = next(p for p in load_problems("builtin", size="cpu") if p.key == RELU)
    call = "<tool_call>\n" + json.dumps({"name": "submit_kernel", "arguments": {"code": SLOW_COPY}}) + "\n</tool_call>"
    spans, lock = [], threading.Lock()

    with Evaluator("cpu", config=SMALL, results_path=False, workers_per_device=2) as ev:
        ev.warm()
        submit = ev.submit

        def recorded_submit(problem, text, **kw):
            started = time.perf_counter()
            future = submit(problem, text, **kw)
            future.add_done_callback(lambda _: spans.append((started, time.perf_counter())))
            return future

        ev.submit = recorded_submit
        ev.evaluate = lambda problem, text, **kw: recorded_submit(problem, text, **kw).result()
        factory = KernelToolEnvFactory([relu], evaluator=ev, size="cpu")
        trainer = GRPOTrainer(model=model, args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False,
                                                           report_to=[], **{**GRPO_STEP,
                                                                           "max_completion_length": 4096}),
                              train_dataset=build_prompt_dataset([relu], one_shot=False, tool_calls=2),
                              processing_class=tokenizer, environment_factory=factory,
                              reward_funcs=[factory.reward_function()])
        turns = []

        def scripted(prompt_ids, *args, **kwargs):  # the policy: a tool call first, then a last word
            text = call if not turns else "done"
            with lock:
                turns.append(len(prompt_ids))
            return [tokenizer.encode(text, add_special_tokens=False) for _ in prompt_ids], None

        trainer._generate_single_turn = scripted
        overlap_tool_calls(trainer)
        trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["kernel_tool/submissions"] == 1.0 and logged["kernel_tool/tool_use"] == 1.0, logged
    assert len(spans) == 2, spans
    (a0, a1), (b0, b1) = sorted(spans)
    assert b0 < a1 - 1.0, spans  # the second started well before the first ended: they ran side by side
