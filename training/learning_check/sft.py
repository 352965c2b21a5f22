"""The learning check's supervised phase: the corpus's answers, loss on the answer tokens only, with
``transformers.Trainer`` (bf16 on a GPU), stopped and resumed by the time budget.

Why our own tokenisation instead of TRL's SFTTrainer: the prompt is rendered exactly as generation renders it
(``apply_chat_template(..., add_generation_prompt=True)``, no special tokens added) and the answer's ids are
appended after it, so the boundary tokens are the ones the policy meets when it generates; the answer ends with
the end-of-turn token, so the model learns to stop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

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
from kb_gym.training.learning_check.corpus import read_corpus

IGNORE = -100


def tokenize_rows(rows: Sequence[Mapping[str, Any]], tokenizer: Any, max_length: int
                  ) -> tuple[list[dict[str, list[int]]], int]:
    """(examples, dropped): ``input_ids`` = prompt + answer + end-of-turn, ``labels`` = -100 over the prompt.
    Examples longer than ``max_length`` are dropped whole (a cut answer would teach cutting off)."""
    examples, dropped = [], 0
    rendered: dict[str, list[int]] = {}
    for row in rows:
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        if text not in rendered:
            rendered[text] = tokenizer(text, add_special_tokens=False)["input_ids"]
        prompt = rendered[text]
        answer = tokenizer(row["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        if len(prompt) + len(answer) > max_length:
            dropped += 1
            continue
        examples.append({"input_ids": prompt + answer, "labels": [IGNORE] * len(prompt) + answer})
    return examples, dropped


class PadCollator:
    """Right-pads a batch to its longest example (a multiple of 8) with the pad id; labels with -100."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, batch: Sequence[Mapping[str, list[int]]]) -> dict[str, Any]:
        import torch

        longest = max(len(b["input_ids"]) for b in batch)
        longest = int(math.ceil(longest / 8) * 8)
        ids = torch.full((len(batch), longest), self.pad_id, dtype=torch.long)
        labels = torch.full((len(batch), longest), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for i, b in enumerate(batch):
            n = len(b["input_ids"])
            ids[i, :n] = torch.tensor(b["input_ids"])
            labels[i, :n] = torch.tensor(b["labels"])
            mask[i, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def _base_model(cfg: LearningCheckConfig, tokenizer: Any) -> Any:
    """The model SFT starts from: ours, freshly initialised (seeded), or the pretrained checkpoint."""
    import torch

    if cfg.own_model:
        from kb_gym.training.learning_check.model import build_model

        torch.manual_seed(cfg.seed)
        return build_model(cfg.model_size, tokenizer, max_positions=max(cfg.max_length, 2048))
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)


def sft_tokenizer(cfg: LearningCheckConfig, layout: Layout) -> Any:
    from transformers import AutoTokenizer

    source = str(layout.tokenizer) if cfg.own_model else str(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _summary_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [("model", f"{summary.get('model')} ({summary.get('parameters_m', '-')}M parameters)"),
            ("examples", f"{summary.get('examples')} ({summary.get('dropped')} longer than max_length dropped)"),
            ("steps", f"{summary.get('steps')} of {summary.get('max_steps')} "
                      f"({fmt(summary.get('epochs'), 1)} epochs; {summary.get('finished_by')})"),
            ("loss", f"{fmt(summary.get('first_loss'))} -> {fmt(summary.get('last_loss'))} (answer tokens only)"),
            ("train time", f"{fmt(summary.get('train_seconds'), 0)} s over all calls, "
                           f"{fmt(summary.get('tokens_per_second'), 0)} tokens/s"),
            ("saved", str(summary.get("saved")))]


def run_sft(cfg: LearningCheckConfig, layout: Layout, deadline: Deadline) -> PhaseResult:
    """Supervise the policy on the corpus until ``sft_epochs`` or ``sft_minutes`` (over all calls) run out;
    stop with a checkpoint when this call's deadline comes first (the next call resumes it)."""
    started = time.monotonic()
    done = read_json(layout.done_file("sft"))
    if done:
        return PhaseResult("sft", "skipped", _summary_rows(done))
    if not layout.corpus_file.exists():
        raise RuntimeError(f"no corpus at {layout.corpus_file}: run --phase corpus first")
    import torch
    from transformers import PrinterCallback, Trainer, TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    tokenizer = sft_tokenizer(cfg, layout)
    examples, dropped = tokenize_rows(read_corpus(layout.corpus_file), tokenizer, cfg.max_length)
    if not examples:
        raise RuntimeError(f"every corpus example is longer than max_length={cfg.max_length}")
    state_path = layout.sft / "state.json"
    state = read_json(state_path, {"seconds": 0.0})
    phase_left = cfg.sft_minutes * 60.0 - float(state["seconds"])
    cuda = torch.cuda.is_available()
    steps_per_epoch = math.ceil(len(examples) / cfg.sft_batch_size)
    max_steps = max(1, math.ceil(cfg.sft_epochs * steps_per_epoch))
    args = TrainingArguments(
        output_dir=str(layout.sft_trainer), max_steps=max_steps, per_device_train_batch_size=cfg.sft_batch_size,
        learning_rate=cfg.sft_lr, lr_scheduler_type="cosine", warmup_steps=min(100, max_steps // 20),
        weight_decay=0.1, adam_beta2=0.95, max_grad_norm=1.0, logging_steps=max(1, min(10, max_steps // 10)),
        save_strategy="steps", save_steps=max(50, max_steps // 10), save_total_limit=1, report_to=[],
        bf16=cuda, use_cpu=not cuda, remove_unused_columns=False, dataloader_num_workers=0, seed=cfg.seed,
        disable_tqdm=True, **_length_grouping(TrainingArguments))
    single_gpu(args)
    model = _base_model(cfg, tokenizer)
    checkpoint = get_last_checkpoint(str(layout.sft_trainer)) if layout.sft_trainer.is_dir() else None

    def add_seconds(seconds: float) -> None:
        state["seconds"] = float(state["seconds"]) + seconds
        write_json(state_path, state)

    budget = budget_callback(deadline, phase_left, on_step=add_seconds)
    trainer = Trainer(model=model, args=args, train_dataset=_ListDataset(examples), data_collator=PadCollator(
        tokenizer.pad_token_id), callbacks=[budget, _log_callback(layout.sft / "log.jsonl")])
    trainer.remove_callback(PrinterCallback)  # the log callback prints one line per log instead
    if (phase_left > 0 or checkpoint is None) and not deadline.expired(30.0):  # no budget at all: one step
        trainer.train(resume_from_checkpoint=checkpoint)
    elif phase_left <= 0 and checkpoint is not None:  # the budget was spent in earlier calls: keep what they trained
        from transformers import AutoModelForCausalLM, TrainerState

        trainer.model = model = AutoModelForCausalLM.from_pretrained(checkpoint)
        trainer.state = TrainerState.load_from_json(f"{checkpoint}/trainer_state.json")
    finished = trainer.state.global_step >= max_steps or budget.stop_reason == "phase" or (
        phase_left <= 0 and trainer.state.global_step > 0)
    if not finished:
        return PhaseResult("sft", "stopped", [("steps", f"{trainer.state.global_step} of {max_steps}"),
                                              ("next", "run the same command again: it resumes from the checkpoint")],
                           time.monotonic() - started)
    trainer.save_model(str(layout.sft_model))
    tokenizer.save_pretrained(str(layout.sft_model))
    losses = [r["loss"] for r in read_jsonl(layout.sft / "log.jsonl") if "loss" in r]
    tokens = sum(len(e["input_ids"]) for e in examples)
    seconds = float(state["seconds"])
    summary = {"model": cfg.model or f"own:{cfg.model_size}", "parameters_m": round(
        sum(p.numel() for p in model.parameters()) / 1e6, 1), "examples": len(examples), "dropped": dropped,
        "steps": trainer.state.global_step, "max_steps": max_steps,
        "epochs": trainer.state.global_step / steps_per_epoch,
        "finished_by": "all epochs" if trainer.state.global_step >= max_steps else "the sft_minutes budget",
        "first_loss": losses[0] if losses else float("nan"), "last_loss": losses[-1] if losses else float("nan"),
        "train_seconds": seconds,
        "tokens_per_second": tokens * trainer.state.global_step / steps_per_epoch / seconds if seconds else 0.0,
        "saved": str(layout.sft_model)}
    write_json(layout.done_file("sft"), summary)
    return PhaseResult("sft", "done", _summary_rows(summary), time.monotonic() - started)


def _length_grouping(arguments: type) -> dict[str, Any]:
    """Batches of examples of similar length (half the padding of random batches here): the option's name
    changed within transformers 5 (``group_by_length`` became ``train_sampling_strategy``)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(arguments)}
    if "train_sampling_strategy" in names:
        return {"train_sampling_strategy": "group_by_length"}
    return {"group_by_length": True} if "group_by_length" in names else {}


class _ListDataset:
    """A list as the map-style dataset the Trainer's DataLoader takes."""

    def __init__(self, items: list[dict[str, list[int]]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.items[i]


def _log_callback(path: Any) -> Any:
    """Every Trainer log line (loss, learning rate, step) appended to ``path``: the loss curve over all calls."""
    from transformers import TrainerCallback

    class LogCallback(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if logs and "loss" in logs:
                append_jsonl(path, {"step": state.global_step, **logs})
                print(f"sft step {state.global_step}/{state.max_steps}: loss {float(logs['loss']):.4f}, "
                      f"learning rate {float(logs.get('learning_rate', 0.0)):.2e}", flush=True)

    return LogCallback()
