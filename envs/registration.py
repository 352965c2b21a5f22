"""Register the KernelBench environments with Gymnasium (``import kb_gym`` does it)."""

from __future__ import annotations

ENTRY_POINT = "kb_gym.envs.kernelbench:KernelBenchEnv"

ENV_IDS: dict[str, dict] = {
    "KernelBench-L1-v0": {"level": 1},
    "KernelBench-L2-v0": {"level": 2},
    "KernelBench-L3-v0": {"level": 3},
    "KernelBench-v0": {"level": None},
    "KernelBench-Synthetic-v0": {"dataset": "synthetic", "level": None},
}
"""Environment ids and the keyword arguments they are registered with."""


def register_envs() -> None:
    """Register every id in :data:`ENV_IDS`; idempotent (ids already registered are left alone).

    ``nondeterministic=True``: timings vary from run to run. No ``max_episode_steps``: the env
    ends episodes itself after ``max_turns`` turns.
    """
    from gymnasium.envs.registration import register, registry

    for env_id, kwargs in ENV_IDS.items():
        if env_id in registry:
            continue
        register(id=env_id, entry_point=ENTRY_POINT, nondeterministic=True, kwargs=dict(kwargs))
