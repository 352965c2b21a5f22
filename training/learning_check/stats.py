"""The numbers the learning check reports, each with a 95% interval.

Per sample (one evaluated answer): ``fast_0`` = correct (the verdict is ``correct``), ``fast_1`` = correct, speedup
> 1 and speed credit (a correct answer the integrity policy flagged, such as the reference copied back with no
kernel of its own, never counts as fast), ``credited`` = correct with speed credit, ``reward`` = the training
reward preset of its result.

Two intervals, because the samples are not independent: several answers share one problem.

- ``wilson`` (rates) / ``bootstrap`` (the mean reward): the samples taken as independent, as the issue asks.
  Right for "this policy on exactly these problems"; too narrow for "on problems like these".
- ``problem_bootstrap``: problems resampled with replacement, each with all its samples: the interval for the
  population of problems, wider whenever problems differ. The before/after difference uses it paired (the same
  resampled problems on both sides).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Z95 = 1.959963984540054
BOOTSTRAP_ROUNDS = 2000


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``k`` successes in ``n`` trials (``(0, 1)`` when ``n`` is 0)."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _percentiles(values: list[float]) -> tuple[float, float]:
    values.sort()
    lo = values[int(0.025 * (len(values) - 1))]
    hi = values[int(math.ceil(0.975 * (len(values) - 1)))]
    return (lo, hi)


def bootstrap_mean(values: Sequence[float], seed: int = 0, rounds: int = BOOTSTRAP_ROUNDS) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (seeded: the same data give the same interval)."""
    if not values:
        return (math.nan, math.nan)
    rng = random.Random(seed)
    n = len(values)
    return _percentiles([statistics.fmean(rng.choices(values, k=n)) for _ in range(rounds)])


def _pooled(groups: Sequence[Sequence[float]]) -> float:
    total = sum(len(g) for g in groups)
    return sum(sum(g) for g in groups) / total if total else math.nan


def problem_bootstrap(groups: Mapping[str, Sequence[float]], seed: int = 0, rounds: int = BOOTSTRAP_ROUNDS
                      ) -> tuple[float, float]:
    """Interval of the pooled mean when the problems (each with all its samples) are resampled."""
    keys = sorted(groups)
    if not keys:
        return (math.nan, math.nan)
    rng = random.Random(seed)
    return _percentiles([_pooled([groups[k] for k in rng.choices(keys, k=len(keys))]) for _ in range(rounds)])


def paired_difference(before: Mapping[str, Sequence[float]], after: Mapping[str, Sequence[float]], seed: int = 0,
                      rounds: int = BOOTSTRAP_ROUNDS) -> dict[str, Any]:
    """after - before over the problems both have, with the paired problem-bootstrap interval."""
    keys = sorted(set(before) & set(after))
    if not keys:
        return {"value": math.nan, "problem_bootstrap": [math.nan, math.nan], "problems": 0}
    rng = random.Random(seed)
    diffs = []
    for _ in range(rounds):
        pick = rng.choices(keys, k=len(keys))
        diffs.append(_pooled([after[k] for k in pick]) - _pooled([before[k] for k in pick]))
    value = _pooled([after[k] for k in keys]) - _pooled([before[k] for k in keys])
    return {"value": value, "problem_bootstrap": list(_percentiles(diffs)), "problems": len(keys)}


def is_correct(row: Mapping[str, Any]) -> bool:
    return row.get("status") == "correct"


def is_credited(row: Mapping[str, Any]) -> bool:
    return is_correct(row) and row.get("speed_credit") is not False


def is_fast(row: Mapping[str, Any], p: float = 1.0) -> bool:
    speedup = row.get("speedup")
    ok = isinstance(speedup, int | float) and not isinstance(speedup, bool) and math.isfinite(speedup)
    return is_credited(row) and ok and speedup > p


def per_problem(rows: Sequence[Mapping[str, Any]], value: Callable[[Mapping[str, Any]], float]
                ) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for row in rows:
        groups.setdefault(str(row.get("problem_key")), []).append(float(value(row)))
    return groups


def metric_values(reward: Callable[[Mapping[str, Any]], float]) -> dict[str, Callable[[Mapping[str, Any]], float]]:
    """Each reported metric as a per-sample function (rates as 0/1)."""
    return {"fast_0": lambda r: float(is_correct(r)), "fast_1": lambda r: float(is_fast(r)),
            "credited": lambda r: float(is_credited(r)), "mean_reward": reward}


def summarize_samples(rows: Sequence[Mapping[str, Any]], reward: Callable[[Mapping[str, Any]], float],
                      seed: int = 0) -> dict[str, Any]:
    """fast_0, fast_1, credited (rates: Wilson and problem bootstrap) and mean reward (bootstrap and problem
    bootstrap) over ``rows``, with the count of each status."""
    out: dict[str, Any] = {"samples": len(rows), "problems": len({r.get("problem_key") for r in rows})}
    for name, fn in metric_values(reward).items():
        values = [float(fn(r)) for r in rows]
        groups = per_problem(rows, fn)
        entry: dict[str, Any] = {"value": statistics.fmean(values) if values else math.nan,
                                 "problem_bootstrap": list(problem_bootstrap(groups, seed))}
        if name == "mean_reward":
            entry["bootstrap"] = list(bootstrap_mean(values, seed))
        else:
            k = int(sum(values))
            entry.update({"k": k, "wilson": list(wilson(k, len(values)))})
        out[name] = entry
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[str(r.get("status"))] = statuses.get(str(r.get("status")), 0) + 1
    out["statuses"] = dict(sorted(statuses.items()))
    return out


def compare(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]],
            reward: Callable[[Mapping[str, Any]], float], seed: int = 0) -> dict[str, Any]:
    """after - before of every metric, paired over the problems both runs evaluated."""
    return {name: paired_difference(per_problem(before, fn), per_problem(after, fn), seed)
            for name, fn in metric_values(reward).items()}
