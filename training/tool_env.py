"""Multi-turn training through tool calls: TRL's ``environment_factory`` with a ``submit_kernel`` tool.

During generation the model may call ``submit_kernel(code)`` several times; each call evaluates the
program against the row's problem and returns the verdict and feedback as the tool's answer, so the
model can fix a compile error or speed up a correct kernel within one rollout. After the rollout,
TRL calls ``get_reward()``: the best reward among the submissions, or the no-code (format error)
reward when the model submitted nothing.

    factory = KernelToolEnvFactory(dataset="builtin")
    trainer = GRPOTrainer(model=..., args=..., train_dataset=build_prompt_dataset("builtin"),
                          environment_factory=factory)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from kb_gym.config import EvalConfig
from kb_gym.evaluator import Evaluator
from kb_gym.problems import Problem, load_problems
from kb_gym.result import EvalResult, Status
from kb_gym.rewards import get_reward


class KernelToolEnv:
    """One rollout's environment: the problem from ``reset(problem_key=...)`` and its submissions."""

    def __init__(self, evaluator: Evaluator, problems: dict[str, Problem], reward: Any, max_submissions: int,
                 score: str = "best", record: Any = None) -> None:
        self._evaluator = evaluator
        self._record = record  # the factory's: every evaluated submission, for the trainer's logs
        self._problems = problems
        self._reward = reward
        self._max_submissions = max_submissions
        self._score = score
        self.problem: Problem | None = None
        self.results: list[EvalResult] = []

    def reset(self, problem_key: str = "", **_: Any) -> str | None:
        """Start a rollout on the row's problem (TRL passes the dataset row's columns)."""
        self.problem = self._problems.get(problem_key)
        self.results = []
        if self.problem is None:
            return f"(No problem with key {problem_key!r} is loaded; submissions cannot be evaluated.)"
        return None  # the prompt already holds the task

    def submit_kernel(self, code: str) -> str:
        """Evaluate a complete Python program that defines ModelNew against the task's reference Model.

        Args:
            code: the whole program: imports, the kernels (Triton or CUDA through load_inline) and class ModelNew.

        Returns:
            The verdict (correct, incorrect, compile_error, ...) with the speedup or what went wrong.
        """
        if self.problem is None:
            return "No problem is loaded for this rollout."
        if len(self.results) >= self._max_submissions:
            return f"Submission limit reached ({self._max_submissions}); the best submission so far counts."
        result = self._evaluator.evaluate(self.problem, code)
        self.results.append(result)
        if self._record is not None:
            self._record(result)
        left = self._max_submissions - len(self.results)
        return f"{result.status}: {result.feedback}\n({left} submission(s) left)"

    def get_reward(self) -> float:
        """The best (or, with ``score="last"``, the final) submission's reward; the format-error reward
        when there was none."""
        if not self.results:
            return float(self._reward(EvalResult(status=Status.FORMAT_ERROR.value, error="no submission"))[0])
        if self._score == "last":
            return float(self._reward(self.results[-1])[0])
        return max(float(self._reward(r)[0]) for r in self.results)


class KernelToolEnvFactory:
    """Makes :class:`KernelToolEnv` instances that share one Evaluator (its workers stay warm).

    Args:
        dataset: where ``problem_key`` values are looked up (anything ``load_problems`` takes).
        size: the problems' size (``"auto"``: GPU size when the evaluator's devices are all GPUs); the
            prompts must come from the same size.
        reward, reward_kwargs: the reward preset by name, and its parameters.
        max_submissions: tool calls evaluated per rollout; later calls are answered without running.
        score: ``"best"`` (the best submission counts: free exploration) or ``"last"`` (the final one
            counts: the model must end on its best kernel).
        evaluator: an Evaluator to share; else one is built on ``devices`` with ``eval_config`` and
            ``workers_per_device``.
    """

    def __init__(self, dataset: str | Sequence[Problem] = "builtin", *, reward: str = "default",
                 reward_kwargs: dict[str, Any] | None = None, max_submissions: int = 4, score: str = "best",
                 evaluator: Evaluator | None = None, devices: str | Sequence[str] = "auto",
                 eval_config: EvalConfig | None = None, workers_per_device: int = 1, size: str = "auto") -> None:
        if max_submissions < 1:
            raise ValueError(f"max_submissions must be at least 1, got {max_submissions}")
        if score not in ("best", "last"):
            raise ValueError(f"score must be 'best' or 'last', got {score!r}")
        self.score = score
        where = evaluator.devices if evaluator is not None else devices
        self.problems = {p.key: p for p in load_problems(dataset, size=size, device=where)}
        self.reward = get_reward(reward, **(reward_kwargs or {}))
        self.max_submissions = max_submissions
        self._own_evaluator = evaluator is None
        self.evaluator = evaluator or Evaluator(devices, config=eval_config, workers_per_device=workers_per_device)
        self._lock = threading.Lock()
        self._pending: list[EvalResult] = []

    def __call__(self) -> KernelToolEnv:
        return KernelToolEnv(self.evaluator, self.problems, self.reward, self.max_submissions, self.score,
                             record=self._record)

    def _record(self, result: EvalResult) -> None:
        with self._lock:
            self._pending.append(result)

    def take_results(self) -> list[EvalResult]:
        """The submissions evaluated since the last call (what the metrics callback logs per step)."""
        with self._lock:
            taken, self._pending = self._pending, []
        return taken

    def metrics_callback(self, name: str = "kernel_tool") -> Any:
        """A ``TrainerCallback`` that adds to each log entry the reward function's metrics over the tool
        submissions evaluated since the last one (``kernel_tool/correct``, ``status/*``, ``flag/*``, ``reward/*``,
        ``submissions``): ``GRPOTrainer(..., environment_factory=factory, callbacks=[factory.metrics_callback()])``.
        They land in ``trainer.state.log_history``; a reporter (wandb, tensorboard) sees them when this
        callback runs before it (``trainer.callback_handler.callbacks.insert(0, callback)``)."""
        from transformers import TrainerCallback

        from kb_gym.training.reward_function import batch_metrics

        factory = self

        class KernelToolMetrics(TrainerCallback):
            def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
                results = factory.take_results()
                metrics = batch_metrics(results, parts=[factory.reward(r)[1] for r in results])
                metrics["submissions"] = float(len(results))
                logged = {f"{name}/{key}": value for key, value in metrics.items()}
                if logs is not None:
                    logs.update(logged)
                if state.log_history:  # the entry Trainer.log has just appended for these logs
                    state.log_history[-1].update(logged)

        return KernelToolMetrics()

    def close(self) -> None:
        if self._own_evaluator:
            self.evaluator.close()
