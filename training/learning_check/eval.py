"""The learning check's before/after evaluations: ``samples`` answers per held-out (test) problem and, for the
in-distribution reading, ``train_samples`` fresh answers per train problem (the problems GRPO trained on), generated
and then evaluated, in ``evaluate-model``'s files and format, inside this call's time budget.

Why not one ``evaluate_model`` call: it cannot stop part-way through its evaluations, and a GPU-size batch of
hundreds of answers takes longer than one 10-minute call. So this phase generates batch by batch and evaluates
answer by answer with a deadline, writing ``completions.jsonl`` and ``results.jsonl`` exactly as
``evaluate_model`` does (same fields, same model name); once every answer has its result, ``evaluate_model``
runs over the finished folder (nothing left to generate or evaluate) and writes its summaries, per-problem table
and fast_p plot. As there, every answer is generated before any is evaluated, so the policy never runs on the
GPU beside a timed kernel.

Answers whose extracted program is identical (same problem, same code) are evaluated once and the verdict is
recorded for each of them with ``duplicate_of`` (``dedup``, on by default): a small policy repeats itself, and
re-timing the same program buys only timing noise.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any

from kb_gym.config import CONFIG_PRESETS, config_preset
from kb_gym.problems import Problem
from kb_gym.prompts import build_messages
from kb_gym.result import EvalResult
from kb_gym.store import ResultsStore
from kb_gym.training.dedup import program_key
from kb_gym.training.learning_check.common import (
    Deadline,
    Layout,
    LearningCheckConfig,
    PhaseResult,
    fmt,
    read_json,
    read_jsonl,
    write_json,
)
from kb_gym.training.learning_check.stats import summarize_samples

GenerateFn = Callable[[list[list[dict[str, str]]]], list[str]]
STOP_MARGIN_S = 20.0
FIRST_MARGIN_S = 60.0  # before the first batch or evaluation of a call, whose cost (and start-up) is unknown


def policy_for(cfg: LearningCheckConfig, layout: Layout, which: str) -> str:
    """The model each evaluation is of: before GRPO, the supervised model (or the pretrained one); after, GRPO's."""
    if which == "after":
        return str(layout.grpo_trainer)
    return str(layout.sft_model) if cfg.uses_sft else str(cfg.model)


def eval_config_fields(cfg: LearningCheckConfig) -> dict[str, Any]:
    return {**CONFIG_PRESETS[cfg.eval_preset], **cfg.eval_config}


def _rows_of(path: Path, model: str) -> list[dict[str, Any]]:
    rows = [r for r in read_jsonl(path) if "problem_key" in r]
    other = {r.get("model") for r in rows} - {model}
    if other:
        raise ValueError(f"{path} holds rows of model {sorted(map(str, other))}, not {model!r}: this output folder "
                         "belongs to another run (use another --out)")
    return rows


def _generate_missing(jobs: Sequence[tuple[Problem, int]], answers: dict[tuple[str, int], str], model: str,
                      cfg: LearningCheckConfig, path: Path, deadline: Deadline, generate: GenerateFn | None
                      ) -> tuple[bool, float]:
    """Generate what ``answers`` lacks, batch by batch, each batch on disk as it is made; stop before a batch
    that would overrun the deadline. Returns (all generated, seconds spent generating)."""
    todo = [(p, k) for p, k in jobs if (p.key, k) not in answers]
    spent = 0.0
    if not todo:
        return True, spent
    loaded = None
    if generate is None:
        from kb_gym.training.evaluate_model import ModelEvalConfig, hf_generate_fn, load_hf_model

        loaded = load_hf_model(model)
        generate = hf_generate_fn(*loaded, ModelEvalConfig(model=model, temperature=cfg.temperature,
                                                           max_new_tokens=cfg.max_new_tokens))
    slowest = 0.0
    try:
        for start in range(0, len(todo), max(1, cfg.gen_batch_size)):
            if deadline.left() < (1.2 * slowest + STOP_MARGIN_S if slowest else FIRST_MARGIN_S):
                return False, spent
            batch = todo[start:start + cfg.gen_batch_size]
            began = time.monotonic()
            texts = generate([build_messages(p.code, backend=cfg.backend, one_shot=cfg.one_shot) for p, _ in batch])
            took = time.monotonic() - began
            spent += took
            slowest = max(slowest, took)
            with open(path, "a", encoding="utf-8") as fh:
                for (p, k), text in zip(batch, texts, strict=True):
                    fh.write(json.dumps({"model": model, "problem_key": p.key, "sample": k, "completion": text}) + "\n")
                    answers[(p.key, k)] = text
                fh.flush()
                os.fsync(fh.fileno())
    finally:
        if loaded is not None:  # the GPU is the evaluator's from here on
            del loaded
            gc.collect()
            _empty_cuda_cache()
    return True, spent


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _open_evaluator(cfg: LearningCheckConfig) -> tuple[Any, int]:
    """(evaluator, how many evaluations it runs at once)."""
    from kb_gym.evaluator import Evaluator
    from kb_gym.service import evaluator_address

    config = config_preset(cfg.eval_preset, **cfg.eval_config)
    if evaluator_address(cfg.evaluator) is not None:
        from kb_gym.service import connect

        return connect(cfg.evaluator, config=config), 2
    ev = Evaluator(cfg.eval_devices, config=config, results_path=False, workers_per_device=cfg.workers_per_device)
    return ev, len(ev.devices) * cfg.workers_per_device


def _evaluate_missing(jobs: Sequence[tuple[Problem, int]], answers: dict[tuple[str, int], str], model: str,
                      cfg: LearningCheckConfig, path: Path, deadline: Deadline, evaluator: Any = None
                      ) -> tuple[bool, dict[str, Any]]:
    """Evaluate every generated answer without a result, a few at a time so a deadline can stop cleanly
    between them; identical programs once (``cfg.dedup``). Returns (all evaluated, counts and seconds)."""
    rows = _rows_of(path, model)
    have = {(r["problem_key"], int(r.get("sample", 0))) for r in rows}
    known = {}  # code key -> (sample, result) already on disk, for duplicates across calls
    # keyed under the source limit the evaluations run with (round 30: a padded copy over a config's own limit was
    # the plain program's duplicate, and the honest sample recorded with the padded one's format_error)
    limit = config_preset(cfg.eval_preset, **cfg.eval_config).max_source_chars
    if cfg.dedup:
        for r in rows:
            text = answers.get((r["problem_key"], int(r.get("sample", 0))))
            if text is not None and "duplicate_of" not in r:
                known.setdefault(program_key(r["problem_key"], text, limit), (int(r.get("sample", 0)), r))
    left = [(p, k) for p, k in jobs if (p.key, k) not in have and (p.key, k) in answers]
    groups: dict[str, list[tuple[Problem, int]]] = {}
    for p, k in left:
        key = program_key(p.key, answers[(p.key, k)], limit) if cfg.dedup else f"{p.key}:{k}"
        groups.setdefault(key, []).append((p, k))
    stats = {"evaluated": 0, "duplicates": 0, "eval_seconds": 0.0, "slowest_s": 0.0}
    if not groups:
        return True, stats
    store = ResultsStore(path)

    def record(members: list[tuple[Problem, int]], result: EvalResult, seconds: float | None,
               original: int | None) -> None:
        for i, (p, k) in enumerate(members):
            extra: dict[str, Any] = {"model": model, "problem_key": p.key, "sample": k}
            source = original if original is not None else (members[0][1] if i else None)
            if source is not None:
                extra["duplicate_of"] = source
                stats["duplicates"] += 1
            elif seconds is not None:
                extra["eval_seconds"] = round(seconds, 3)
            store.append(result, extra=extra)

    todo = deque()
    for key, members in groups.items():
        if key in known:  # this program was evaluated in an earlier call
            sample, row = known[key]
            record(members, EvalResult.from_dict(row), None, sample)
        else:
            todo.append(members)
    own = evaluator is None
    if own and todo:
        evaluator, parallel = _open_evaluator(cfg)
    else:
        parallel = 2
    inflight: dict[Future, tuple[list[tuple[Problem, int]], float]] = {}
    began_all = last_done = time.monotonic()
    try:
        while todo or inflight:
            while todo and len(inflight) < 2 * parallel and deadline.left() > (
                    STOP_MARGIN_S + stats["slowest_s"] * (len(inflight) + 1) / parallel if stats["slowest_s"]
                    else FIRST_MARGIN_S):
                members = todo.popleft()
                p, k = members[0]
                inflight[evaluator.submit(p, answers[(p.key, k)])] = (members, time.monotonic())
            if not inflight:
                break  # out of time with nothing running: stop here
            finished, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            for future in finished:
                members, began = inflight.pop(future)
                now = time.monotonic()
                seconds = now - max(began, last_done)  # its own time, not the queue's before it (one worker)
                last_done = now
                stats["evaluated"] += 1
                stats["slowest_s"] = max(stats["slowest_s"], seconds)
                record(members, future.result(), seconds, None)
    finally:
        stats["eval_seconds"] = time.monotonic() - began_all  # the wall of this call's evaluations
        if own and evaluator is not None:
            evaluator.close()
    return not todo, stats


def _summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    m = summary["metrics"]

    def rate(name: str) -> str:
        e = m[name]
        lo, hi = e["wilson"]
        plo, phi = e["problem_bootstrap"]
        return (f"{fmt(e['value'])} ({e['k']}/{m['samples']}; Wilson [{fmt(lo)}, {fmt(hi)}], "
                f"problems [{fmt(plo)}, {fmt(phi)}])")

    r = m["mean_reward"]
    return [("model", summary["model"]),
            ("samples", f"{m['samples']} ({m['problems']} {summary.get('split', 'test')} problems x "
                        f"{summary['samples_per_problem']})"),
            ("fast_0", rate("fast_0")), ("fast_1", rate("fast_1")), ("credited", rate("credited")),
            ("mean reward", f"{fmt(r['value'])} (bootstrap [{fmt(r['bootstrap'][0])}, {fmt(r['bootstrap'][1])}], "
                            f"problems [{fmt(r['problem_bootstrap'][0])}, {fmt(r['problem_bootstrap'][1])}])"),
            ("statuses", ", ".join(f"{k} {v}" for k, v in m["statuses"].items())),
            ("evaluations", f"{summary['evaluations']} distinct programs evaluated, {summary['duplicates']} "
                            "duplicates given their verdict")]


def run_eval(cfg: LearningCheckConfig, layout: Layout, deadline: Deadline, which: str, problems: Sequence[Problem],
             *, split: str = "test", generate: GenerateFn | None = None, evaluator: Any = None) -> PhaseResult:
    """Evaluate the policy ``which`` (``"before"`` or ``"after"`` GRPO) on ``problems`` of ``split`` (``"test"``:
    ``cfg.samples`` answers each; ``"train"``: ``cfg.train_samples``); resumable, and stopped cleanly by
    ``deadline``. ``generate`` replaces the model (tests; an API model)."""
    from kb_gym.rewards import get_reward
    from kb_gym.training.evaluate_model import ModelEvalConfig, evaluate_model

    if split not in ("test", "train"):
        raise ValueError(f"split must be 'test' or 'train', not {split!r}")
    phase = f"eval-{which}" + ("-train" if split == "train" else "")
    samples = cfg.samples if split == "test" else cfg.train_samples
    started = time.monotonic()
    out = layout.phase_dir(phase)
    done = read_json(layout.done_file(phase))
    if done:
        return PhaseResult(phase, "skipped", _summary_rows(done))
    model = policy_for(cfg, layout, which)
    if generate is None and (which == "after" or cfg.uses_sft) and not Path(model).exists():
        raise RuntimeError(f"no model at {model}: run the phase before {phase} first")
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(p, k) for p in problems for k in range(samples)]
    completions, results = out / "completions.jsonl", out / "results.jsonl"
    answers = {(r["problem_key"], int(r.get("sample", 0))): r["completion"] for r in _rows_of(completions, model)}
    generated, gen_seconds = _generate_missing(jobs, answers, model, cfg, completions, deadline, generate)
    progress = read_json(out / "progress.json", {"generation_seconds": 0.0, "evaluations": 0, "duplicates": 0,
                                                 "evaluation_seconds": 0.0})
    progress["generation_seconds"] += gen_seconds
    all_evaluated, stats = _evaluate_missing(jobs, answers, model, cfg, results, deadline, evaluator)
    progress["evaluations"] += stats["evaluated"]
    progress["duplicates"] += stats["duplicates"]
    progress["evaluation_seconds"] += stats["eval_seconds"]
    write_json(out / "progress.json", progress)
    n_done = len({(r["problem_key"], int(r.get("sample", 0))) for r in _rows_of(results, model)})
    if not (generated and all_evaluated) or n_done < len(jobs):
        return PhaseResult(phase, "stopped", [("generated", f"{len(answers)} of {len(jobs)}"),
                                              ("evaluated", f"{n_done} of {len(jobs)}"),
                                              ("next", "run the same command again: it carries on from here")],
                           time.monotonic() - started)
    mcfg = ModelEvalConfig(model=model, dataset=list(problems), samples=samples, temperature=cfg.temperature,
                           max_new_tokens=cfg.max_new_tokens, backend=cfg.backend, one_shot=cfg.one_shot,
                           eval_devices=cfg.eval_devices, eval_config=eval_config_fields(cfg), out_dir=str(out))

    def nothing_left(batch: list[list[dict[str, str]]]) -> list[str]:
        raise RuntimeError("evaluate_model found answers missing after the learning check generated them all")

    evaluate_model(mcfg, generate=nothing_left)  # summary.json, summary.csv, per_problem.csv, fast_p.png
    reward = get_reward(cfg.reward)
    rows = _rows_of(results, model)
    summary = {"model": model, "split": split, "samples_per_problem": samples, "temperature": cfg.temperature,
               "eval_config": eval_config_fields(cfg), "evaluations": progress["evaluations"],
               "duplicates": progress["duplicates"], "generation_seconds": progress["generation_seconds"],
               "evaluation_seconds": progress["evaluation_seconds"],
               "metrics": summarize_samples(rows, lambda r: float(reward(r)[0]), seed=cfg.seed)}
    write_json(layout.done_file(phase), summary)
    return PhaseResult(phase, "done", _summary_rows(summary), time.monotonic() - started)
