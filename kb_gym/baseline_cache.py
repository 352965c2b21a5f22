"""On-disk cache of baseline timings per problem, precision, baseline kind and hardware."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from kb_gym.store import cache_dir


def baseline_key(code_hash: str, numerics: str, baseline: str, hardware_hash: str) -> str:
    return f"{code_hash}:{numerics}:{baseline}:{hardware_hash}"


def measured_entry(problem: Any, cfg: Any, result: Any) -> tuple[str, dict[str, Any]] | None:
    """The cache key and entry for the baseline ``result`` measured (a judge's own timing of the reference),
    or None where it measured none or reused a cached one. ``problem``: a Problem; ``cfg``: its EvalConfig.
    The Evaluator records only baseline-only jobs' results: a baseline timed beside a candidate can be slowed
    by the candidate's processes (round 4)."""
    if result.ref_runtime_ms is None or result.baseline_cached or not result.hardware.get("hash"):
        return None
    key = baseline_key(problem.code_hash, cfg.numerics, cfg.baseline, result.hardware["hash"])
    return key, {"problem": problem.key, "ref_runtime_ms": result.ref_runtime_ms,
                 "ref_runtime_ci_ms": result.ref_runtime_ci_ms, "reps": result.timing_reps,
                 "device": result.hardware.get("name", "")}


class BaselineCache:
    """A JSON file of ``key -> {ref_runtime_ms, ref_runtime_ci_ms, reps, problem, time}``.

    Written atomically (temp file + rename) so two processes sharing the cache never read half a
    file; the last writer wins for a key, which is fine for measurements of the same thing.
    """

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path else cache_dir() / "baselines.json"
        self._lock = threading.Lock()

    def _read(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self._read().get(key)

    def with_prefix(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every entry whose key starts with ``prefix`` (a problem's code hash: all its baselines)."""
        return {k: v for k, v in self._read().items() if k.startswith(prefix)}

    def put_missing(self, entries: dict[str, dict[str, Any]]) -> int:
        """Add the entries this cache lacks (measured elsewhere; a key names its hardware); how many."""
        with self._lock:
            data = self._read()
            new = {k: v for k, v in entries.items() if k not in data}
            if new:
                data.update(new)
                self._write(data)
            return len(new)

    def put(self, key: str, entry: dict[str, Any]) -> None:
        with self._lock:
            data = self._read()
            data[key] = {**entry, "time": time.time()}
            self._write(data)

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def __len__(self) -> int:
        return len(self._read())
