"""Multi-turn GRPO through TRL's ``rollout_func``: generate, evaluate, feed the verdict back, generate again.

Each rollout is a conversation of up to ``max_turns`` answers. After every turn all rollouts' answers are
evaluated concurrently; the evaluator's feedback becomes the next user turn. The completion TRL trains on is
every turn's generated tokens with the feedback tokens between them, and ``env_mask`` marks the feedback (0)
so it carries no loss. Per-turn rewards and the episode reward (``"best"`` turn, ``"last"`` turn, or
``"discounted"``: the sum of gamma^t r_t, Kevin's return from the first turn) go to the reward function as
extra fields.

    rollout = KernelMultiTurnRollout(dataset=problems, max_turns=3)
    trainer = GRPOTrainer(model=..., args=..., train_dataset=build_prompt_dataset(problems),
                          rollout_func=rollout, reward_funcs=[rollout.reward_function()])

Generation goes through the trainer's own single-turn generator (``GRPOTrainer._generate_single_turn`` in TRL
1.16: transformers, or vLLM in server or colocate mode where the trainer is configured for it), one call
per turn for every rollout still running.
"""

from __future__ import annotations

import math
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

EPISODE_REWARDS = ("best", "last", "discounted")


class KernelMultiTurnRollout:
    """TRL's ``rollout_func`` for multi-turn kernel writing (see the module docstring).

    Args:
        dataset: the problems the prompts were built from (anything ``load_problems`` takes); a prompt's
            problem is the one whose reference code its last user message holds.
        max_turns: answers per rollout; a rollout also stops when the next turn would not fit in the
            trainer's ``max_completion_length``.
        episode: how the turns' rewards make the episode's: ``"best"``, ``"last"`` or ``"discounted"``.
        gamma: the discount of ``"discounted"``.
        reward, reward_kwargs: the reward preset of every turn.
        evaluator: an Evaluator (or RayEvaluator) to share; else one on ``devices`` with ``eval_config``.
    """

    def __init__(self, dataset: str | Sequence[Problem] = "builtin", *, max_turns: int = 3, episode: str = "best",
                 gamma: float = 0.4, reward: str = "default", reward_kwargs: dict[str, Any] | None = None,
                 evaluator: Any = None, devices: str | Sequence[str] = "auto", eval_config: EvalConfig | None = None,
                 size: str = "auto") -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        if episode not in EPISODE_REWARDS:
            raise ValueError(f"episode must be one of {EPISODE_REWARDS}, got {episode!r}")
        self.max_turns, self.episode, self.gamma = max_turns, episode, gamma
        self.reward = get_reward(reward, **(reward_kwargs or {}))
        self._own_evaluator = evaluator is None
        where = evaluator.devices if evaluator is not None else devices
        self.problems = list(load_problems(dataset, size=size, device=where))
        self.evaluator = evaluator or Evaluator(devices, config=eval_config)

    def close(self) -> None:
        if self._own_evaluator:
            self.evaluator.close()

    def problem_of(self, prompt: Any) -> Problem | None:
        text = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
        return next((p for p in self.problems if p.code.strip() in text), None)

    def episode_reward(self, turn_rewards: Sequence[float], turn_results: Sequence[EvalResult] | None = None) -> float:
        """The episode's reward from its turns'; with ``turn_results``, ``"best"`` counts a later turn above the
        best only beyond timing noise (rewards.multi_turn.best_reward)."""
        if not turn_rewards:
            return float(self.reward(EvalResult(status=Status.FORMAT_ERROR.value, error="no answer"))[0])
        if self.episode == "last":
            return float(turn_rewards[-1])
        if self.episode == "discounted":
            # a rollout the completion budget ended early counts its last reward for the turns it did not get:
            # padding an answer to end the rollout then dodges no later turn's penalty (round 29)
            padded = list(turn_rewards) + [turn_rewards[-1]] * max(0, self.max_turns - len(turn_rewards))
            return float(sum(self.gamma ** t * r for t, r in enumerate(padded)))
        if turn_results is not None and len(turn_results) == len(turn_rewards):
            return best_reward(list(zip(turn_results, turn_rewards, strict=True)), penalised_flags_of(self.reward))
        return float(max(turn_rewards))

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        generate = getattr(trainer, "_generate_single_turn", None)
        if generate is None:
            raise RuntimeError("KernelMultiTurnRollout needs TRL's GRPOTrainer._generate_single_turn (TRL 1.16)")
        tokenizer = trainer.processing_class
        if not isinstance(prompts[0], list):
            raise ValueError("multi-turn rollouts need chat prompts: build_prompt_dataset(..., conversational=True)")
        problems = [self.problem_of(p) for p in prompts]
        prompt_ids = [_ids(tokenizer, _render(tokenizer, list(p), generation_prompt=True)) for p in prompts]
        context = [list(ids) for ids in prompt_ids]
        completion: list[list[int]] = [[] for _ in prompts]
        mask: list[list[int]] = [[] for _ in prompts]
        turn_rewards: list[list[float]] = [[] for _ in prompts]
        turn_results: list[list[EvalResult]] = [[] for _ in prompts]
        budget = int(getattr(trainer, "max_completion_length", None) or 1024)
        active = list(range(len(prompts)))
        # Each answer gets an equal share of the completion budget (the feedback between them takes some too):
        # the trainer's generation config is lowered for the rollout and put back after.
        config = getattr(trainer, "generation_config", None)
        saved = getattr(config, "max_new_tokens", None)
        if config is not None:
            config.max_new_tokens = max(1, budget // self.max_turns)
        try:
            self._turns(generate, tokenizer, problems, context, completion, mask, turn_rewards, turn_results, budget,
                        active)
        finally:
            if config is not None:
                config.max_new_tokens = saved
        episode = [self.episode_reward(r, rs) for r, rs in zip(turn_rewards, turn_results, strict=True)]
        return {"prompt_ids": prompt_ids, "completion_ids": completion, "logprobs": None, "env_mask": mask,
                "kernel_turn_rewards": turn_rewards, "kernel_episode_reward": episode,
                "kernel_turn_statuses": [[r.status for r in rs] for rs in turn_results]}

    def _turns(self, generate: Any, tokenizer: Any, problems: list[Problem | None], context: list[list[int]],
               completion: list[list[int]], mask: list[list[int]],
               turn_rewards: list[list[float]], turn_results: list[list[EvalResult]], budget: int,
               active: list[int]) -> None:
        # a program answered again in one rollout gets its first verdict, not another timing draw (round 10)
        episodes = [DedupEvaluator(self.evaluator) for _ in problems]
        for turn in range(self.max_turns):
            generated, _ = generate([context[i] for i in active], None, {}, 1)
            texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
            for i, ids in zip(active, generated, strict=True):
                completion[i] += list(ids)
                mask[i] += [1] * len(ids)
                context[i] += list(ids)
            # every running rollout's answer evaluated at once: the workers of every device share them
            pending: list[tuple[int, Future | EvalResult]] = [
                (i, episodes[i].submit(problems[i], texts[k]) if problems[i] is not None
                 else EvalResult(status=Status.FORMAT_ERROR.value, error="no problem matches this prompt"))
                for k, i in enumerate(active)]
            for i, item in pending:
                result = item.result() if isinstance(item, Future) else item
                turn_results[i].append(result)
                turn_rewards[i].append(float(self.reward(result)[0]))
            if turn == self.max_turns - 1:
                break
            still = []
            for i in active:
                # the feedback turn's ids only: the template's text around it is rendered once (_suffix_parts)
                suffix = _suffix_ids(tokenizer, _feedback_text(turn_results[i][-1]))
                if len(completion[i]) + len(suffix) >= budget:
                    continue  # no room for another answer: this rollout ends here
                completion[i] += suffix
                mask[i] += [0] * len(suffix)
                context[i] += suffix
                still.append(i)
            active = still
            if not active:
                break

    def reward_function(self, name: str = "kernel_multi_turn") -> Any:
        """The reward function to pass beside this rollout: the episode reward it computed, and per-turn
        metrics (``<name>/turn<k>/reward``, ``<name>/turn<k>/correct``, ``<name>/turns``) through log_metric."""
        rollout = self

        def reward(completions: Sequence[Any] = (), kernel_episode_reward: Sequence[float] | None = None,
                   kernel_turn_rewards: Sequence[Sequence[float]] | None = None,
                   kernel_turn_statuses: Sequence[Sequence[str]] | None = None, log_metric: Any = None,
                   **_: Any) -> list[float]:
            if kernel_episode_reward is None:
                raise ValueError("no kernel_episode_reward column: pass rollout_func=<this rollout> to the trainer")
            if log_metric is not None:
                turns = kernel_turn_rewards or []
                log_metric(f"{name}/turns", sum(len(t) for t in turns) / max(1, len(turns)))
                for k in range(rollout.max_turns):
                    at_k = [t[k] for t in turns if len(t) > k and math.isfinite(t[k])]
                    correct = [s[k] == Status.CORRECT.value for s in kernel_turn_statuses or [] if len(s) > k]
                    if at_k:
                        log_metric(f"{name}/turn{k + 1}/reward", sum(at_k) / len(at_k))
                    if correct:
                        log_metric(f"{name}/turn{k + 1}/correct", sum(correct) / len(correct))
            return [float(r) for r in kernel_episode_reward]

        reward.__name__ = name
        return reward


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


_PLACEHOLDER = "KBGYMFEEDBACKPLACEHOLDER"
# a fixed conversation the feedback turn is rendered after: what the template adds for a user turn and the next
# assistant header depends on the template only, never on what the policy wrote (round 29: templates that drop a
# <think> block from an earlier assistant turn rendered the real conversation as no extension of itself, and one
# answer holding "</think>" raised out of the rollout for the whole batch)
_SAMPLE = [{"role": "user", "content": "Write a kernel."}, {"role": "assistant", "content": "Here it is."}]


def _suffix_parts(tokenizer: Any) -> tuple[str, str]:
    """The template's text before and after a feedback turn's content (with the next assistant header)."""
    cached = getattr(tokenizer, "_kb_gym_feedback_parts", None)
    if cached is not None and cached[0] == tokenizer.chat_template:
        return cached[1]
    base = _render(tokenizer, _SAMPLE, generation_prompt=False)
    full = _render(tokenizer, [*_SAMPLE, {"role": "user", "content": _PLACEHOLDER}], generation_prompt=True)
    if not full.startswith(base) or full.count(_PLACEHOLDER) != 1:
        raise ValueError("this chat template does not render a longer conversation as an extension of the shorter "
                         "one; multi-turn rollouts need one that does")
    before, after = full[len(base):].split(_PLACEHOLDER)
    try:
        tokenizer._kb_gym_feedback_parts = (tokenizer.chat_template, (before, after))
    except AttributeError:  # a tokenizer that takes no new attributes: rendered again next time
        pass
    return before, after


def _suffix_ids(tokenizer: Any, content: str) -> list[int]:
    """The ids the chat template adds for a user turn holding ``content`` and the next assistant header. The
    template's own text is tokenized with its control tokens; ``content`` (the candidate's messages within it) is
    defused first, so that nothing it holds becomes one (round 29)."""
    before, after = _suffix_parts(tokenizer)
    return _ids(tokenizer, before) + _ids(tokenizer, _defused(tokenizer, content)) + _ids(tokenizer, after)


def _defused(tokenizer: Any, text: str) -> str:
    """``text`` with every string this tokenizer reads as one added (control) token broken by a space after its
    first character (feedback.defused breaks the common ones for every tokenizer; this is the tokenizer's own)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    tokens = {str(getattr(t, "content", t)) for t in added.values()} | set(getattr(tokenizer, "all_special_tokens", []))
    for token in sorted((t for t in tokens if len(t) > 1), key=len, reverse=True):
        if token in text:
            text = text.replace(token, token[0] + " " + token[1:])
    return text


def _feedback_text(result: EvalResult) -> str:
    feedback = (result.feedback or result.error or "").strip()
    return (f"Evaluation of your answer: {result.status}.\n{feedback}\n\nImprove it: fix what is wrong, or make the "
            "kernel faster if it is correct. Answer with the complete program in a single ```python code block.")
