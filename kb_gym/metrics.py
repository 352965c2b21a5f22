"""KernelBench metrics over evaluation results: fast_p, best-of-k, correctness, geomean speedup.

``fast_p`` is KernelBench's: the fraction of ALL tasks (failed ones included) whose result is
correct AND has ``speedup > p`` (strict). A task is identified by its key
``f"level{level}/{problem_name}"``.

Results may be :class:`~kb_gym.result.EvalResult` objects or plain dicts (one JSONL line each).
With one result per task every function here reduces to the KernelBench definition. With several
samples per task:

* :func:`fast_p` and :func:`correctness_rate` average over samples within a task, then over
  tasks (each task weighs the same): the expected score of ONE sample per task.
* :func:`best_of_k` keeps the best sample per task; :func:`fast_p_at_k` gives the (unbiased,
  pass@k-style) fast_p when the best of ``k`` samples per task is kept.

Correct means ``status == "correct"`` (the status is authoritative). A speedup that is missing,
NaN, infinite or <= 0 is not a usable measurement and never counts as fast. Integrity flags are
ignored unless ``penalised_flags`` is given, in which case a result carrying any of those flags
counts as not correct (KernelBench itself has no flags). A correct result with ``speed_credit`` False (the
integrity policy's: no kernel of its own, a flagged timing) counts in fast_0, never in fast_p for p > 0, and
ranks below every credited speedup in best-of.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kb_gym.result import STATUS_ORDER, EvalResult, Status, flag_names, valid_speedup

logger = logging.getLogger(__name__)

DEFAULT_PS: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
ALL = "all"

ResultLike = EvalResult | Mapping[str, Any]


# --------------------------------------------------------------------------- normalisation


@dataclass(frozen=True)
class _Sample:
    task: str
    group: str
    ok: bool
    speedup: float | None
    stage: int
    sol_fraction: float | None = None  # share of the speed-of-light floor reached (floor time / runtime)
    credited: bool = True  # False: the integrity policy gave it no speed credit (``speed_credit``)

    def is_fast(self, p: float) -> bool:
        # a speedup without credit (plain PyTorch, a flagged timing) is correct, never fast (round 11: a renamed
        # reference at 2.0x counted in fast_1 while the fast_p reward paid it 0)
        return self.ok and self.speedup is not None and self.speedup > p and (self.credited or p <= 0)

    @property
    def rank(self) -> tuple[bool, float, int]:
        """Sort key of best-of: correct first, then higher credited speedup, then later failure stage."""
        speed = -math.inf
        if self.ok and self.speedup is not None:
            speed = self.speedup if self.credited else 0.0
        return (self.ok, speed, self.stage)


def _get(item: Any, name: str, default: Any = None) -> Any:
    if isinstance(item, Mapping):
        return item.get(name, default)
    return getattr(item, name, default)


def _level_text(level: Any) -> str:
    if isinstance(level, float) and level.is_integer():
        return str(int(level))
    if isinstance(level, str):
        text = level.strip()
        return str(int(text)) if text.isdigit() else text
    return str(level)


def task_key(result: ResultLike) -> str:
    """``f"level{level}/{problem_name}"`` (the problem id stands in for a missing name)."""
    name = _get(result, "problem_name") or ""
    if not name and _get(result, "problem_id") is not None:
        name = str(_get(result, "problem_id"))
    return f"level{_level_text(_get(result, 'level'))}/{name}"


def _group_of(key: str) -> str:
    return key.split("/", 1)[0]


def _sample(item: ResultLike, penalised: frozenset[str]) -> _Sample:
    raw_status = _get(item, "status")
    if isinstance(raw_status, Status):
        status = raw_status.value
    elif raw_status is None:
        status = Status.CORRECT.value if _get(item, "correct") is True else ""
    else:
        status = str(raw_status).strip().lower()
    ok = status == Status.CORRECT.value
    if ok and penalised and flag_names(_get(item, "flags")) & penalised:
        ok = False
    stage = STATUS_ORDER.index(status) if status in STATUS_ORDER else -1
    key = task_key(item)
    speedup = valid_speedup(_get(item, "speedup"))
    sol = _get(item, "speed_of_light_fraction")
    sol = float(sol) if isinstance(sol, int | float) and math.isfinite(sol) and sol > 0 else None
    return _Sample(task=key, group=_group_of(key), ok=ok, speedup=speedup, stage=stage, sol_fraction=sol,
                   credited=_get(item, "speed_credit") is not False)


def _penalised(penalised_flags: Iterable[str] | None) -> frozenset[str]:
    if not penalised_flags:
        return frozenset()
    if isinstance(penalised_flags, str):
        penalised_flags = [penalised_flags]
    return frozenset(str(f).strip().lower() for f in penalised_flags)


def _group_by_task(
    results: Iterable[ResultLike],
    tasks: Iterable[str] | None = None,
    penalised_flags: Iterable[str] | None = None,
) -> dict[str, list[tuple[_Sample, ResultLike]]]:
    """Task key -> its samples, in first-seen order. With ``tasks``: exactly those keys
    (missing ones with no samples; results of other tasks dropped)."""
    penalised = _penalised(penalised_flags)
    wanted = None if tasks is None else list(dict.fromkeys(str(t) for t in tasks))
    grouped: dict[str, list[tuple[_Sample, ResultLike]]] = {k: [] for k in wanted} if wanted else {}
    for item in results:
        sample = _sample(item, penalised)
        if wanted is not None and sample.task not in grouped:
            continue
        grouped.setdefault(sample.task, []).append((sample, item))
    return grouped


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _per_task_fraction(samples: list[tuple[_Sample, Any]], predicate: Any) -> float:
    if not samples:
        return 0.0
    return sum(1 for s, _ in samples if predicate(s)) / len(samples)


# --------------------------------------------------------------------------- metrics


def fast_p(
    results: Iterable[ResultLike],
    p: float,
    *,
    tasks: Iterable[str] | None = None,
    penalised_flags: Iterable[str] | None = None,
) -> float:
    """Fraction of tasks whose result is correct and ``speedup > p`` (strict), KernelBench-style.

    ``tasks`` (keys ``"level{level}/{problem_name}"``) fixes the denominator: a listed task with
    no result counts as a failure and results of unlisted tasks are ignored. Without it the
    denominator is the set of tasks seen in ``results``. Several samples of one task are averaged
    within the task (see the module docstring). No tasks at all gives 0.0.
    """
    grouped = _group_by_task(results, tasks, penalised_flags)
    threshold = float(p)
    return _mean([_per_task_fraction(s, lambda x: x.is_fast(threshold)) for s in grouped.values()])


def correctness_rate(
    results: Iterable[ResultLike],
    *,
    tasks: Iterable[str] | None = None,
    penalised_flags: Iterable[str] | None = None,
) -> float:
    """Fraction of tasks whose result is correct (samples averaged within a task; ``tasks`` as in
    :func:`fast_p`)."""
    grouped = _group_by_task(results, tasks, penalised_flags)
    return _mean([_per_task_fraction(s, lambda x: x.ok) for s in grouped.values()])


def best_of_k(
    results: Iterable[ResultLike], *, penalised_flags: Iterable[str] | None = None
) -> list[ResultLike]:
    """The best result of each task, in first-seen task order.

    Best = correct beats incorrect, then the higher (usable) speedup; among failures, the one
    that got further (incorrect > runtime error > compile error > format error). Ties keep the
    earliest. ``fast_p(best_of_k(results), p)`` is fast_p over several samples per task.
    """
    best: list[ResultLike] = []
    for samples in _group_by_task(results, None, penalised_flags).values():
        winner = samples[0]
        for candidate in samples[1:]:
            if candidate[0].rank > winner[0].rank:
                winner = candidate
        best.append(winner[1])
    return best


def _at_least_one_of_k(n: int, c: int, k: int | None) -> float:
    """P(at least one of k samples drawn without replacement from n is good | c good)."""
    if c <= 0:
        return 0.0
    if k is None or k >= n or n - c < k:
        return 1.0
    # 1 - C(n-c, k) / C(n, k), in the numerically stable product form
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def fast_p_at_k(
    results: Iterable[ResultLike],
    p: float,
    k: int | None = None,
    *,
    tasks: Iterable[str] | None = None,
    penalised_flags: Iterable[str] | None = None,
) -> float:
    """fast_p when the best of ``k`` samples per task is kept.

    ``k=None`` uses all samples (= ``fast_p(best_of_k(results), p)``). For an integer ``k`` the
    estimate is the unbiased pass@k one, ``1 - C(n - c, k) / C(n, k)`` per task with ``n``
    samples of which ``c`` are fast; a task with fewer than ``k`` samples uses all it has.
    ``k=1`` equals :func:`fast_p`.
    """
    if k is not None and (isinstance(k, bool) or int(k) != k or k < 1):
        raise ValueError(f"k must be a positive integer or None, got {k!r}")
    threshold = float(p)
    values = []
    for samples in _group_by_task(results, tasks, penalised_flags).values():
        n = len(samples)
        c = sum(1 for s, _ in samples if s.is_fast(threshold))
        values.append(_at_least_one_of_k(n, c, None if k is None else int(k)))
    return _mean(values)


def geometric_mean_speedup(
    results: Iterable[ResultLike], *, penalised_flags: Iterable[str] | None = None
) -> float | None:
    """Geometric mean of the speedup over tasks whose best result is correct with a usable speedup.

    ``None`` when there is no such task.
    """
    penalised = _penalised(penalised_flags)
    logs = []
    for item in best_of_k(results, penalised_flags=penalised):
        sample = _sample(item, penalised)
        if sample.ok and sample.speedup is not None:
            logs.append(_credited_log(sample))
    return math.exp(_mean(logs)) if logs else None


def _credited_log(sample: _Sample) -> float:
    """log speedup of a correct sample, counted as 1.0x where the policy denied it speed credit: its claimed time is
    the one the judge did not believe (``excessive_speedup``, ``unverified_timing``: red team round 30, a geomean of
    100x over a 1.00x kernel and two 1000x claims)."""
    return math.log(sample.speedup) if sample.credited and sample.speedup is not None else 0.0


def fast_key(p: float) -> str:
    """Column name of a fast_p value: ``fast_0``, ``fast_0.5``, ``fast_1``..."""
    return f"fast_{float(p):g}"


def _group_sort_key(group: str) -> tuple[int, int, str]:
    suffix = group[len("level") :] if group.startswith("level") else group
    return (0, int(suffix), group) if suffix.isdigit() else (1, 0, group)


def _summarize_group(
    grouped: dict[str, list[tuple[_Sample, ResultLike]]], ps: Sequence[float], ks: Sequence[int] = ()
) -> dict[str, Any]:
    samples = [s for task_samples in grouped.values() for s, _ in task_samples]
    per_task = list(grouped.values())
    row: dict[str, Any] = {
        "n_tasks": len(grouped),
        "n_samples": len(samples),
        "correct": _mean([_per_task_fraction(t, lambda x: x.ok) for t in per_task]),
    }
    for p in ps:
        fast = [_per_task_fraction(t, lambda x, th=float(p): x.is_fast(th)) for t in per_task]
        row[fast_key(p)] = _mean(fast)
    best = [max((s for s, _ in t), key=lambda x: x.rank) for t in per_task if t]
    logs = [_credited_log(s) for s in best if s.ok and s.speedup is not None]
    row["geomean_speedup"] = math.exp(_mean(logs)) if logs else None
    # How close to the hardware: the median, over tasks whose best sample is correct and credited, of that sample's
    # share of the speed-of-light floor (None where no result carries one, e.g. CPU runs); an uncredited time is
    # not the kernel's (round 30: 160% of the speed of light)
    sols = [s.sol_fraction for s in best if s.ok and s.credited and s.sol_fraction is not None]
    row["median_sol_fraction"] = statistics.median(sols) if sols else None
    for k in ks:  # fast_p@k: the unbiased estimate that one of k samples per task is fast (fast_p_at_k)
        for p in ps:
            fast_counts = [(len(t), sum(1 for s, _ in t if s.is_fast(float(p)))) for t in per_task]
            row[f"{fast_key(p)}@{k}"] = _mean([_at_least_one_of_k(n, c, k) for n, c in fast_counts])
    n = len(grouped)
    row["best_of"] = {
        "correct": sum(1 for s in best if s.ok) / n if n else 0.0,
        **{fast_key(p): (sum(1 for s in best if s.is_fast(float(p))) / n if n else 0.0) for p in ps},
    }
    return row


def summarize(
    results: Iterable[ResultLike],
    ps: Sequence[float] = DEFAULT_PS,
    *,
    tasks: Iterable[str] | None = None,
    penalised_flags: Iterable[str] | None = None,
    ks: Sequence[int] = (),
) -> dict[str, dict[str, Any]]:
    """Metrics per level (``"level1"``, ``"level2"``...) and over ``"all"``.

    Each row: ``n_tasks``, ``n_samples``, ``correct`` (correctness rate), one ``fast_{p:g}`` per
    ``p`` (``fast_0``, ``fast_0.5``... see :func:`fast_key`), ``geomean_speedup`` (over tasks
    whose best sample is correct; ``None`` if none), ``median_sol_fraction`` (over the same best
    samples, their share of the speed-of-light floor; ``None`` if none reports one) and
    ``best_of``: ``correct`` and the fast_p values when the best sample of each task is kept (equal
    to the plain ones with one sample per task). For each ``k`` in ``ks``, ``fast_{p:g}@{k}`` per ``p``
    (:func:`fast_p_at_k`). Levels are ordered numerically, ``"all"`` comes last.
    """
    for k in ks:
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
    grouped = _group_by_task(results, tasks, penalised_flags)
    by_group: dict[str, dict[str, list[tuple[_Sample, ResultLike]]]] = {}
    for key, samples in grouped.items():
        by_group.setdefault(_group_of(key), {})[key] = samples
    summary = {g: _summarize_group(by_group[g], ps, ks) for g in sorted(by_group, key=_group_sort_key)}
    summary[ALL] = _summarize_group(grouped, ps, ks)
    return summary


# --------------------------------------------------------------------------- loading


class LoadedResults(list):
    """A list of result dicts that also tells what was skipped while loading.

    ``n_blank``: blank lines; ``n_corrupt``: lines that are not a JSON object;
    ``corrupt_lines``: their 1-based line numbers; ``path``: the file read.
    """

    def __init__(self, items: Iterable[dict[str, Any]] = (), *, path: str = "") -> None:
        super().__init__(items)
        self.path = path
        self.n_blank = 0
        self.n_corrupt = 0
        self.corrupt_lines: list[int] = []

    @property
    def n_skipped(self) -> int:
        return self.n_blank + self.n_corrupt


def load_results(path: str | Path) -> LoadedResults:
    """Read a JSONL results file (one EvalResult JSON object per line) into a list of dicts.

    Blank lines and corrupt lines (not JSON, or JSON that is not an object, or bytes that are
    not UTF-8) are skipped and counted on the returned list (``n_blank``, ``n_corrupt``,
    ``corrupt_lines``); a warning is logged when any line was corrupt. A missing file raises.
    """
    loaded = LoadedResults(path=str(path))
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                text, record = None, None
            else:
                if not text:
                    loaded.n_blank += 1
                    continue
                try:
                    record = json.loads(text)
                except ValueError:
                    record = None
            if not isinstance(record, dict):
                loaded.n_corrupt += 1
                loaded.corrupt_lines.append(number)
                continue
            loaded.append(record)
    if loaded.n_corrupt:
        logger.warning(
            "%s: skipped %d corrupt line(s): %s", path, loaded.n_corrupt, loaded.corrupt_lines[:20]
        )
    return loaded
