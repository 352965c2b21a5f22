"""The learning check (issue 14): does GRPO against our real evaluator make a policy better, on the problems it
trained on and on problems it never saw?

A small causal LM built from a config (no pretrained weights: the GPU machine has no internet) is supervised on
a corpus of correct, slow and broken answers to the train split of our GPU-size problems, evaluated on the test
split (``samples`` answers per problem) and on the train split (``train_samples`` fresh answers per problem: the
in-distribution reading, where a small model can answer at all), trained with GRPO and the default reward against
the evaluator on the train split, and evaluated again on both. ``--model NAME_OR_PATH`` runs the same
evaluations and GRPO on a pretrained model instead (a Qwen2.5-Coder checkpoint, for users with internet);
``--sft-pretrained`` also supervises it on the corpus first.

Phases, each in its own folder under ``--out`` and each resumable: ``corpus`` (answers and, for our own model,
the tokenizer), ``sft``, ``eval-before``, ``eval-before-train``, ``grpo``, ``eval-after``, ``eval-after-train``,
``report``. ``--max-minutes`` is this call's budget: a phase that cannot finish stops cleanly with its work on
disk, and the same command carries on from there. Exit code 0: every asked-for phase is finished; 3: stopped by
the budget (run it again); 2: bad options.

    python scripts/learning_check.py --phase all --max-minutes 8.5      # again until it says "all phases done"
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

from kb_gym.config import parse_key_values
from kb_gym.problems import Problem, load_problems
from kb_gym.training.learning_check.common import (
    DEFAULT_OUT,
    EVAL_PHASES,
    PHASES,
    Deadline,
    Layout,
    LearningCheckConfig,
    PhaseResult,
    check_same_config,
    config_to_dict,
    format_table,
    read_json,
    write_json,
)
from kb_gym.training.learning_check.corpus import (
    build_corpus,
    corpus_stats,
    parse_mix,
    solution_for,
    write_corpus,
)


def split_problems(cfg: LearningCheckConfig, split: str) -> list[Problem]:
    """The problems of ``split`` at ``cfg.size`` (the first ``train_limit`` / ``test_limit`` of them, in
    (level, id) order, when set)."""
    problems = load_problems(cfg.dataset, size=cfg.size, split=split, device=cfg.eval_devices)
    limit = cfg.train_limit if split == "train" else cfg.test_limit
    return problems[:limit] if limit is not None else problems


GRPO_PROBLEMS = ("all", "kernels")


def trained_problems(cfg: LearningCheckConfig) -> list[Problem]:
    """The train problems GRPO trains on and the in-distribution evaluation reads (``cfg.grpo_problems``)."""
    if cfg.grpo_problems not in GRPO_PROBLEMS:
        raise ValueError(f"grpo_problems must be one of {', '.join(GRPO_PROBLEMS)}, not {cfg.grpo_problems!r}")
    problems = split_problems(cfg, "train")
    if cfg.grpo_problems == "kernels":
        problems = [p for p in problems if solution_for(p, cfg.backend) is not None]
        if not problems:
            raise ValueError(f"no train problem has a {cfg.backend} solution: --grpo-problems kernels has nothing")
    return problems


def run_corpus(cfg: LearningCheckConfig, layout: Layout) -> PhaseResult:
    """The corpus of answers for the train split and, for our own model, the tokenizer fitted to it."""
    done = read_json(layout.done_file("corpus"))
    if done:
        return PhaseResult("corpus", "skipped", _corpus_rows(done))
    if not cfg.uses_sft:
        return PhaseResult("corpus", "not used", [("why", f"--model {cfg.model} without --sft-pretrained")])
    started = time.monotonic()
    problems = split_problems(cfg, "train")
    rows = build_corpus(problems, per_problem=cfg.per_problem, mix=parse_mix(cfg.mix), seed=cfg.seed,
                        backend=cfg.backend, one_shot=cfg.one_shot)
    write_corpus(rows, layout.corpus_file)
    summary: dict[str, Any] = {"corpus": str(layout.corpus_file), **corpus_stats([r.to_dict() for r in rows])}
    if cfg.own_model:
        from kb_gym.training.learning_check.model import save_tokenizer, train_tokenizer

        texts = sorted({m["content"] for r in rows for m in r.prompt} | {r.completion for r in rows})
        tokenizer = train_tokenizer(texts, cfg.vocab_size)
        save_tokenizer(tokenizer, layout.tokenizer)
        summary.update(tokenizer=str(layout.tokenizer), vocab=len(tokenizer), **_token_lengths(
            [r.to_dict() for r in rows], tokenizer))
    write_json(layout.done_file("corpus"), summary)
    return PhaseResult("corpus", "done", _corpus_rows(summary), time.monotonic() - started)


def _token_lengths(rows: Sequence[dict[str, Any]], tokenizer: Any) -> dict[str, int]:
    prompts = {json.dumps(r["prompt"]): r["prompt"] for r in rows}
    p = [len(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False)) for m in prompts.values()]
    p_tok = [len(tokenizer(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False),
                           add_special_tokens=False)["input_ids"]) for m in prompts.values()]
    c_tok = [len(tokenizer(r["completion"], add_special_tokens=False)["input_ids"]) for r in rows]
    return {"prompt_tokens_max": max(p_tok), "prompt_chars_per_token": round(sum(p) / max(1, sum(p_tok)), 2),
            "completion_tokens_max": max(c_tok)}


def _corpus_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("rows", f"{summary['rows']} ({summary['problems']} train problems; {summary['distinct_answers']} "
                     "distinct answers)"),
            ("kinds", ", ".join(f"{k} {v}" for k, v in summary["kinds"].items())),
            ("variants", ", ".join(f"{k} {v}" for k, v in summary["variants"].items())),
            ("written", summary["corpus"])]
    if "tokenizer" in summary:
        rows.append(("tokenizer", f"{summary['vocab']} tokens at {summary['tokenizer']}; prompts up to "
                                  f"{summary['prompt_tokens_max']} tokens ({summary['prompt_chars_per_token']} "
                                  f"characters a token), answers up to {summary['completion_tokens_max']}"))
    return rows


def run_phase(phase: str, cfg: LearningCheckConfig, layout: Layout, deadline: Deadline) -> PhaseResult:
    if phase == "corpus":
        return run_corpus(cfg, layout)
    if phase == "sft":
        if not cfg.uses_sft:
            return PhaseResult("sft", "not used", [("why", f"--model {cfg.model} without --sft-pretrained")])
        from kb_gym.training.learning_check.sft import run_sft

        return run_sft(cfg, layout, deadline)
    if phase in EVAL_PHASES:
        from kb_gym.training.learning_check.eval import run_eval

        which, split = EVAL_PHASES[phase]
        if split == "train" and cfg.train_samples <= 0:
            return PhaseResult(phase, "not used", [("why", "--train-samples 0")])
        if split == "test" and cfg.samples <= 0:  # a run for the in-distribution reading alone
            return PhaseResult(phase, "not used", [("why", "--samples 0")])
        problems = trained_problems(cfg) if split == "train" else split_problems(cfg, split)
        return run_eval(cfg, layout, deadline, which, problems, split=split)
    if phase == "grpo":
        from kb_gym.training.learning_check.grpo import run_grpo

        return run_grpo(cfg, layout, deadline, trained_problems(cfg))
    if phase == "report":
        from kb_gym.training.learning_check.report import run_report

        return run_report(cfg, layout)
    raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}, all")


def run(cfg: LearningCheckConfig, phases: Sequence[str], *, out: Any = None) -> list[PhaseResult]:
    """Run ``phases`` in order within ``cfg.max_minutes``, printing each one's table to ``out`` (stdout);
    stops at the first phase left unfinished. The folder's saved options must match (else ValueError)."""
    out = out or sys.stdout
    layout = Layout(cfg.out)
    changed = check_same_config(read_json(layout.config), cfg)
    if changed:
        raise ValueError(f"{layout.root} was started with other options ({', '.join(changed)} differ; see "
                         f"{layout.config}): use those options again, or another --out")
    if not layout.config.exists():
        write_json(layout.config, config_to_dict(cfg))
    deadline = Deadline(cfg.max_minutes)
    results = []
    for phase in phases:
        began = time.monotonic()
        result = run_phase(phase, cfg, layout, deadline)
        result.seconds = result.seconds or time.monotonic() - began
        results.append(result)
        print(format_table(f"== {phase}: {result.status} ({result.seconds:.0f} s)", result.rows), file=out,
              flush=True)
        if not result.finished:
            print(f"stopped in {phase} after {deadline.elapsed() / 60:.1f} min of this call's {cfg.max_minutes:g}: "
                  "run the same command again to carry on", file=out, flush=True)
            break
    else:
        print(f"all phases done ({', '.join(phases)}) in {deadline.elapsed() / 60:.1f} min", file=out, flush=True)
    return results


def build_parser() -> argparse.ArgumentParser:
    d = LearningCheckConfig()
    p = argparse.ArgumentParser(prog="learning_check", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--phase", default="all", help=f"comma-separated phases to run, in order: {', '.join(PHASES)}; "
                                                  "or all")
    p.add_argument("--out", default=DEFAULT_OUT, help="output folder (every phase's files; resumable)")
    p.add_argument("--max-minutes", type=float, default=d.max_minutes, help="this call's time budget")
    g = p.add_argument_group("policy")
    g.add_argument("--model", default=None, help="a pretrained Hugging Face model id or folder (default: build our "
                                                 "own from a config and supervise it)")
    g.add_argument("--sft-pretrained", action="store_true", help="with --model: supervise it on the corpus first")
    g.add_argument("--model-size", default=d.model_size, choices=("tiny", "small", "medium", "base"),
                   help="our own model: tiny (tests), small ~28M, medium ~54M, base ~89M parameters")
    g.add_argument("--vocab-size", type=int, default=d.vocab_size, help="our tokenizer's BPE vocabulary (at most)")
    g = p.add_argument_group("problems")
    g.add_argument("--dataset", default=d.dataset, help="problems with train/test splits (builtin)")
    g.add_argument("--size", default=d.size, choices=("cpu", "gpu"), help="problem size")
    g.add_argument("--train-limit", type=int, default=None, help="only the first N train problems")
    g.add_argument("--test-limit", type=int, default=None, help="only the first N test problems")
    g.add_argument("--backend", default=d.backend, help="prompt backend: triton or cuda")
    g.add_argument("--one-shot", action="store_true", help="include the worked example in prompts (longer)")
    g = p.add_argument_group("corpus and supervision")
    g.add_argument("--per-problem", type=int, default=d.per_problem, help="answers per train problem")
    g.add_argument("--mix", default=d.mix, help="shares of correct, slow and broken answers")
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--sft-epochs", type=float, default=d.sft_epochs)
    g.add_argument("--sft-minutes", type=float, default=d.sft_minutes, help="SFT's budget over all calls")
    g.add_argument("--sft-lr", type=float, default=d.sft_lr)
    g.add_argument("--sft-batch-size", type=int, default=d.sft_batch_size)
    g.add_argument("--max-length", type=int, default=d.max_length, help="longest supervised example, tokens")
    g = p.add_argument_group("before/after evaluation")
    g.add_argument("--samples", type=int, default=d.samples,
                   help="answers per test problem (0: skip the held-out reading)")
    g.add_argument("--train-samples", type=int, default=d.train_samples,
                   help="fresh answers per train problem, for the in-distribution reading (0: skip it)")
    g.add_argument("--temperature", type=float, default=d.temperature, help="sampling temperature (GRPO's too)")
    g.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    g.add_argument("--gen-batch-size", type=int, default=d.gen_batch_size, help="prompts per generate call")
    g = p.add_argument_group("GRPO")
    g.add_argument("--grpo-steps", type=int, default=d.grpo_steps)
    g.add_argument("--grpo-minutes", type=float, default=d.grpo_minutes, help="GRPO's budget over all calls")
    g.add_argument("--grpo-batch-size", type=int, default=d.grpo_batch_size, help="completions per step")
    g.add_argument("--num-generations", type=int, default=d.num_generations, help="completions per prompt")
    g.add_argument("--grpo-problems", default=d.grpo_problems, choices=GRPO_PROBLEMS,
                   help="train problems to train on (and read in distribution): all, or kernels (those whose "
                        "corpus answer is one of our kernels)")
    g.add_argument("--grpo-lr", type=float, default=d.grpo_lr)
    g.add_argument("--max-completion-length", type=int, default=d.max_completion_length)
    g.add_argument("--save-steps", type=int, default=d.save_steps, help="a checkpoint every N steps")
    g.add_argument("--grpo", action="append", default=[], metavar="KEY=VALUE", help="any other GRPOConfig field")
    g.add_argument("--reward", default=d.reward, help="reward preset of GRPO and of the reported mean reward")
    g = p.add_argument_group("evaluator")
    g.add_argument("--eval-devices", default=d.eval_devices, help="the evaluator's devices (auto, cpu, cuda:1, ...)")
    g.add_argument("--evaluator", default=d.evaluator, help="local, or the Ray service: ray, ray://HOST:10001")
    g.add_argument("--workers-per-device", type=int, default=d.workers_per_device)
    g.add_argument("--eval-preset", default=d.eval_preset, choices=("rl", "default"))
    g.add_argument("--eval", action="append", default=[], metavar="KEY=VALUE", help="an EvalConfig field")
    g.add_argument("--no-dedup", action="store_true", help="evaluate identical programs again each time")
    return p


def config_from_args(args: argparse.Namespace) -> LearningCheckConfig:
    fields = {f.name for f in dataclasses.fields(LearningCheckConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields and k not in ("grpo", "eval_config")}
    return LearningCheckConfig(**values, grpo=parse_key_values(args.grpo, "--grpo"),
                               eval_config=parse_key_values(args.eval, "--eval"), dedup=not args.no_dedup)


def parse_phases(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if names == ["all"]:
        return list(PHASES)
    unknown = [n for n in names if n not in PHASES]
    if unknown or not names:
        raise ValueError(f"unknown phase(s) {unknown}: use {', '.join(PHASES)} or all")
    return sorted(names, key=PHASES.index)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
        phases = parse_phases(args.phase)
        parse_mix(cfg.mix)
        from kb_gym.training.config_check import check_eval_config

        check_eval_config({**_preset(cfg.eval_preset), **cfg.eval_config}, "--eval")
    except ValueError as exc:
        print(f"learning_check: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renames, once per trainer: noise here
    _quiet_transformers()
    # baselines timed once are reused by every later phase and call (the rl preset's cache)
    # (absolute: the evaluator's workers run in another folder)
    os.environ.setdefault("KB_GYM_CACHE", os.path.abspath(os.path.join(cfg.out, "kb_gym_cache")))
    if cfg.own_model:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        results = run(cfg, phases)
    except ValueError as exc:
        print(f"learning_check: {exc}", file=sys.stderr)
        return 2
    return 0 if all(r.finished for r in results) and len(results) == len(phases) else 3


def _quiet_transformers() -> None:
    """No weight-loading progress bars in a log that is read from its last lines."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def _preset(name: str) -> dict[str, Any]:
    from kb_gym.config import CONFIG_PRESETS

    return dict(CONFIG_PRESETS[name])


if __name__ == "__main__":
    sys.exit(main())
