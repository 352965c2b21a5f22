"""Multi-turn training through tool calls: TRL's ``environment_factory`` with a ``submit_kernel`` tool.

During generation the model may call ``submit_kernel(code)`` several times; each call evaluates the
program against the row's problem and returns the verdict and feedback as the tool's answer, so the
model can fix a compile error or speed up a correct kernel within one rollout. After the rollouts,
the factory's reward function scores each one: the best (or last) submission's reward; a rollout that
made no tool call but ended with a fenced code block has that answer evaluated once; else the no-code
(format error) reward. It logs the same metrics as the single-turn reward function.

    factory = KernelToolEnvFactory(dataset="builtin", max_submissions=4, workers_per_device=2)
    trainer = GRPOTrainer(model=..., args=..., reward_funcs=[factory.reward_function()],
                          train_dataset=build_prompt_dataset("builtin", tool_calls=4),
                          environment_factory=factory)
    overlap_tool_calls(trainer)  # different rollouts' calls evaluated side by side
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from kb_gym.config import EvalConfig
from kb_gym.evaluator import Evaluator
from kb_gym.problems import Problem, load_problems
from kb_gym.result import EvalResult, Status
from kb_gym.rewards import get_reward, penalised_flags_of
from kb_gym.rewards.multi_turn import best_reward
from kb_gym.training.dedup import DedupEvaluator


class KernelToolEnv:
    """One rollout's environment: the problem from ``reset(problem_key=...)`` and its submissions."""

    def __init__(self, evaluator: Evaluator, problems: dict[str, Problem], reward: Any, max_submissions: int,
                 score: str = "best") -> None:
        self._evaluator = evaluator
        self._problems = problems
        self._reward = reward
        self._max_submissions = max_submissions
        self._score = score
        self.problem: Problem | None = None
        self.results: list[EvalResult] = []  # the tool calls' evaluations
        self.final_result: EvalResult | None = None  # a rollout without tool calls: its final answer's (the reward)
        self._prefetched: list[tuple[str, Future]] = []  # (code, its evaluation) started before TRL's call
        # this rollout's evaluations by program: a program submitted again gets its first verdict, not another
        # timing draw for "best" to keep (round 10: 4 submissions of a 1.00x program paid 1.06x)
        self._episode = DedupEvaluator(evaluator)

    def reset(self, problem_key: str = "", **_: Any) -> str | None:
        """Start a rollout on the row's problem (TRL passes the dataset row's columns)."""
        self.problem = self._problems.get(problem_key)
        self.results = []
        self.final_result = None
        self._episode = DedupEvaluator(self._evaluator)
        self._drop_prefetched()
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
        started = next((k for k, (c, _) in enumerate(self._prefetched) if c == code), None)
        if started is not None:
            result = self._prefetched.pop(started)[1].result()
        else:
            result = self._episode.submit(self.problem, code).result()
        self.results.append(result)
        left = self._max_submissions - len(self.results)
        return f"{result.status}: {result.feedback}\n({left} submission(s) left)"

    def _prefetch(self, message: Any) -> None:
        """Start evaluating the ``submit_kernel`` calls of a generated assistant message now, before TRL calls
        the tool (overlap_tool_calls); the call then only waits for its result. Within the submission limit."""
        if self.problem is None or not isinstance(message, dict):
            return
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if not isinstance(arguments, dict) or function.get("name") != "submit_kernel":
                continue  # whatever the model wrote: TRL's own call reports it (round 10: a string raised here)
            code = arguments.get("code")
            if isinstance(code, str) and len(self.results) + len(self._prefetched) < self._max_submissions:
                self._prefetched.append((code, self._episode.submit(self.problem, code)))

    def _drop_prefetched(self) -> None:
        """Forget evaluations started for calls TRL did not make (its last turn's calls, say): cancelled where
        still queued; they count for nothing."""
        for _, future in self._prefetched:
            future.cancel()
        self._prefetched = []

    def _episode_reward(self) -> float:
        """The best (or, with ``score="last"``, the final) submission's reward; the format-error reward
        when there was none. (Not ``get_reward``: TRL would take that as the environment owning the reward,
        and the final-answer fallback of the factory's reward function could not run.)"""
        scored = self.results or ([self.final_result] if self.final_result is not None else [])
        if not scored:
            return float(self._reward(EvalResult(status=Status.FORMAT_ERROR.value, error="no submission"))[0])
        if self._score == "last":
            return float(self._reward(scored[-1])[0])
        # a later submission counts above the best only beyond timing noise (round 29: a no-op statement makes the
        # same kernel another program, whose timing draw the best of four would pay)
        return best_reward([(r, float(self._reward(r)[0])) for r in scored], penalised_flags_of(self._reward))


class _Prefetching(list):
    """A rollout's message list that starts evaluating a message's tool calls as TRL appends it."""

    def __init__(self, messages: list[Any], env: KernelToolEnv) -> None:
        super().__init__(messages)
        self.env = env

    def append(self, message: Any) -> None:
        super().append(message)
        self.env._prefetch(message)


def overlap_tool_calls(trainer: Any) -> Any:
    """Make the ``submit_kernel`` calls of different rollouts run at the same time under TRL's GRPOTrainer.

    TRL 1.16's tool loop calls one rollout's tools after another's, so a step's evaluations queue behind each
    other whatever the Evaluator's workers. Here every call a turn generates is submitted to the Evaluator as
    soon as the turn's messages exist: those of the first turn before TRL's loop starts, later ones as TRL
    appends each regenerated message to its rollout. TRL's own call then waits for its result. Calls TRL
    does not make (the last turn's, past ``max_tool_calling_iterations``) are dropped at the loop's end. A
    TRL whose loop works differently only loses the overlap. Returns ``trainer``."""
    inner = trainer._tool_call_loop

    def loop(prompts: Any, prompt_ids: Any, completion_ids: Any, completions: list[Any], *rest: Any) -> Any:
        envs: list[KernelToolEnv | None] = []
        for tools in getattr(trainer, "_sync_tool_dicts", None) or []:
            env = getattr(tools.get("submit_kernel"), "__self__", None)
            envs.append(env if isinstance(env, KernelToolEnv) else None)
        for i, env in enumerate(envs):
            if env is not None and i < len(completions) and isinstance(completions[i], list):
                for message in completions[i]:
                    env._prefetch(message)
                completions[i] = _Prefetching(completions[i], env)
        try:
            return inner(prompts, prompt_ids, completion_ids, completions, *rest)
        finally:
            for i, messages in enumerate(completions):
                if isinstance(messages, _Prefetching):
                    completions[i] = list(messages)  # plain lists leave: they are gathered and pickled later
            for env in envs:
                if env is not None:
                    env._drop_prefetched()

    trainer._tool_call_loop = loop
    return trainer


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

    def __call__(self) -> KernelToolEnv:
        return KernelToolEnv(self.evaluator, self.problems, self.reward, self.max_submissions, self.score)

    def reward_function(self, name: str = "kernel_tool") -> KernelToolReward:
        """The reward function to pass beside this factory: ``reward_funcs=[factory.reward_function()]``."""
        return KernelToolReward(self, name)

    def close(self) -> None:
        if self._own_evaluator:
            self.evaluator.close()


class KernelToolReward:
    """TRL's reward function for the tool environment: one score per rollout from its environment.

    A rollout that never called ``submit_kernel`` but ended with a fenced code block gets that answer
    evaluated once (models often answer in a block anyway), kept apart from the tool calls' results (so a second
    call neither evaluates it again nor counts it as a tool call); all such final answers of a batch are
    evaluated concurrently, and copies of one program share one verdict, as in the single-turn reward function.
    Logs, under ``name``, the single-turn reward function's metrics over every
    evaluation of the batch (submissions and final answers), plus ``submissions`` (tool calls evaluated per
    rollout) and ``tool_use`` (the share of rollouts that called the tool).
    """

    def __init__(self, factory: KernelToolEnvFactory, name: str = "kernel_tool") -> None:
        self.factory = factory
        self.__name__ = name

    def __call__(self, prompts: Any = None, completions: Sequence[Any] = (), *, environments: Sequence[Any] = (),
                 log_metric: Any = None, **_: Any) -> list[float]:
        from kb_gym.extract import extract_code
        from kb_gym.training.reward_function import batch_metrics, completion_text

        if len(environments) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(environments)} environments: pass this "
                             "reward function with environment_factory=<its factory>")
        called = [bool(env.results) for env in environments]
        final: list[tuple[KernelToolEnv, Future]] = []
        batch = DedupEvaluator(self.factory.evaluator)  # round 11: a group's copies got two timing draws
        for env, completion, used_tool in zip(environments, completions, called, strict=True):
            text = completion_text(completion)
            if (not used_tool and env.final_result is None and env.problem is not None
                    and extract_code(text).code is not None):
                final.append((env, batch.submit(env.problem, text)))
        for env, future in final:
            env.final_result = future.result()
        rewards = [env._episode_reward() for env in environments]
        if log_metric is not None:
            results = [r for env in environments
                       for r in [*env.results, *([env.final_result] if env.final_result is not None else [])]]
            # (no eval_seconds: the submissions were evaluated during generation, inside the tool calls)
            metrics = batch_metrics(results, parts=[self.factory.reward(r)[1] for r in results])
            n = max(1, len(environments))
            metrics["submissions"] = sum(len(env.results) for env in environments) / n
            metrics["tool_use"] = sum(called) / n
            for key, value in metrics.items():
                log_metric(f"{self.__name__}/{key}", value)
        return rewards
