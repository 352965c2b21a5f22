"""KernelBenchVectorEnv: a SyncVectorEnv whose sub-environments share one Evaluator and whose
batch is evaluated concurrently.

Gymnasium's SyncVectorEnv steps its environments one after another, so with a shared evaluator
only one worker (one GPU) is busy at a time. Here every action of the batch is submitted to the
evaluator first (``KernelBenchEnv.prefetch``), then the environments step as usual, each waiting
for its own result: the batch spreads over all of the evaluator's devices. Everything else
(autoreset, info batching) is SyncVectorEnv's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import iterate

from kb_gym.envs.kernelbench import KernelBenchEnv
from kb_gym.evaluator import Evaluator


class KernelBenchVectorEnv(SyncVectorEnv):
    """SyncVectorEnv of KernelBench environments that evaluates each batch concurrently.

    Args:
        env_fns: functions that create the environments (they should share one Evaluator).
        evaluator: an Evaluator this vector env owns and closes in ``close()`` (None: it owns none).
        **kwargs: SyncVectorEnv's (``copy``, ``observation_mode``, ``autoreset_mode``).
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], *, evaluator: Evaluator | None = None,
                 **kwargs: Any) -> None:
        super().__init__(env_fns, **kwargs)
        self._owned_evaluator = evaluator

    def step(self, actions: Any) -> Any:
        for i, (action, env) in enumerate(zip(iterate(self.action_space, actions), self.envs, strict=True)):
            if self.autoreset_mode == AutoresetMode.NEXT_STEP and self._autoreset_envs[i]:
                continue  # this env resets instead of stepping
            base = env.unwrapped
            if isinstance(base, KernelBenchEnv) and base.problem is not None and not base._done:
                base.prefetch(action)
        return super().step(actions)

    def close_extras(self, **kwargs: Any) -> None:
        super().close_extras(**kwargs)
        if self._owned_evaluator is not None:
            self._owned_evaluator.close()
            self._owned_evaluator = None


def make_vector_env(num_envs: int, env_id: str = "KernelBench-v0", *, evaluator: Evaluator | None = None,
                    device: str = "auto", results_path: Any = None,
                    vector_kwargs: dict[str, Any] | None = None, **env_kwargs: Any) -> KernelBenchVectorEnv:
    """``num_envs`` environments of ``env_id`` sharing one Evaluator, stepped concurrently.

    With ``evaluator=None`` one is created on ``device`` (one worker per GPU) and closed with the
    vector env; a passed evaluator is shared and left open. ``env_kwargs`` go to every
    ``gym.make(env_id, ...)`` call (``dataset=``, ``max_turns=``, ``reward=``...).
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    owned = None
    if evaluator is None:
        owned = evaluator = Evaluator(device, results_path=results_path)
    shared = evaluator

    def make_one() -> gym.Env:
        return gym.make(env_id, evaluator=shared, **env_kwargs)

    try:
        return KernelBenchVectorEnv([make_one] * num_envs, evaluator=owned, **(vector_kwargs or {}))
    except BaseException:
        if owned is not None:
            owned.close()
        raise


__all__ = ["KernelBenchVectorEnv", "make_vector_env"]
