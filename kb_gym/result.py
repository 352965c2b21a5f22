"""EvalResult: the plain-data verdict of one evaluation, serialisable to one JSON line."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

MAX_ERROR_CHARS = 2000


class Status(StrEnum):
    """Verdicts, in the order a candidate can fail (earliest first)."""

    FORMAT_ERROR = "format_error"
    REJECTED = "rejected"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASH = "crash"
    INCORRECT = "incorrect"
    CORRECT = "correct"


STATUS_ORDER: tuple[str, ...] = tuple(s.value for s in Status)


@dataclass
class EvalResult:
    """Everything measured about one candidate on one problem.

    ``speedup`` is baseline median / candidate median and is set only when the candidate is
    correct. ``flags`` name integrity findings (``no_custom_kernel``, ``excessive_speedup``...);
    ``speed_credit`` is the integrity policy's verdict on them (False: rewards give no speed
    credit), and ``findings`` hold the static checks' messages with their lines.
    """

    status: str
    problem_name: str = ""
    problem_id: int | None = None
    level: int | None = None
    source_hash: str = ""
    compiled: bool = False
    correct: bool = False
    speedup: float | None = None
    speedup_ci: list[float] | None = None
    runtime_ms: float | None = None
    runtime_ci_ms: list[float] | None = None
    ref_runtime_ms: float | None = None
    ref_runtime_ci_ms: list[float] | None = None
    timing_reps: int = 0
    # Host-side time per call beside the device times: where it far exceeds runtime_ms the problem is
    # launch-bound (candidate: the judge's clock minus the runner's measured overhead).
    host_runtime_ms: float | None = None
    ref_host_runtime_ms: float | None = None
    # Ideal time (every byte moved once at the measured copy bandwidth, or the FLOPs at the tabled peak)
    # over the measured time: how close to the hardware the candidate got (GPU only).
    speed_of_light_fraction: float | None = None
    baseline: str = "eager"
    baseline_cached: bool = False
    precision: str = "fp32"
    backend: str = "unknown"
    device: str = ""
    flags: list[str] = field(default_factory=list)
    speed_credit: bool | None = None  # set by the Evaluator from its policy; None: rewards use the flags
    integrity_policy: str = ""
    findings: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    feedback: str = ""
    correctness: dict[str, Any] = field(default_factory=dict)
    custom_kernel_launches: int | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    worker: dict[str, Any] = field(default_factory=dict)
    timestamp: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.status = Status(self.status).value
        if self.error is not None:
            self.error = bound_text(self.error)

    @property
    def ok(self) -> bool:
        return self.status == Status.CORRECT.value

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalResult:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def plain_text(text: str) -> str:
    """``text`` as valid UTF-8 without control characters but newline and tab: what a candidate's message may
    carry into a result, its feedback and the policy's next prompt (round 11: a lone surrogate made at run time,
    ``chr(0xD800)``, reached the feedback and the tokenizer raised, ending the GRPO step)."""
    # a lone surrogate is not printable either: this one pass also leaves the text encodable as UTF-8
    if all(c.isprintable() or c in "\n\t" for c in text):
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else f"\\x{ord(c):02x}" for c in text)


def bound_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Keep the head and the tail of a long message: the tail of a traceback is the useful part."""
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head - 40
    return f"{text[:head]}\n... [{len(text) - head - tail} chars cut] ...\n{text[-tail:]}"


def valid_speedup(value: Any) -> float | None:
    """The speedup as a float if it is a usable measurement (finite and > 0), else ``None``."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(number) or number <= 0.0:
        return None
    return number


def flag_names(flags: Any) -> set[str]:
    """Normalise flags to lower-case names; ``"excessive_speedup: 40x"`` -> ``"excessive_speedup"``.

    Accepts ``None``, one string, an iterable of anything, or a mapping (keys with truthy values).
    """
    if flags is None:
        return set()
    if isinstance(flags, str):
        items: Iterable[Any] = [flags]
    elif isinstance(flags, Mapping):
        items = [key for key, value in flags.items() if value]
    else:
        try:
            items = list(flags)
        except TypeError:
            items = [flags]
    names = set()
    for item in items:
        name = str(item).split(":", 1)[0].strip().lower()
        if name:
            names.add(name)
    return names
