"""RayEvaluator: the Evaluator's API over the Ray evaluation service, for trainer ranks and notebooks."""

from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Any

from kb_gym.config import EvalConfig, resolve_config
from kb_gym.evaluator import EvaluationAPI
from kb_gym.problems import Problem
from kb_gym.result import EvalResult
from kb_gym.service import evaluator_address, require_ray
from kb_gym.service.actors import NAMESPACE, SERVICE_NAME, start_service


class RayEvaluator(EvaluationAPI):
    """``evaluate``, ``submit``, ``evaluate_many`` and ``close`` as on :class:`kb_gym.Evaluator`, answered by
    the named service on a Ray cluster.

    Args:
        address: the cluster (``"auto"``, ``"ray://HOST:10001"``, ``None``: a local cluster started here).
        name: the service's name; every client of one name shares its workers.
        config: the EvalConfig (or preset name) this client's evaluations use unless a call passes one.
        start: start the service when none of that name runs (owned by this process unless ``detached``).
        workers: workers for a service started here (default: one per cluster GPU, else one), each holding
            ``gpus_per_worker`` GPUs (default: 1 where the cluster has GPUs, else 0).
    """

    def __init__(self, address: str | None = "auto", *, name: str = SERVICE_NAME,
                 config: EvalConfig | str | None = None, start: bool = True, workers: int | None = None,
                 detached: bool = False, results_path: str | None = None, gpus_per_worker: float | None = None,
                 **overrides: Any) -> None:
        self.ray = require_ray()
        self.config = resolve_config(config, **overrides)
        if not self.ray.is_initialized():
            local = address in (None, "local")
            self.ray.init(address=None if local else address, namespace=NAMESPACE, ignore_reinit_error=True,
                          log_to_driver=False, **({"include_dashboard": False} if local else {}))
        self._owned = False
        try:
            self.service = self.ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            if not start:
                raise RuntimeError(f"no kb_gym evaluation service named {name!r} on this Ray cluster; start one "
                                   "with `kb-gym serve` or RayEvaluator(start=True)") from None
            self.service = start_service(workers, self.config, results_path=results_path, name=name,
                                         detached=detached, gpus_per_worker=gpus_per_worker)
            self._owned = not detached
        self.name = name
        self.devices = [w["device"] for w in self.ray.get(self.service.ready.remote())]
        self._closed = False
        # what a caller records beside the evaluations (the reward function's dedup copies): the service's store
        self.store = _ServiceStore(self)

    def submit(self, problem: Problem, text: str, *, seed: int | None = None,
               config: EvalConfig | None = None) -> Future:
        if self._closed:
            raise RuntimeError("this RayEvaluator is closed")
        cfg = (config or self.config).to_dict()
        ref = self.service.evaluate.remote(problem.to_dict(), text, seed, cfg)
        out: Future = Future()

        def done(inner: Future) -> None:
            try:
                out.set_result(EvalResult.from_dict(inner.result()))
            except Exception as exc:  # noqa: BLE001 - the service itself is gone: the caller's future says so
                out.set_exception(exc)

        ref.future().add_done_callback(done)
        return out

    def warm(self) -> RayEvaluator:
        """The service's workers warm themselves when they start: nothing to do (the Evaluator's API)."""
        return self

    def stats(self) -> dict[str, Any]:
        return self.ray.get(self.service.stats.remote())

    def close(self) -> None:
        self._closed = True  # a detached service outlives its clients; stop it with `kb-gym serve --stop`
        if self._owned:  # one this client started (not detached) goes with it
            from kb_gym.service.actors import stop_service

            stop_service(self.name)

    def __enter__(self) -> RayEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ServiceStore:
    """The results store's ``append`` for a RayEvaluator's callers: the row goes to the service's store, where the
    service writes the results it evaluated (a service started with no store records none of these either)."""

    def __init__(self, client: RayEvaluator) -> None:
        self.client = client

    def append(self, result: EvalResult, extra: dict[str, Any] | None = None) -> None:
        self.client.ray.get(self.client.service.record.remote(result.to_dict(), extra))


def connect(spec: str | None, **kwargs: Any) -> Any:
    """An evaluator from a spec (:func:`kb_gym.service.evaluator_address`): None for a local one (build an
    Evaluator as before), else the service on that cluster."""
    address = evaluator_address(spec)
    if address is None:
        return None
    return RayEvaluator(address=os.environ.get("RAY_ADDRESS", "auto") if address == "auto" else address, **kwargs)
