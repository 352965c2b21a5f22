"""The learning check's GRPO phase: our training path (``training/grpo.py``'s ``build_trainer``: TRL's
``GRPOTrainer`` with ``KernelRewardFunction``, the named reward preset and the ``rl`` eval preset) on the train
split, stopped and resumed by the time budget, with each step's time split into generation, evaluation and
update.

How each part of a step is measured (``grpo/steps.jsonl``, one line per optimizer step):

- ``wall_s``: the step, from the Trainer's ``on_step_begin`` to its ``on_step_end`` callback.
- ``generation_s``: the wall time of the trainer's ``_generate`` (tokenising the prompts and sampling every
  completion; TRL 1.16), timed by wrapping that method on this trainer object.
- ``evaluation_s``: the wall time of ``_calculate_rewards``, i.e. the kernel reward function: every completion
  submitted to the evaluator and waited for (``eval_seconds`` beside it is the reward function's own figure).
- ``update_s``: the rest, ``wall_s - generation_s - evaluation_s``: the loss's forward and backward passes and
  the optimizer step (and whatever small bookkeeping TRL does in between).

On one GPU the policy and the evaluator's kernels share ``cuda:0``; they never run at once (a step generates, then
evaluates, then updates). Identical programs are evaluated once per run (``dedup``): the verdict of the first is
reused for later copies, in this step or a later one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kb_gym.problems import Problem
from kb_gym.training.dedup import DedupEvaluator
from kb_gym.training.learning_check.common import (
    Deadline,
    Layout,
    LearningCheckConfig,
    PhaseResult,
    append_jsonl,
    budget_callback,
    fmt,
    read_json,
    read_jsonl,
    single_gpu,
    write_json,
)
from kb_gym.training.learning_check.eval import policy_for

KEPT_METRICS = ("reward", "reward_std", "loss", "learning_rate", "completions/mean_length",
                "completions/clipped_ratio", "frac_reward_zero_std", "entropy")


def step_recorder(trainer: Any, path: Any, dedup: DedupEvaluator | None, reward_name: str) -> Any:
    """Wrap the trainer's generation and reward calls with timers and return the callback that writes one line
    per optimizer step (timings, then the step's logged metrics) to ``path``."""
    from transformers import TrainerCallback

    times = {"generation_s": 0.0, "evaluation_s": 0.0}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times[name] += time.perf_counter() - began

        return wrapper

    trainer._generate = timed("generation_s", trainer._generate)
    trainer._calculate_rewards = timed("evaluation_s", trainer._calculate_rewards)

    class StepRecorder(TrainerCallback):
        def __init__(self) -> None:
            self.began = time.perf_counter()
            self.pending: dict[str, Any] | None = None
            self.hits = dedup.hits if dedup else 0
            self.misses = dedup.misses if dedup else 0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.began = time.perf_counter()
            times.update(generation_s=0.0, evaluation_s=0.0)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            wall = time.perf_counter() - self.began
            row = {"step": state.global_step, "wall_s": wall, **times,
                   "update_s": max(0.0, wall - times["generation_s"] - times["evaluation_s"])}
            if dedup is not None:
                row.update(dedup_hits=dedup.hits - self.hits, evaluated=dedup.misses - self.misses)
                self.hits, self.misses = dedup.hits, dedup.misses
            self.pending = row

        def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if self.pending is None or not logs or "reward" not in logs:
                return
            row = dict(self.pending)
            prefix = f"{reward_name}/"
            for key, value in logs.items():
                if key in KEPT_METRICS:
                    row[key] = value
                elif key.startswith(prefix):  # correct, fast_1, eval_seconds, status/..., flag/..., reward/...
                    row[key[len(prefix):]] = value
            append_jsonl(path, row)
            self.pending = None
            print(f"grpo step {row['step']}/{args.max_steps}: reward {row.get('reward', float('nan')):.3f}, correct "
                  f"{row.get('correct', float('nan')):.2f} | generation {row['generation_s']:.1f} s, evaluation "
                  f"{row['evaluation_s']:.1f} s, update {row['update_s']:.1f} s", flush=True)

    return StepRecorder()


def step_rows(path: Any) -> list[dict[str, Any]]:
    """The steps of ``steps.jsonl``, one per step number (the last line wins: a step redone after a resume from an
    earlier checkpoint replaces the lost one)."""
    by_step: dict[int, dict[str, Any]] = {}
    for row in read_jsonl(path):
        by_step[int(row["step"])] = row
    return [by_step[k] for k in sorted(by_step)]


def timing_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per part of a step: total seconds, median per step, and its share of the step time."""
    out: dict[str, Any] = {"steps": len(rows)}
    wall = sum(float(r.get("wall_s", 0.0)) for r in rows)
    for part in ("generation_s", "evaluation_s", "update_s", "wall_s"):
        values = [float(r.get(part, 0.0)) for r in rows]
        out[part] = {"total": sum(values), "median": statistics.median(values) if values else 0.0,
                     "share": sum(values) / wall if wall else 0.0}
    return out


def _summary_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    t = summary["timing"]

    def part(name: str) -> str:
        e = t[name]
        return f"median {fmt(e['median'], 1)} s/step, {fmt(e['total'], 0)} s in all ({e['share']:.0%})"

    rewards = summary.get("reward_by_step") or []
    first = statistics.fmean(rewards[:3]) if rewards else float("nan")
    last = statistics.fmean(rewards[-3:]) if rewards else float("nan")
    return [("model", f"{summary['start_model']} -> {summary['saved']}"),
            ("steps", f"{summary['steps']} of {summary['max_steps']} ({summary['finished_by']}), "
                      f"{summary['completions_per_step']} completions a step"),
            ("reward", f"first 3 steps {fmt(first)}, last 3 steps {fmt(last)}"),
            ("generation", part("generation_s")), ("evaluation", part("evaluation_s")),
            ("update", part("update_s")), ("step", part("wall_s")),
            ("evaluated", f"{summary.get('evaluated', '-')} programs, {summary.get('dedup_hits', '-')} duplicates "
                          "given an earlier verdict")]


def grpo_fields(cfg: LearningCheckConfig, layout: Layout) -> dict[str, Any]:
    """The GRPOConfig fields: a constant learning rate (a run stopped by its time budget ends mid-schedule
    otherwise), one log line and one generation per step, a checkpoint every ``save_steps``."""
    return {"output_dir": str(layout.grpo_trainer), "max_steps": cfg.grpo_steps,
            "per_device_train_batch_size": cfg.grpo_batch_size, "num_generations": cfg.num_generations,
            "max_completion_length": cfg.max_completion_length, "learning_rate": cfg.grpo_lr,
            "lr_scheduler_type": "constant", "logging_steps": 1, "save_strategy": "steps",
            "save_steps": cfg.save_steps, "save_total_limit": 1, "temperature": cfg.temperature, "seed": cfg.seed,
            "disable_tqdm": True, **cfg.grpo}


def run_grpo(cfg: LearningCheckConfig, layout: Layout, deadline: Deadline, problems: Sequence[Problem]
             ) -> PhaseResult:
    """GRPO from the supervised (or pretrained) policy until ``grpo_steps`` or ``grpo_minutes`` (over all calls);
    a call's deadline stops it with a checkpoint that the next call resumes."""
    started = time.monotonic()
    done = read_json(layout.done_file("grpo"))
    if done:
        return PhaseResult("grpo", "skipped", _summary_rows(done))
    from transformers import AutoTokenizer, PrinterCallback
    from transformers.trainer_utils import get_last_checkpoint

    from kb_gym.training.grpo import GRPOKernelConfig, build_trainer, check_config

    start_model = policy_for(cfg, layout, "before")
    state_path = layout.grpo / "state.json"
    state = read_json(state_path, {"seconds": 0.0})
    phase_left = cfg.grpo_minutes * 60.0 - float(state["seconds"])
    out = layout.grpo_trainer
    finished_model = (out / "config.json").exists() or (out / "adapter_config.json").exists()
    checkpoint = get_last_checkpoint(str(out)) if out.is_dir() else None
    reason = "a finished model in the folder"
    if not finished_model and phase_left <= 0 and checkpoint is not None:
        # the phase's budget was spent in earlier calls: its last checkpoint is the trained model
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(checkpoint).save_pretrained(str(out))
        AutoTokenizer.from_pretrained(checkpoint).save_pretrained(str(out))
        finished_model, reason = True, "the grpo_minutes budget"
    if not finished_model:
        kcfg = GRPOKernelConfig(
            model=start_model, dataset=list(problems), size=cfg.size, backend=cfg.backend, one_shot=cfg.one_shot,
            reward=cfg.reward, eval_devices=cfg.eval_devices, evaluator=cfg.evaluator,
            workers_per_device=cfg.workers_per_device, eval_preset=cfg.eval_preset, eval_config=dict(cfg.eval_config),
            results_path=str(layout.grpo / "results.jsonl"), resume="latest" if checkpoint else None,
            grpo=grpo_fields(cfg, layout))
        check_config(kcfg)
        if deadline.expired(120.0):  # loading, the evaluator's start and a first step
            return PhaseResult("grpo", "stopped", [("next", "too little time left in this call to start GRPO; "
                                                             "run the same command again")])
        tokenizer = AutoTokenizer.from_pretrained(start_model)
        trainer, reward_fn = build_trainer(kcfg, processing_class=tokenizer)
        dedup = None
        if cfg.dedup:
            dedup = reward_fn.evaluator = DedupEvaluator(reward_fn.evaluator)

        def add_seconds(seconds: float) -> None:
            state["seconds"] = float(state["seconds"]) + seconds
            write_json(state_path, state)

        budget = budget_callback(deadline, phase_left, on_step=add_seconds)
        trainer.add_callback(step_recorder(trainer, layout.grpo_steps, dedup, reward_fn.__name__))
        trainer.add_callback(budget)
        trainer.remove_callback(PrinterCallback)  # one line a step from the recorder instead of every log dict
        single_gpu(trainer.args)
        try:
            trainer.train(resume_from_checkpoint=checkpoint)
        finally:
            reward_fn.close()
        if trainer.state.global_step < cfg.grpo_steps and budget.stop_reason != "phase":
            return PhaseResult("grpo", "stopped", [("steps", f"{trainer.state.global_step} of {cfg.grpo_steps}"),
                                                   ("next", "run the same command again: it resumes from the "
                                                            "checkpoint")], time.monotonic() - started)
        reason = "all steps" if trainer.state.global_step >= cfg.grpo_steps else "the grpo_minutes budget"
        trainer.save_model()
    rows = step_rows(layout.grpo_steps)
    summary = {"start_model": start_model, "saved": str(out), "steps": rows[-1]["step"] if rows else 0,
               "max_steps": cfg.grpo_steps, "finished_by": reason,
               "completions_per_step": cfg.grpo_batch_size, "num_generations": cfg.num_generations,
               "timing": timing_summary(rows), "reward_by_step": [r.get("reward") for r in rows],
               "evaluated": sum(int(r.get("evaluated", 0)) for r in rows),
               "dedup_hits": sum(int(r.get("dedup_hits", 0)) for r in rows), "grpo_config": grpo_fields(cfg, layout)}
    write_json(layout.done_file("grpo"), summary)
    return PhaseResult("grpo", "done", _summary_rows(summary), time.monotonic() - started)
