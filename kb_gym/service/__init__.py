"""One evaluation service for every trainer rank and node, on Ray (``pip install kb-gym[ray]``).

    kb-gym serve --workers 4                 # on the Ray head: a named, detached service
    ev = RayEvaluator(address="auto")        # in each trainer rank: the Evaluator API, results from the service

One Ray actor per evaluation GPU (``num_gpus=1``), each owning a local Evaluator (warm judge, sandboxed
runners); one service actor spreads requests over them with back-pressure, replaces a worker that died
and retries its request once, and writes every result to the results store exactly once. Ray is imported
only here, and only when one of these is used.
"""

from __future__ import annotations

from typing import Any

RAY_MISSING = "the Ray backend needs Ray: pip install 'kb-gym[ray]' (or pip install 'ray[default]')"


def require_ray() -> Any:
    """The ray module, or one clear error naming the extra."""
    try:
        import ray
    except ImportError:
        raise ImportError(RAY_MISSING) from None
    return ray


def evaluator_address(spec: str | None) -> str | None:
    """Where evaluations run, from ``--evaluator``: None for ``"local"`` (or nothing), ``"auto"`` for ``"ray"`` /
    ``"ray:auto"`` (the current cluster), the address itself for ``"ray://HOST:PORT"``; ValueError otherwise.
    Needs no Ray: configs are checked with it before anything starts."""
    if not spec or spec == "local":
        return None
    if spec in ("ray", "ray:auto"):
        return "auto"
    if spec.startswith("ray://"):
        return spec
    raise ValueError(f"unknown evaluator {spec!r}: use 'local', 'ray' or 'ray://HOST:PORT'")


def __getattr__(name: str) -> Any:  # RayEvaluator, start_service, ... without importing Ray at `import kb_gym`
    if name in ("RayEvaluator", "connect"):
        from kb_gym.service import client

        return getattr(client, name)
    if name in ("start_service", "stop_service", "SERVICE_NAME", "NAMESPACE"):
        from kb_gym.service import actors

        return getattr(actors, name)
    raise AttributeError(name)
