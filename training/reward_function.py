"""The evaluator as a TRL reward function: one call scores a whole generation batch.

TRL calls ``reward_func(prompts=..., completions=..., completion_ids=..., **columns)`` once per
batch. :class:`KernelRewardFunction` evaluates every completion against the problem named by its
``problem_key`` column, concurrently across the Evaluator's workers (one per GPU), turns each
result into a number with a reward preset picked by name, and logs the batch's correct rate and
speedups through TRL's ``log_metric`` / ``log_extra`` hooks when the trainer provides them.
"""

from __future__ import annotations

import collections
import math
import statistics
import time
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from kb_gym.config import EvalConfig
from kb_gym.evaluator import Evaluator
from kb_gym.problems import Problem, load_problems
from kb_gym.result import EvalResult, Status, valid_speedup
from kb_gym.rewards import get_reward, is_correct
from kb_gym.training.dedup import DEDUP_SCOPES, DedupEvaluator


@dataclass
class KernelRewardConfig:
    """How :class:`KernelRewardFunction` evaluates and scores.

    Args:
        reward: a reward preset name from ``kb_gym.rewards`` (``"default"``, ``"fast_p"``, ``"kevin"``,
            ``"drkernel"`` or one registered by the user), with ``reward_kwargs`` bound to it.
        dataset: where ``problem_key`` values are looked up (anything ``load_problems`` takes).
        size: the problems' size (``"auto"``: GPU size when ``devices`` are all GPUs, else CPU size);
            the prompts must come from the same size (``build_prompt_dataset(..., size=...)``).
        devices: the Evaluator's devices when the function builds its own (``"auto"``: every GPU).
        workers_per_device: its warm workers per device (compiles overlap; kernels take turns).
        eval_config: the EvalConfig of every evaluation (None: the defaults).
        results_path: JSONL file every result is appended to (None: the default store, False: none).
        evaluator: where evaluations run: ``"local"`` (an Evaluator in this process over ``devices``) or the
            Ray evaluation service every trainer rank shares (``"ray"``: the current cluster,
            ``"ray://HOST:10001"``; started with ``kb-gym serve``; docs/distributed.md).
        name: the name TRL logs the reward under.
        dedup: identical programs (same problem, same extracted code) evaluated once, each copy given the verdict
            and recorded with ``duplicate: true``: ``"batch"`` (default; the copies in one call, e.g. a GRPO
            group that repeats itself), ``"run"`` (every call of this function) or ``"off"`` (training/dedup.py).
    """

    reward: str = "default"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    dataset: str | Sequence[Problem] = "builtin"
    size: str = "auto"
    devices: str | Sequence[str] = "auto"
    workers_per_device: int = 1
    eval_config: EvalConfig | None = None
    results_path: str | bool | None = None
    evaluator: str = "local"
    name: str = "kernel_reward"
    dedup: str = "batch"

    def __post_init__(self) -> None:
        if self.dedup not in DEDUP_SCOPES:
            raise ValueError(f"dedup must be one of {DEDUP_SCOPES}, got {self.dedup!r}")


def completion_text(completion: Any) -> str:
    """The text of one completion: a string, or the content of the last message of a conversation."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return str(completion.get("content", ""))
    if isinstance(completion, Sequence) and completion:
        last = completion[-1]
        return str(last.get("content", "")) if isinstance(last, Mapping) else str(last)
    return ""


class KernelRewardFunction:
    """A TRL reward function over kb_gym's evaluator.

    Pass it in ``GRPOTrainer(reward_funcs=[KernelRewardFunction()])`` with a dataset from
    :func:`~kb_gym.training.build_prompt_dataset` (its ``problem_key`` column names the problem).
    A completion whose problem is unknown scores like a format error rather than stopping the
    trainer. ``last_results`` keeps the batch's EvalResults for callbacks.
    """

    def __init__(self, config: KernelRewardConfig | None = None, *, evaluator: Evaluator | None = None) -> None:
        self.config = config or KernelRewardConfig()
        self.__name__ = self.config.name  # TRL names the reward column and its metrics by this
        self._reward = get_reward(self.config.reward, **self.config.reward_kwargs)
        self._own_evaluator = evaluator is None
        if evaluator is None:
            from kb_gym.service import connect

            evaluator = connect(self.config.evaluator, config=self.config.eval_config)  # None: a local one below
        devices = evaluator.devices if evaluator is not None else self.config.devices
        problems = load_problems(self.config.dataset, size=self.config.size, device=devices)
        self.problems: dict[str, Problem] = {p.key: p for p in problems}
        self.evaluator = evaluator or Evaluator(self.config.devices, config=self.config.eval_config,
                                                results_path=self.config.results_path,
                                                workers_per_device=self.config.workers_per_device)
        if self.config.dedup == "run":
            self.evaluator = DedupEvaluator(self.evaluator)
        self.last_results: list[EvalResult] = []
        self._warned = False

    def close(self) -> None:
        if self._own_evaluator:
            self.evaluator.close()

    def __enter__(self) -> KernelRewardFunction:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] = (), *,
                 problem_key: Sequence[str] | None = None, log_metric: Any = None, log_extra: Any = None,
                 **columns: Any) -> list[float]:
        if problem_key is None:  # TRL passes the dataset's columns by name: this one is missing
            raise ValueError(
                "the training dataset has no 'problem_key' column, which names each row's problem for the reward "
                f"(columns given: {', '.join(sorted(columns)) or 'none'}); build the dataset with "
                "kb_gym.training.build_prompt_dataset, or add the column (keys like 'level1/1_ReLU')")
        if len(problem_key) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(problem_key)} problem keys")
        # Submit the whole batch before waiting on any of it: the workers of every device share it.
        started = time.perf_counter()
        dedup = self.evaluator if isinstance(self.evaluator, DedupEvaluator) else (
            DedupEvaluator(self.evaluator) if self.config.dedup == "batch" else None)  # batch: this call's copies
        submitter = dedup or self.evaluator
        futures: list[Future | str] = []
        copies: list[bool] = []  # the verdict of an identical program evaluated before
        for key, c in zip(problem_key, completions, strict=True):
            hits = dedup.hits if dedup else 0
            futures.append(submitter.submit(self.problems[key], completion_text(c)) if key in self.problems else key)
            copies.append(dedup is not None and dedup.hits != hits)
        pending = [f for f in futures if isinstance(f, Future)]
        # A bar while a batch of kernels is evaluated (minutes at GPU size); off where stderr is not a terminal.
        for _ in tqdm(as_completed(pending), total=len(pending), desc="evaluating kernels", leave=False, disable=None):
            pass
        results = [f.result() if isinstance(f, Future) else self._unknown(f) for f in futures]
        seconds = time.perf_counter() - started
        store = getattr(self.evaluator, "store", None)  # a RayEvaluator's writes to the service's store
        for i, copy in enumerate(copies):
            if copy:  # its own object, and a row of its own in the store: every sample is recorded
                results[i] = EvalResult.from_dict(results[i].to_dict())
                if store is not None:
                    store.append(results[i], extra={"duplicate": True})
        self.last_results = results
        scored = [self._reward(r) for r in results]
        rewards = [float(reward) for reward, _ in scored]
        if log_metric is not None:
            metrics = batch_metrics(results, parts=[parts for _, parts in scored], seconds=seconds)
            metrics["duplicates"] = sum(copies) / max(1, len(copies))
            for name, value in metrics.items():
                log_metric(f"{self.__name__}/{name}", value)
        if log_extra is not None:
            log_extra("status", [r.status for r in results])
            log_extra("speedup", [valid_speedup(r.speedup) for r in results])
        return rewards

    def _unknown(self, key: str) -> EvalResult:
        known = ", ".join(sorted(self.problems)[:5])
        message = f"no problem with key {key!r} in the reward's dataset (e.g. {known})"
        if not self._warned:  # every such sample scores as a format error: say so once, loudly
            warnings.warn(f"{message}; is KernelRewardConfig.dataset the training set's dataset?", stacklevel=3)
            self._warned = True
        result = EvalResult(status="format_error", problem_name=str(key), error=message, feedback=message)
        store = getattr(self.evaluator, "store", None)  # a RayEvaluator's writes to the service's store
        if store is not None:
            store.append(result)  # recorded like every other sample
        return result


def batch_metrics(results: Sequence[EvalResult], parts: Sequence[Mapping[str, Any]] | None = None,
                  seconds: float | None = None) -> dict[str, float]:
    """Fractions correct, compiled and faster than the baseline (with speed credit), the mean speedup of the
    correct results that earned speed credit; the share of each status (``status/<name>``: every status, so
    the columns stay put), each integrity flag's rate (``flag/<name>``: the reward-hacking signal), the mean
    of each reward component (``reward/<name>``) and the batch's evaluation seconds."""
    n = max(1, len(results))
    correct = [r for r in results if is_correct(r)]
    speedups = [s for s in (valid_speedup(r.speedup) for r in correct if r.speed_credit is not False) if s is not None]
    compiled = sum(r.status in ("correct", "incorrect", "runtime_error", "timeout") for r in results)
    out = {"correct": len(correct) / n, "compiled": compiled / n,
           "fast_1": sum(s > 1 for s in speedups) / n,
           "speedup_mean_correct": statistics.fmean(speedups) if speedups else 0.0}
    statuses = collections.Counter(r.status for r in results)
    out.update({f"status/{s.value}": statuses.get(s.value, 0) / n for s in Status})
    flags = collections.Counter(f for r in results for f in set(r.flags or []))
    out.update({f"flag/{f}": count / n for f, count in sorted(flags.items())})
    numeric = collections.defaultdict(list)
    for row in parts or []:
        for name, value in (row or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                numeric[name].append(float(value))
    out.update({f"reward/{name}": statistics.fmean(values) for name, values in sorted(numeric.items())})
    if seconds is not None:
        out["eval_seconds"] = seconds
    return out
