"""The Ray actors: an evaluation worker per GPU (a local Evaluator inside) and the service that spreads
requests over them. Plain data crosses: Problem.to_dict, EvalConfig.to_dict, EvalResult.to_dict."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from kb_gym.service import require_ray

SERVICE_NAME = "kb_gym_evaluation"
NAMESPACE = "kb_gym"
IN_FLIGHT_PER_WORKER = 2  # one measuring, one loading and compiling beside it (the pipeline)


class EvaluationWorker:
    """One GPU's warm Evaluator (``cuda:0`` is the GPU Ray assigned; the CPU where there is none)."""

    def __init__(self, config: dict[str, Any], baseline_cache: str | None, omp_threads: str | None = None) -> None:
        import torch

        # Ray sets OMP_NUM_THREADS to an actor's CPU count (1 here) where it was unset; the judges started below
        # would inherit it, and their host-side work run on one thread where a local Evaluator's judges have
        # every core. They get the value of the process that started the service instead (unset: torch's own).
        if omp_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = omp_threads

        from kb_gym.baseline_cache import BaselineCache
        from kb_gym.config import EvalConfig
        from kb_gym.evaluator import Evaluator

        self.device = "cuda:0" if torch.cuda.is_available() else "cpu"
        # Baselines go through the on-disk cache keyed by hardware fingerprint: every worker of a node reuses a
        # baseline one of them measured, and the service hands each worker those measured on other nodes.
        self.evaluator = Evaluator(self.device, config=EvalConfig(**config), results_path=False,
                                   baseline_cache=BaselineCache(baseline_cache) if baseline_cache else None)
        self.evaluator.warm()

    def info(self) -> dict[str, Any]:
        return {"device": self.device, "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}

    def evaluate(self, problem: dict[str, Any], text: str, seed: int | None, config: dict[str, Any] | None,
                 baselines: dict[str, dict[str, Any]] | None = None) -> tuple[dict, dict[str, dict[str, Any]]]:
        """The result, and this node's cache entries for the problem afterwards (baseline-only timings, the only
        ones the cache takes). ``baselines``: entries measured by other workers (any node); those this node's
        cache lacks are added first, so that a reused baseline is one a judge measured alone, wherever it ran."""
        from kb_gym.config import EvalConfig
        from kb_gym.problems import Problem

        cache, prob = self.evaluator.baselines, Problem.from_dict(problem)
        if baselines and cache is not None:
            try:
                cache.put_missing(baselines)
            except OSError:
                pass  # a read-only cache: this worker measures its own
        cfg = EvalConfig(**config) if config else None
        result = self.evaluator.evaluate(prob, text, seed=seed, config=cfg).to_dict()
        return result, (cache.with_prefix(prob.code_hash + ":") if cache is not None else {})

    def shutdown(self) -> None:
        self.evaluator.close()


class SharedBaselines:
    """The baselines every worker measured, keyed as the on-disk cache is (problem code hash, numerics,
    baseline kind, hardware fingerprint): the service learns the entries a worker's cache holds for a problem
    after evaluating it and hands them to whichever worker gets that problem next, so a GPU kind's baseline
    is measured once for the whole cluster, not once per node. The caches take only baseline-only timings."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}

    def for_problem(self, problem: dict[str, Any]) -> dict[str, dict[str, Any]]:
        from kb_gym.problems import Problem

        prefix = Problem.from_dict(problem).code_hash + ":"
        return {k: v for k, v in self.entries.items() if k.startswith(prefix)}

    def learn(self, entries: dict[str, dict[str, Any]]) -> None:
        for key, entry in entries.items():
            self.entries.setdefault(key, entry)  # the first measurement stands: every worker then reuses the same


class EvaluationService:
    """Spreads requests over the workers, at most IN_FLIGHT_PER_WORKER each (back-pressure: the rest wait
    here, not in a worker's queue, so a free worker always takes the next one); a worker that died is
    replaced and the request retried once, then answered ``crash``; every final result is appended to the
    results store here, once. Baselines measured by one worker reach the others (SharedBaselines)."""

    def __init__(self, workers: int, config: dict[str, Any], results_path: str | bool | None, gpus_per_worker: float,
                 baseline_cache: str | None, omp_threads: str | None = None) -> None:
        from kb_gym.store import ResultsStore

        self.ray = require_ray()
        self.config = config
        self.baseline_cache = baseline_cache
        self.omp_threads = omp_threads
        self.gpus = gpus_per_worker
        from kb_gym.store import default_results_path

        # None: the default store under the service node's cache folder; "" (or False): record nothing
        self.store = None if results_path in ("", False) else ResultsStore(results_path or default_results_path())
        self.workers = [self._start_worker() for _ in range(workers)]
        self.load = [0] * workers
        self.free = asyncio.Condition()
        self.replaced = 0
        self.done = 0
        self.baselines = SharedBaselines()

    def _start_worker(self) -> Any:
        actor = self.ray.remote(EvaluationWorker).options(num_gpus=self.gpus, num_cpus=1, max_concurrency=8)
        return actor.remote(self.config, self.baseline_cache, self.omp_threads)

    async def ready(self) -> list[dict[str, Any]]:
        return [await w.info.remote() for w in self.workers]

    async def stats(self) -> dict[str, Any]:
        return {"workers": len(self.workers), "in_flight": list(self.load), "replaced": self.replaced,
                "done": self.done, "baselines": len(self.baselines.entries)}

    async def _take(self) -> int:
        async with self.free:
            while min(self.load) >= IN_FLIGHT_PER_WORKER:
                await self.free.wait()
            k = self.load.index(min(self.load))
            self.load[k] += 1
            return k

    async def _give_back(self, k: int) -> None:
        async with self.free:
            self.load[k] -= 1
            self.free.notify()

    async def evaluate(self, problem: dict[str, Any], text: str, seed: int | None = None,
                       config: dict[str, Any] | None = None) -> dict[str, Any]:
        error = ""
        for _attempt in range(2):
            k = await self._take()
            worker = self.workers[k]
            try:
                result, learned = await worker.evaluate.remote(problem, text, seed, config,
                                                               self.baselines.for_problem(problem))
                self.baselines.learn(learned)
                break
            except self.ray.exceptions.RayActorError as exc:
                error = (f"the evaluation worker died twice on this candidate ({type(exc).__name__}); "
                         "it was retried once on a fresh worker")
                if self.workers[k] is worker:  # the first request to notice replaces it
                    self.workers[k] = self._start_worker()
                    self.replaced += 1
            except Exception as exc:  # noqa: BLE001 - the worker's own failure on this candidate: still a verdict,
                # recorded (round 10: a client got the exception and the store nothing)
                result = _crash(problem, f"evaluator error: {type(exc).__name__}: {str(exc)[:200]}")
                break
            finally:
                await self._give_back(k)
        else:
            result = _crash(problem, error or "the evaluation worker died twice")
        self.done += 1
        if self.store is not None:
            from kb_gym.result import EvalResult

            self.store.append(EvalResult.from_dict(result))
        return result

    async def record(self, result: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        """A result a client made without an evaluation (a dedup copy, a sample naming no known problem), written to
        the service's store beside the ones it evaluated: every sample is recorded (red team round 30: through Ray,
        three copies of one answer and an unknown problem's sample left one row)."""
        if self.store is not None:
            from kb_gym.result import EvalResult

            self.store.append(EvalResult.from_dict(result), extra=extra)

    async def shutdown(self) -> None:
        for w in self.workers:
            try:
                await w.shutdown.remote()
            except self.ray.exceptions.RayActorError:
                pass


def _crash(problem: dict[str, Any], error: str) -> dict[str, Any]:
    from kb_gym.evaluator import _problem_fields
    from kb_gym.problems import Problem
    from kb_gym.result import EvalResult

    return EvalResult(status="crash", error=error, **_problem_fields(Problem.from_dict(problem))).to_dict()


def start_service(workers: int | None = None, config: dict[str, Any] | None = None, *,
                  results_path: str | None = None, name: str = SERVICE_NAME, detached: bool = True,
                  gpus_per_worker: float | None = None, baseline_cache: str | None = None) -> Any:
    """Start the named service on the connected Ray cluster: ``workers`` evaluation workers (default: one per
    GPU the cluster has, else one), each with ``gpus_per_worker`` GPUs (default 1 where the cluster has GPUs)."""
    ray = require_ray()
    from kb_gym.config import EvalConfig

    gpus = ray.cluster_resources().get("GPU", 0)
    if gpus_per_worker is None:
        gpus_per_worker = 1.0 if gpus else 0.0
    if workers is None:
        workers = max(1, int(gpus // gpus_per_worker) if gpus_per_worker else 1)
    options: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "num_cpus": 0, "max_concurrency": 10_000}
    if detached:
        options["lifetime"] = "detached"
    service = ray.remote(EvaluationService).options(**options).remote(
        workers, (config or EvalConfig()).to_dict() if not isinstance(config, dict) else config,
        results_path, gpus_per_worker, baseline_cache, os.environ.get("OMP_NUM_THREADS"))
    ray.get(service.ready.remote())
    return service


def stop_service(name: str = SERVICE_NAME) -> bool:
    ray = require_ray()
    try:
        service = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    try:
        ray.get(service.shutdown.remote(), timeout=60)
    finally:
        ray.kill(service)
    return True
