"""The judge's device allocations with their Python stacks, for finding what holds a stage's peak (diagnostics only).

``KB_GYM_MEMORY_HISTORY=DIR`` (the judge inherits it): the judge records every allocation from its start and, as
each job starts ("start") and at each stage's memory mark (job._memory_mark), writes the history so far to
``DIR/<problem>-<job>-<stage>.pickle`` (torch.cuda.memory's snapshot format). scripts/memory_peak.py replays one
and names the tensors alive at its peak. Off by default: the recording costs CPU time on every allocation."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

ENV = "KB_GYM_MEMORY_HISTORY"
MAX_ENTRIES = 200_000


def folder() -> Path | None:
    value = os.environ.get(ENV, "")
    return Path(value) if value else None


def start(device: torch.device) -> None:
    if device.type == "cuda" and folder() is not None:
        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, device=device, stacks="python")


def dump(device: torch.device, problem_key: str, job_id: int, stage: str) -> None:
    where = folder()
    if device.type != "cuda" or where is None:
        return
    where.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{problem_key}-{job_id}-{stage}")
    torch.cuda.memory._dump_snapshot(str(where / f"{name}.pickle"))
