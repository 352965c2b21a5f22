"""What every phase of the learning check shares: its options, the output folder's layout, the time budget,
small JSON helpers and the summary table each phase prints.

Why a time budget at all: the GPU machine this runs on gives at most 10 minutes a call and keeps files only
between back-to-back calls, so every phase must stop cleanly before the call's end, with its work on disk,
and carry on from there when the same command runs again.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PHASES = ("corpus", "sft", "eval-before", "eval-before-train", "grpo", "eval-after", "eval-after-train", "report")
# the two evaluations of each side: the held-out test split, and fresh samples on the train split GRPO trained on
EVAL_PHASES = {"eval-before": ("before", "test"), "eval-before-train": ("before", "train"),
               "eval-after": ("after", "test"), "eval-after-train": ("after", "train")}
DEFAULT_OUT = "runs/learning_check"


@dataclass
class LearningCheckConfig:
    """Every option of the learning check (``scripts/learning_check.py --help`` says the same per flag).

    Fields in :data:`RUNTIME_FIELDS` may change between calls on one output folder; any other change is refused,
    because finished phases would silently keep the old value.
    """

    out: str = DEFAULT_OUT
    # the policy: None builds our own (tokenizer + Llama of model_size) and supervises it on the corpus;
    # a Hugging Face id or folder starts from that model (SFT on the corpus only with sft_pretrained)
    model: str | None = None
    sft_pretrained: bool = False
    model_size: str = "small"
    vocab_size: int = 4096
    # problems
    dataset: str = "builtin"
    size: str = "gpu"
    train_limit: int | None = None
    test_limit: int | None = None
    backend: str = "triton"
    one_shot: bool = False
    # corpus
    per_problem: int = 12
    mix: str = "correct=0.4,slow=0.2,broken=0.4"
    seed: int = 0
    # supervised phase
    sft_epochs: float = 20.0
    sft_minutes: float = 3.0
    sft_lr: float = 6e-4
    sft_batch_size: int = 16
    max_length: int = 4096
    # before/after evaluation
    samples: int = 10  # answers per held-out problem (0: no eval-before / eval-after)
    # answers per train problem in the in-distribution evaluation (0: no eval-*-train phases)
    train_samples: int = 4
    temperature: float = 1.0
    max_new_tokens: int = 1536
    gen_batch_size: int = 128
    # GRPO
    grpo_steps: int = 30
    grpo_minutes: float = 6.0
    grpo_batch_size: int = 8
    num_generations: int = 4
    # the train problems GRPO draws prompts from, and the in-distribution evaluation reads: "all", or "kernels",
    # those whose corpus answer is one of our kernels (corpus.solution_for): only there can the policy have
    # learnt a faster answer than the reference, so only there can a group hold one for GRPO to prefer
    grpo_problems: str = "all"
    grpo_lr: float = 5e-5
    max_completion_length: int = 1536
    save_steps: int = 5
    grpo: dict[str, Any] = field(default_factory=dict)
    reward: str = "default"
    # the evaluator
    eval_devices: str = "auto"
    evaluator: str = "local"
    workers_per_device: int = 1
    eval_preset: str = "rl"
    eval_config: dict[str, Any] = field(default_factory=dict)
    dedup: bool = True
    # this call
    max_minutes: float = 8.5

    @property
    def own_model(self) -> bool:
        """Whether the policy is ours (built from a config) rather than a pretrained checkpoint."""
        return self.model is None

    @property
    def uses_sft(self) -> bool:
        return self.own_model or self.sft_pretrained


RUNTIME_FIELDS = frozenset({"out", "max_minutes", "eval_devices", "evaluator", "workers_per_device",
                            "gen_batch_size", "sft_minutes", "grpo_minutes"})


class Layout:
    """Where each phase keeps its files under the output folder."""

    def __init__(self, out: str | Path) -> None:
        self.root = Path(out)
        self.config = self.root / "config.json"
        self.corpus = self.root / "corpus"
        self.corpus_file = self.corpus / "corpus.jsonl"
        self.tokenizer = self.corpus / "tokenizer"
        self.sft = self.root / "sft"
        self.sft_trainer = self.sft / "trainer"
        self.sft_model = self.sft / "model"
        self.eval_before = self.root / "eval_before"
        self.grpo = self.root / "grpo"
        self.grpo_trainer = self.grpo / "trainer"
        self.grpo_steps = self.grpo / "steps.jsonl"
        self.eval_after = self.root / "eval_after"
        self.eval_before_train = self.root / "eval_before_train"
        self.eval_after_train = self.root / "eval_after_train"
        self.report = self.root / "report"

    def phase_dir(self, phase: str) -> Path:
        return {"corpus": self.corpus, "sft": self.sft, "eval-before": self.eval_before,
                "eval-before-train": self.eval_before_train, "grpo": self.grpo, "eval-after": self.eval_after,
                "eval-after-train": self.eval_after_train, "report": self.report}[phase]

    def done_file(self, phase: str) -> Path:
        return self.phase_dir(phase) / "done.json"


class Deadline:
    """Seconds left in this call (``max_minutes`` from construction). Monotonic: a clock change cannot end or
    extend a phase."""

    def __init__(self, minutes: float) -> None:
        self.start = time.monotonic()
        self.end = self.start + max(0.0, minutes) * 60.0

    def left(self) -> float:
        return self.end - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def expired(self, margin: float = 0.0) -> bool:
        return self.left() <= margin


@dataclass
class PhaseResult:
    """What one phase did in this call: ``done`` (finished now), ``skipped`` (finished earlier), ``stopped``
    (out of time; run the same command again), ``not used`` (not part of this configuration)."""

    phase: str
    status: str
    rows: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def finished(self) -> bool:
        return self.status in ("done", "skipped", "not used")


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


def write_json(path: Path, data: Any) -> None:
    """Written whole or not at all (a temporary file renamed over the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every whole JSON object line (a torn last line, from a killed call, is skipped)."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def append_jsonl(path: Path, row: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(row), default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def format_table(title: str, rows: Sequence[tuple[str, str]]) -> str:
    """``title`` and two aligned columns: what each phase prints at its end."""
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join([title, *(f"  {k.ljust(width)}  {v}" for k, v in rows)])


def fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        return "-" if not math.isfinite(value) else f"{value:.{digits}f}"
    return str(value)


def config_to_dict(cfg: LearningCheckConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def check_same_config(saved: Mapping[str, Any] | None, cfg: LearningCheckConfig) -> list[str]:
    """The fields (outside :data:`RUNTIME_FIELDS`) whose value differs from the folder's saved config."""
    if not saved:
        return []
    now = config_to_dict(cfg)
    return sorted(k for k in now if k not in RUNTIME_FIELDS and k in saved and saved[k] != now[k])


def budget_callback(deadline: Deadline, phase_seconds_left: float, on_step: Any = None) -> Any:
    """A ``TrainerCallback`` that ends training cleanly before time runs out: after each optimizer step it
    predicts the next one from the slowest so far and stops (with a checkpoint saved) when that step would
    overrun the phase's own remaining budget (``stop_reason = "phase"``: the phase is then finished) or this
    call's ``deadline`` (``"call"``: the same command carries on from the checkpoint). ``on_step(seconds)`` is
    told each step's wall time, for the phase's running total across calls."""
    from transformers import TrainerCallback

    class BudgetCallback(TrainerCallback):
        def __init__(self) -> None:
            self.started = time.monotonic()
            self.step_started = self.started
            self.slowest = 0.0
            self.stop_reason: str | None = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.step_started = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            now = time.monotonic()
            step = now - self.step_started
            self.slowest = max(self.slowest, step)
            if on_step is not None:
                on_step(step)
            if phase_seconds_left - (now - self.started) < self.slowest:
                self.stop_reason = "phase"
            elif deadline.left() < 1.25 * self.slowest + 20.0:  # the next step, and writing a checkpoint
                self.stop_reason = "call"
            if self.stop_reason is not None:
                control.should_save = True
                control.should_training_stop = True

    return BudgetCallback()


def single_gpu(args: Any) -> None:
    """Keep the policy on one GPU (``cuda:0``): with several visible, the Trainer would wrap it in
    DataParallel and spread it over the evaluator's GPU too."""
    _ = args.n_gpu  # sets the device up first; it would reset the count afterwards
    if getattr(args, "_n_gpu", 1) > 1:
        args._n_gpu = 1
