"""Evaluate a checkpoint: generate answers with it, evaluate them, write the fast_p table
(``kb-gym evaluate-model``).

Outputs in ``out_dir``: ``completions.jsonl`` (every answer, written as each batch is generated),
``results.jsonl`` (every EvalResult with its problem key and sample index, written as each lands), ``summary.json``
and ``summary.csv`` (per level and over all: correct rate, fast_p for p = 0, 0.5, 0.8, 1, 1.5, 2,
geometric-mean speedup, best-of-k), ``per_problem.csv`` (samples, correct, fast and the best sample per
problem) and ``fast_p.png``. Run again into the same folder (after a crash or a
preemption), it generates and evaluates only what is missing: with the same settings (``run.json``; another
model, dataset, size, generation or evaluation setting is refused: one folder, one run), and never while another
run writes there (the folder is locked). The summaries count each (problem, sample) of this run once.
"""

from __future__ import annotations

import csv
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kb_gym.config import EvalConfig
from kb_gym.evaluator import Evaluator
from kb_gym.metrics import DEFAULT_PS, load_results, summarize
from kb_gym.problems import Problem, load_problems
from kb_gym.prompts import DEFAULT_BACKEND, build_messages
from kb_gym.report import plot_fast_p
from kb_gym.store import ResultsStore, append_lines
from kb_gym.training.errors import ModelLoadError

GenerateFn = Callable[[list[list[dict[str, str]]]], list[str]]


@dataclass
class ModelEvalConfig:
    """What ``kb-gym evaluate-model`` runs.

    Args:
        model: a Hugging Face model id or local path (a causal LM with a chat template).
        dataset, level: the problems (anything ``load_problems`` takes).
        size: the problems' size (``"auto"``: GPU size when ``eval_devices`` are all GPUs, else CPU size).
        samples: answers per problem (fast_p uses all of them; ``best_of`` keeps each problem's best).
        temperature: 0 is greedy (then ``samples`` > 1 repeats the same answer); > 0 samples.
        max_new_tokens, batch_size: generation limits (prompts per ``generate`` call).
        eval_devices, eval_config: the evaluator's devices and EvalConfig fields.
        out_dir: where results, summaries and the plot go.
        vllm: generate with vLLM (where installed) instead of transformers.
    """

    model: str
    dataset: str = "builtin"
    level: int | None = None
    size: str = "auto"
    backend: str = DEFAULT_BACKEND
    one_shot: bool = True
    samples: int = 1
    temperature: float = 0.0
    max_new_tokens: int = 4096
    batch_size: int = 8
    eval_devices: str = "auto"
    eval_config: dict[str, Any] = field(default_factory=dict)
    out_dir: str = "kb_gym_eval"
    ps: Sequence[float] = DEFAULT_PS
    vllm: bool = False


def hf_generate_fn(model: Any, tokenizer: Any, cfg: ModelEvalConfig) -> GenerateFn:
    """Batched ``model.generate`` over chat prompts (left padding, the model's chat template; a model
    without one gets the messages' text as one plain prompt)."""
    import torch

    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def render(messages: list[dict[str, str]]) -> str:
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n\n".join(m["content"] for m in messages) + "\n\n"  # a base model: the plain prompt

    def generate(batch: list[list[dict[str, str]]]) -> list[str]:
        texts = [render(m) for m in batch]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        sampling = {"do_sample": True, "temperature": cfg.temperature} if cfg.temperature > 0 else {"do_sample": False}
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=cfg.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                 **sampling)
        return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)

    return generate


def load_hf_model(name: str) -> tuple[Any, Any]:
    """A model id or folder; a LoRA adapter folder (``adapter_config.json``, as ``kb-gym train --lora`` saves)
    loads on its base model through peft."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    adapter = (Path(name) / "adapter_config.json").is_file()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        if adapter:
            try:
                from peft import AutoPeftModelForCausalLM
            except ImportError:
                raise ModelLoadError(f"{name} is a LoRA adapter; loading it needs peft: pip install "
                                     "'kb-gym[lora]'") from None
            model = AutoPeftModelForCausalLM.from_pretrained(name, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    except OSError as exc:
        raise ModelLoadError(f"cannot load model {name!r}: {exc}") from exc
    if torch.cuda.is_available():
        model = model.to("cuda")
    return model.eval(), tokenizer


def vllm_generate_fn(cfg: ModelEvalConfig) -> GenerateFn:
    """Generation with vLLM (``--vllm``): the model's chat template, ``samples`` handled as separate prompts."""
    try:
        from vllm import LLM, SamplingParams
    except ImportError:
        raise ModelLoadError("--vllm: vLLM is not installed here (pip install vllm); without --vllm the model "
                             "generates with transformers") from None
    llm = LLM(model=cfg.model)
    params = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_new_tokens)

    def generate(batch: list[list[dict[str, str]]]) -> list[str]:
        return [out.outputs[0].text for out in llm.chat(batch, params, use_tqdm=False)]

    return generate


def evaluate_model(cfg: ModelEvalConfig, *, generate: GenerateFn | None = None) -> dict[str, Any]:
    """Generate ``samples`` answers per problem, evaluate them all and write the outputs.

    ``generate`` replaces the Hugging Face model (a function from chat prompts to answers: a
    vLLM server client, or a fixed policy in tests). Returns the summary (as ``summary.json``).
    """
    if cfg.samples < 1:
        raise ValueError(f"samples must be at least 1, got {cfg.samples}")
    problems = load_problems(cfg.dataset, level=cfg.level, size=cfg.size, device=cfg.eval_devices)
    jobs: list[tuple[Problem, int]] = [(p, k) for p in problems for k in range(cfg.samples)]
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _only_run(out):
        _same_settings(out / "run.json", cfg)
        return _evaluate(cfg, problems, jobs, out, generate)


def _evaluate(cfg: ModelEvalConfig, problems: list[Problem], jobs: list[tuple[Problem, int]], out: Path,
              generate: GenerateFn | None) -> dict[str, Any]:
    completions_path, results_path = out / "completions.jsonl", out / "results.jsonl"
    answers = _done(completions_path, cfg.model, "completion")
    todo = [(p, k) for p, k in jobs if (p.key, k) not in answers]
    if todo and generate is None and cfg.vllm:
        generate = vllm_generate_fn(cfg)
    elif todo and generate is None:
        model, tokenizer = load_hf_model(cfg.model)
        generate = hf_generate_fn(model, tokenizer, cfg)
    _same_settings(out / "run.json", cfg, write=True)  # the folder's settings, once it is about to hold answers
    for start in range(0, len(todo), max(1, cfg.batch_size)):  # each batch on disk as it is generated
        batch = todo[start:start + cfg.batch_size]
        texts = generate([build_messages(p.code, backend=cfg.backend, one_shot=cfg.one_shot) for p, _ in batch])
        generated = {(p.key, k): text for (p, k), text in zip(batch, texts, strict=True)}
        append_lines(completions_path, [json.dumps({"model": cfg.model, "problem_key": key, "sample": k,
                                                    "completion": text}) + "\n"
                                        for (key, k), text in generated.items()])
        answers.update(generated)
    evaluated = _done(results_path, cfg.model, "status")
    store = ResultsStore(results_path)
    left = [(p, k) for p, k in jobs if (p.key, k) not in evaluated]
    if left:  # after generation, so that a policy on the same GPU never runs beside a timed kernel
        with Evaluator(cfg.eval_devices, config=EvalConfig(**cfg.eval_config), results_path=False) as ev:
            futures = [ev.submit(p, answers[(p.key, k)]) for p, k in left]
            for (p, k), future in zip(left, futures, strict=True):  # recorded in order, each as soon as it can be
                store.append(future.result(), extra={"model": cfg.model, "problem_key": p.key, "sample": k})
    results = _this_runs(load_results(results_path), jobs)
    # every task in the denominator, whether or not a result of it could be read back (round 10: a torn line)
    summary = summarize(results, ps=cfg.ps, tasks=[p.key for p in problems])
    (out / "summary.json").write_text(json.dumps({"model": cfg.model, "dataset": str(cfg.dataset),
                                                  "samples": cfg.samples, "summary": summary}, indent=1))
    _write_csv(out / "summary.csv", summary)
    _write_per_problem(out / "per_problem.csv", results)
    plot_fast_p(results, out / "fast_p.png", title=f"fast_p: {cfg.model}")
    return summary


@contextmanager
def _only_run(out: Path) -> Iterator[None]:
    """The folder itself locked (``flock`` on it) for the whole run: a second run into it is refused at once
    (round 11: two runs at once both evaluated every task and both appended, two rows for one sample)."""
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another evaluate-model run is writing {out}: wait for it to end or give this one "
                               "its own --out folder") from None
        yield
    finally:
        os.close(fd)  # closing drops the lock


# What a folder's results depend on; ``samples`` may grow on a resume (more answers per problem), the rest may not.
_RUN_SETTINGS = ("model", "dataset", "level", "size", "backend", "one_shot", "temperature", "max_new_tokens",
                 "eval_devices", "eval_config", "vllm")


def _same_settings(path: Path, cfg: ModelEvalConfig, write: bool = False) -> None:
    """Written (``write``) by a folder's first run once it is about to hold answers (a run that failed before,
    say on a misspelt model, leaves nothing to hold a retry to); a resume with other settings is refused (round 11:
    fp16 verdicts were counted as fp32 ones)."""
    mine = json.loads(json.dumps({k: getattr(cfg, k) for k in _RUN_SETTINGS}, default=str))
    if not path.exists():
        if write:
            path.write_text(json.dumps(mine, indent=1, sort_keys=True))
        return
    try:
        theirs = json.loads(path.read_text())
    except (OSError, ValueError):
        theirs = None
    if theirs != mine:
        differ = sorted(k for k in mine if not isinstance(theirs, dict) or theirs.get(k) != mine[k])
        raise ValueError(f"{path.parent} holds a run with other settings ({', '.join(differ) or 'unreadable'}; "
                         f"{path}): give this run its own --out folder")


def _this_runs(results: list[dict[str, Any]], jobs: list[tuple[Problem, int]]) -> list[dict[str, Any]]:
    """The rows of this run's (problem, sample) pairs, the first of each (round 11: fewer samples on a resume, or
    a second run's rows, were counted too)."""
    wanted = {(p.key, k) for p, k in jobs}
    kept: dict[tuple[str, int], dict[str, Any]] = {}
    for row in results:
        try:
            key = (str(row.get("problem_key")), int(row.get("sample") or 0))
        except (TypeError, ValueError):
            continue
        if key in wanted:
            kept.setdefault(key, row)
    return list(kept.values())


def _done(path: Path, model: str, field_name: str) -> dict[tuple[str, int], Any]:
    """What an earlier run into the same folder already wrote: (problem key, sample) -> the field's value.
    Lines of another model are an error (one folder, one model); a torn last line is ignored."""
    done: dict[tuple[str, int], Any] = {}
    if not path.exists():
        return done
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or "problem_key" not in row:
            continue
        if row.get("model") != model:
            raise ValueError(f"{path} holds answers of model {row.get('model')!r}, not {model!r}: give this "
                             "model its own --out folder")
        done[(row["problem_key"], int(row.get("sample", 0)))] = row.get(field_name)
    return done


def _write_csv(path: Path, summary: dict[str, dict[str, Any]]) -> None:
    """One row per level and ``all``: every metric, ``best_of:*`` (each task's best sample) flattened beside."""
    first = next(iter(summary.values()))
    columns = [k for k in first if k != "best_of"]
    best = list(first.get("best_of") or {})
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["group", *columns, *(f"best_of:{b}" for b in best)])
        for group, row in summary.items():
            writer.writerow([group, *(row.get(c) for c in columns), *((row.get("best_of") or {}).get(b) for b in best)])


def _write_per_problem(path: Path, results: list[dict[str, Any]]) -> None:
    """One row per problem: samples, how many were correct and fast, and its best sample's status and speedup."""
    from kb_gym.metrics import best_of_k, task_key

    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_task.setdefault(task_key(r), []).append(r)
    best = {task_key(r): r for r in best_of_k(results)}
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["problem", "samples", "correct", "fast_1", "best_status", "best_speedup", "best_flags"])
        for key, rows in by_task.items():
            top = best[key]
            fast = sum(1 for r in rows if r.get("status") == "correct" and (r.get("speedup") or 0) > 1
                       and r.get("speed_credit") is not False)
            writer.writerow([key, len(rows), sum(r.get("status") == "correct" for r in rows), fast, top.get("status"),
                             top.get("speedup"), ",".join(top.get("flags") or [])])
