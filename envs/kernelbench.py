"""KernelBenchEnv: one KernelBench task per episode; an action is kernel source, step() evaluates it."""

from __future__ import annotations

import dataclasses
import operator
from concurrent.futures import Future
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces

from kb_gym.config import EvalConfig
from kb_gym.envs.spaces import CodeText
from kb_gym.evaluator import MAX_TEXT_CHARS, Evaluator
from kb_gym.extract import extract_code
from kb_gym.problems import Problem, ProblemError, exclude_problems, get_problem, load_problems
from kb_gym.problems.sizes import check_size, size_for_devices
from kb_gym.result import EvalResult
from kb_gym.rewards import MultiTurnReward, is_correct, is_penalised, valid_speedup
from kb_gym.rewards.multi_turn import MODES as REWARD_MODES
from kb_gym.training.dedup import DedupEvaluator

RESET_OPTIONS = ("problem_id", "name", "level", "problem")
RENDER_REFERENCE_LINES = 12
_OPTIONAL_INT_FIELDS = ("problem_id", "level", "custom_kernel_launches")


class SharedEvaluator:
    """A handle to an :class:`~kb_gym.Evaluator` that several environments share.

    ``gym.make`` stores its keyword arguments in ``env.spec`` and ``env.spec.make()`` deep-copies
    them; an Evaluator (threads, locks, worker processes) cannot be copied, and a copy would not be
    shared anyway. This handle deep-copies to itself, so an env re-made from its spec shares the
    same evaluator. The env wraps a passed Evaluator in it by itself; users need not.
    """

    __slots__ = ("evaluator",)

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    def __copy__(self) -> SharedEvaluator:
        return self

    def __deepcopy__(self, memo: dict) -> SharedEvaluator:
        return self

    def __reduce__(self) -> Any:
        raise TypeError("an Evaluator cannot be sent to another process (e.g. an AsyncVectorEnv worker); "
                        "leave evaluator=None there and each environment creates its own")

    def __repr__(self) -> str:
        return f"SharedEvaluator(devices={self.evaluator.devices!r})"


class KernelBenchEnv(gym.Env[dict[str, str], str]):
    """Write a faster GPU kernel for a PyTorch reference program (KernelBench).

    ## Description

    Each episode is one KernelBench task: a PyTorch reference ``Model`` with ``get_inputs()`` and
    ``get_init_inputs()``. The agent answers with source code that defines ``ModelNew``, a
    replacement running custom kernels (Triton, CUDA through ``load_inline``, ...). ``step()``
    hands the answer to an :class:`~kb_gym.Evaluator`, which extracts the code, compiles it, checks
    it against the reference on fresh random inputs and times it against the PyTorch baseline, all
    in a sandboxed worker process, never in the environment's own process. Levels: 1 = single
    operators, 2 = fusable operator chains, 3 = whole architectures. With ``max_turns > 1`` the
    agent refines its kernel over several turns, seeing the feedback on each attempt.

    ## Action Space

    :class:`~kb_gym.envs.CodeText`: any ``str`` of at most 1,000,000 characters, either raw Python
    source defining ``class ModelNew`` or a model completion holding it in a fenced ````python``
    block (the last such block is taken). Text without a ``ModelNew`` costs milliseconds: it gets
    ``format_error`` without reaching a worker.

    ## Observation Space

    ``spaces.Dict`` with two :class:`~kb_gym.envs.CodeText` entries: ``"reference"``, the problem's
    reference source, and ``"feedback"``, the evaluator's feedback on the previous attempt
    (``""`` after ``reset``): the error, the mismatch, or the measured runtimes and speedup.
    :mod:`kb_gym.prompts` turns an observation into a prompt (``env.unwrapped.prompt()``).

    ## Rewards

    ``reward`` names a preset of :mod:`kb_gym.rewards` (``"default"``, ``"fast_p"``, ``"kevin"``,
    ``"drkernel"``, ``"fast_p:1.5"``...) or is a callable ``EvalResult -> (float, dict)``. The
    ``default`` preset is shaped: format error -1 < compile error -0.5 < runtime error -0.3 <
    incorrect -0.1 < correct 0.2..1.0 (0.4 + 0.2 * clip(log2 speedup, -1, 3)); integrity flags
    remove the speed credit. Over several turns, ``reward_mode`` shapes the per-turn reward:
    ``"improvement"`` (default) pays ``max(0, reward - best reward so far)`` after the first turn,
    so an episode's rewards sum to its best reward; ``"per_step"`` pays each turn's reward as is. A program
    submitted again within an episode gets its first verdict (not a new timing draw).

    ## Starting State

    ``reset()`` picks a problem uniformly at random with ``self.np_random`` (seeded by
    ``reset(seed=...)``), or the one named by ``options``: ``{"problem_id": 3}`` (plus ``"level"``
    where ids repeat across levels), ``{"name": "3_RowSoftmax"}`` or ``"level1/3_RowSoftmax"``,
    ``{"level": 2}`` (random within a level), or ``{"problem": Problem(...)}``.

    ## Episode End

    A step *solves* the task when the kernel is correct, carries no integrity flag that removes
    speed credit, and, when ``target_speedup`` is set, reaches ``speedup >= target_speedup``.
    Single-turn (``max_turns=1``, a contextual bandit): every step terminates. Multi-turn: the
    episode terminates when a step solves the task, and is truncated after ``max_turns`` turns
    otherwise. Pass ``target_speedup=math.inf`` to always use every turn (pure refinement).
    Stepping an ended episode raises ``RuntimeError``.

    ## Arguments

    ``dataset`` ("official": KB_GYM_DATASET or the Hugging Face dataset; "builtin" works offline;
    "synthetic" or "synthetic:N[:SEED]": generated problems;
    a folder, a .jsonl/.parquet file or a list of Problems), ``level`` (1, 2, 3 or None),
    ``size`` ("auto", "cpu", "gpu": the problem size; "auto" is "gpu" when every device of the
    evaluator is a CUDA GPU, else "cpu"; the official set has only its GPU size), ``split`` (None for
    every problem, "train" or "test": the fixed split of docs/problems.md; the official set is all
    "test", and "train" on it needs ``allow_official_train=True``),
    ``subset`` (problem ids or names to keep), ``exclude`` (problem keys to leave out, e.g.
    ``kb_gym.audit.passable_problems("audit.jsonl")``), ``device`` ("auto", "cpu", "cuda", "cuda:1"; used
    when the env creates its evaluator), ``max_turns``, ``reward``, ``reward_kwargs``,
    ``reward_mode``, ``target_speedup``, ``baseline`` ("eager" or "compile"), ``precision``
    ("fp32", "fp16", "bf16"), ``tolerance`` (a preset name), ``integrity`` (the policy name),
    ``evaluator`` (an Evaluator to share; the env never closes it), ``eval_config`` (an EvalConfig
    to start from), ``results_path`` (for the env's own evaluator; False records nothing),
    ``render_mode`` ("ansi" or None), and any EvalConfig field as a keyword (``trials=3``). See
    docs/environments.md.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}
    _spec: gym.envs.registration.EnvSpec | None = None

    def __init__(self, dataset: Any = "official", level: int | None = None, *, size: str = "auto",
                 split: str | None = None, allow_official_train: bool = False,
                 subset: list[int | str] | tuple[int | str, ...] | None = None,
                 exclude: list[str] | tuple[str, ...] | None = None,
                 device: str = "auto", max_turns: int = 1, reward: Any = "default",
                 reward_kwargs: dict[str, Any] | None = None, reward_mode: str = "improvement",
                 target_speedup: float | None = None, baseline: str | None = None,
                 precision: str | None = None, tolerance: str | None = None, integrity: str | None = None,
                 evaluator: Evaluator | SharedEvaluator | None = None, eval_config: EvalConfig | None = None,
                 results_path: Any = None, render_mode: str | None = None, **eval_overrides: Any) -> None:
        if isinstance(max_turns, bool) or _as_int(max_turns, "max_turns") < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        max_turns = _as_int(max_turns, "max_turns")
        if reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {', '.join(REWARD_MODES)}, got {reward_mode!r}")
        if target_speedup is not None and not (float(target_speedup) > 0):
            raise ValueError(f"target_speedup must be a positive number or None, got {target_speedup!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, "
                             f"got {render_mode!r}")
        if isinstance(evaluator, SharedEvaluator):
            evaluator = evaluator.evaluator
        if evaluator is not None and not isinstance(evaluator, Evaluator):
            raise TypeError(f"evaluator must be a kb_gym.Evaluator or None, got {type(evaluator).__name__}")

        self.level = level
        devices = evaluator.devices if evaluator is not None else device
        self.size = size_for_devices(devices) if check_size(size) == "auto" else size
        self.split = split
        problems = load_problems(dataset, level, size=size, split=split, device=devices,
                                 allow_official_train=allow_official_train)
        self.problems = exclude_problems(_select(problems, subset), exclude)
        if not self.problems:
            raise ProblemError("exclude leaves no problems")
        too_long = [p.key for p in self.problems if len(p.code) > MAX_TEXT_CHARS]
        if too_long:
            raise ProblemError(f"reference code longer than {MAX_TEXT_CHARS:,} characters: {', '.join(too_long)}")
        self.device = device
        self.max_turns = max_turns
        self.reward_mode = reward_mode
        self.target_speedup = None if target_speedup is None else float(target_speedup)
        self.render_mode = render_mode
        self.results_path = results_path
        self._reward = MultiTurnReward(reward, mode=reward_mode, **(reward_kwargs or {}))

        base = eval_config or (evaluator.config if evaluator is not None else EvalConfig())
        changes = {k: v for k, v in (("baseline", baseline), ("precision", precision), ("tolerance", tolerance),
                                     ("integrity", integrity)) if v is not None}
        changes.update(eval_overrides)
        try:
            self.eval_config = base.replace(**changes) if changes else base
        except TypeError as exc:  # an unknown keyword: say which ones exist
            fields = ", ".join(f.name for f in dataclasses.fields(EvalConfig))
            raise TypeError(f"{exc}; keyword overrides must be EvalConfig fields: {fields}") from None
        self._evaluator = evaluator
        self._owns_evaluator = False

        self.observation_space = spaces.Dict({"reference": CodeText(MAX_TEXT_CHARS),
                                              "feedback": CodeText(MAX_TEXT_CHARS)})
        self.action_space = CodeText(MAX_TEXT_CHARS)

        self.problem: Problem | None = None
        self.turn = 0
        self.last_result: EvalResult | None = None
        self.last_reward: float | None = None
        self.last_code: str | None = None
        self.best_speedup: float | None = None
        self._feedback = ""
        self._done = False
        self._pending: tuple[Any, Future] | None = None
        self._episode: DedupEvaluator | None = None  # this episode's evaluations, by program (made at first use)

    # --- the spec keeps a shared evaluator copyable (see SharedEvaluator) ------------------------
    @property
    def spec(self) -> gym.envs.registration.EnvSpec | None:  # type: ignore[override]
        return self._spec

    @spec.setter
    def spec(self, value: gym.envs.registration.EnvSpec | None) -> None:
        if value is not None and isinstance(value.kwargs.get("evaluator"), Evaluator):
            kwargs = {**value.kwargs, "evaluator": SharedEvaluator(value.kwargs["evaluator"])}
            value = dataclasses.replace(value, kwargs=kwargs)
        self._spec = value

    @property
    def evaluator(self) -> Evaluator:
        """The shared evaluator, or the env's own, created on first use (no worker starts until a
        candidate needs one)."""
        if self._evaluator is None:
            self._evaluator = Evaluator(self.device, config=self.eval_config, results_path=self.results_path)
            self._owns_evaluator = True
        return self._evaluator

    @property
    def best_reward(self) -> float | None:
        """The best unshaped reward of the episode so far (None before the first step)."""
        return self._reward.best_so_far

    # --- Gymnasium API ----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, str], dict[str, Any]]:
        super().reset(seed=seed)
        self.problem = self._choose_problem(options)
        self.turn = 0
        self.last_result = None
        self.last_reward = None
        self.last_code = None
        self.best_speedup = None
        self._feedback = ""
        self._done = False
        self._pending = None
        self._episode = None
        self._reward.reset()
        info = {"problem_id": self.problem.id, "problem_name": self.problem.name, "level": self.problem.level,
                "problem_key": self.problem.key, "turn": 0, "max_turns": self.max_turns}
        return self._observation(), info

    def step(self, action: str) -> tuple[dict[str, str], float, bool, bool, dict[str, Any]]:
        self._check_can_step()
        future = self._take_prefetched(action) or self._submit(action)
        result: EvalResult = future.result()
        self.turn += 1
        reward, components = self._reward(result)
        solved = self._solved(result)
        # the reward's own flag set, not the default one: a step the reward penalised is neither solved nor a best
        # speedup (red team round 30: a launch-bound 3x paid -0.1 ended the episode as solved)
        if is_correct(result) and not is_penalised(result, self._reward.penalised_flags):
            speedup = valid_speedup(result.speedup)
            if speedup is not None and (self.best_speedup is None or speedup > self.best_speedup):
                self.best_speedup = speedup
        terminated = solved or self.max_turns == 1
        truncated = not terminated and self.turn >= self.max_turns
        self._done = terminated or truncated
        self._feedback = result.feedback
        self.last_result = result
        self.last_reward = float(reward)
        self.last_code = _extracted(action)

        info = _result_info(result)
        info.update(reward_components=dict(components), turn=self.turn, max_turns=self.max_turns,
                    solved=solved, best_speedup=self.best_speedup, best_reward=self.best_reward,
                    problem_key=self.problem.key, code=self.last_code)
        return self._observation(), float(reward), terminated, truncated, info

    def render(self) -> str | None:
        if self.render_mode is None:
            gym.logger.warn("render() needs render_mode='ansi', e.g. gym.make(id, render_mode='ansi')")
            return None
        return self._summary()

    def close(self) -> None:
        self._pending = None
        if self._owns_evaluator and self._evaluator is not None:
            self._evaluator.close()
            self._evaluator = None
            self._owns_evaluator = False
        super().close()

    # --- extras -----------------------------------------------------------------------------------
    def prefetch(self, action: str) -> None:
        """Submit ``action`` for evaluation now; the next ``step()`` with an equal action waits for
        it instead of submitting again. Lets a vector env evaluate a batch concurrently
        (:class:`~kb_gym.envs.KernelBenchVectorEnv`)."""
        self._check_can_step()
        self._pending = (action, self._submit(action))

    def prompt(self, backend: str = "triton", *, chat: bool = False, include_previous: bool = True,
               **kwargs: Any) -> str | list[dict[str, str]]:
        """The current observation as a prompt string, or chat messages when ``chat=True``
        (:mod:`kb_gym.prompts`); ``include_previous`` adds the last attempt's code."""
        from kb_gym.prompts import build_messages, build_prompt

        if self.problem is None:
            raise RuntimeError("call reset() before prompt()")
        previous = self.last_code if include_previous and self._feedback else None
        build = build_messages if chat else build_prompt
        return build(self.problem.code, self._feedback, backend, previous_code=previous, **kwargs)

    # --- internals --------------------------------------------------------------------------------
    def _check_can_step(self) -> None:
        if self.problem is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode is over (terminated or truncated); call reset() before step()")

    def _submit(self, action: Any) -> Future:
        """A program submitted again in one episode gets its first evaluation: timing it again buys only noise,
        and the best of several draws (``"improvement"``) paid for it (round 10)."""
        assert self.problem is not None
        if self._episode is None:
            self._episode = DedupEvaluator(self.evaluator)
        return self._episode.submit(self.problem, action, config=self.eval_config)

    def _take_prefetched(self, action: Any) -> Future | None:
        pending, self._pending = self._pending, None
        if pending is not None and (pending[0] is action or (type(pending[0]) is type(action)
                                                             and pending[0] == action)):
            return pending[1]
        return None

    def _solved(self, result: EvalResult) -> bool:
        if not is_correct(result) or is_penalised(result, self._reward.penalised_flags):
            return False
        if self.target_speedup is None:
            return True
        speedup = valid_speedup(result.speedup)
        return speedup is not None and speedup >= self.target_speedup

    def _choose_problem(self, options: dict[str, Any] | None) -> Problem:
        options = dict(options or {})
        unknown = sorted(set(options) - set(RESET_OPTIONS))
        if unknown:
            raise ValueError(f"unknown reset option(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(RESET_OPTIONS)}")
        if options.get("problem") is not None:
            problem = options["problem"]
            if not isinstance(problem, Problem):
                raise TypeError(f"options['problem'] must be a kb_gym.Problem, got {type(problem).__name__}")
            return problem
        level = options.get("level")
        if level is not None:
            level = _as_int(level, "level")
        if options.get("name") is not None:
            return get_problem(self.problems, name=str(options["name"]), level=level)
        if options.get("problem_id") is not None:
            return get_problem(self.problems, problem_id=_as_int(options["problem_id"], "problem_id"), level=level)
        candidates = self.problems if level is None else [p for p in self.problems if p.level == level]
        if not candidates:
            raise ProblemError(f"no problem at level {level} among {len(self.problems)} problems")
        return candidates[int(self.np_random.integers(len(candidates)))]

    def _observation(self) -> dict[str, str]:
        assert self.problem is not None
        return {"reference": self.problem.code, "feedback": self._feedback}

    def _summary(self) -> str:
        if self.problem is None:
            return "KernelBench: no episode yet; call reset()."
        lines = self.problem.code.strip("\n").splitlines()
        head = "\n".join(lines[:RENDER_REFERENCE_LINES])
        extra = len(lines) - RENDER_REFERENCE_LINES
        more = f"\n... ({extra} more lines)" if extra > 0 else ""
        status = f"turn {self.turn}/{self.max_turns}"
        if self.last_result is not None:
            r = self.last_result
            speed = f", speedup {r.speedup:.3f}x" if r.speedup is not None else ""
            status += f" | last: {r.status}{speed}, reward {self.last_reward:+.3f}"
            best = f"{self.best_speedup:.3f}x" if self.best_speedup is not None else "-"
            status += f" | best reward {self.best_reward:+.3f}, best speedup {best}"
            if self._done:
                status += " | episode over"
        feedback = self._feedback or "(no attempt yet)"
        return (f"KernelBench {self.problem.key} | {status}\n--- reference ---\n{head}{more}\n"
                f"--- feedback ---\n{feedback}\n")


def _result_info(result: EvalResult) -> dict[str, Any]:
    """The EvalResult as an info dict that Gymnasium's vector envs can batch.

    A vector env stores each info key in an array typed by the first env's value, so an ``int``
    in one env and ``None`` in another breaks it. Integer fields that are ``None`` (not measured)
    are left out, and so are ``None`` values inside the bookkeeping dicts (correctness, hardware,
    worker, stage_seconds): absent and ``None`` mean the same there.
    """
    info = result.to_dict()
    for key in _OPTIONAL_INT_FIELDS:
        if info.get(key, 0) is None:
            del info[key]
    for key in ("correctness", "stage_seconds", "hardware", "worker"):
        info[key] = _drop_none(info[key])
    return info


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: _drop_none(v) if isinstance(v, dict) else v for k, v in data.items() if v is not None}


def _as_int(value: Any, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an integer, got {value!r}") from None


def _extracted(action: Any) -> str | None:
    if not isinstance(action, str) or len(action) > MAX_TEXT_CHARS:
        return None
    return extract_code(action).code


def _select(problems: list[Problem], subset: Any) -> list[Problem]:
    if subset is None:
        if not problems:
            raise ProblemError("the dataset holds no problems (at this level)")
        return problems
    if isinstance(subset, (str, int)):
        subset = [subset]
    chosen: list[Problem] = []
    for item in subset:
        if isinstance(item, Problem):
            problem = item
        elif isinstance(item, str):
            problem = get_problem(problems, name=item)
        else:
            problem = get_problem(problems, problem_id=_as_int(item, "a subset entry"))
        if problem not in chosen:
            chosen.append(problem)
    if not chosen:
        raise ProblemError("subset selects no problems")
    return chosen


__all__ = ["KernelBenchEnv", "SharedEvaluator"]
