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

    def put(self, key: str, entry: dict[str, Any]) -> None:
        with self._lock:
            data = self._read()
            data[key] = {**entry, "time": time.time()}
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)

    def __len__(self) -> int:
        return len(self._read())
