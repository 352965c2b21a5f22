"""What a runner says, in the shapes the judge reads: a call's and a burst's replies, and the checks every number,
name and report from a runner passes before the judge keeps it. A runner is the candidate's process: whatever it
sends is bounded here (a count that is a count, names the judge knows, a report of known counts), so that garbage
costs the candidate its verdict, never the judge (rounds 9 and 19)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kb_gym.worker import pch
from kb_gym.worker.dataflow import REPORT_COUNTS
from kb_gym.worker.tensors import MAX_OUTPUTS, WireError


@dataclass
class CallReply:
    """What a runner said about one call, with the judge's own clock around it."""

    outputs: Any = None  # a tensor, or a tuple of tensors, rebuilt by the judge
    event_ms: float | None = None
    host_ms: float | None = None  # as the runner reports it: informational only
    envelope_ms: float = 0.0  # the judge's clock: from sending the seed to the runner's "done"
    launches: int = 0
    backends: list[str] = field(default_factory=list)
    mutated: bool = False
    numerics_changed: bool = False
    dataflow: dict[str, Any] | None = None  # a traced call's report (dataflow.py), as the runner says
    window: tuple[int, int] | None = None  # the probe clock's marks around the call (probe_check.py): the judge's own
    shield_ms: float | None = None  # a probe pass's launch shield, as the runner says: believed from a spare only
    cpu: Any = None  # cpu_clock.Window: the runner tree's CPU time in a timed call on the CPU, as the kernel counts it
    form: str = ""  # how the return value nests (tensors.output_form), as the runner says; "" where it said nothing


@dataclass
class BurstReply:
    """What a runner said about a burst of forwards (``RunnerProcess.burst``), with the judge's clock around it."""

    seeds: list[int]
    envelope_ms: float  # the judge's clock: from sending the seeds to the runner's "burst_done"
    event_ms: list[float | None]  # per forward, as the runner reports it: believed from a pristine runner only
    commitments: list[Any]
    nonce: int
    structure: str
    meta: list[dict[str, Any]]  # one forward's outputs, described


# the kernel languages a runner's launch counter names (launches.py); any other name a reply carries is dropped
# (round 9: four names of any length went whole into the result and the store, 6 MB a line)
BACKENDS = ("triton", "cuda")
LOAD_STATUSES = ("compile_error", "format_error", "runtime_error")  # what a failed load can be (runner._load)


def finite_ms(value: Any) -> float | None:
    """A time the runner reported, if it is one (not NaN, not negative, not a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if 0.0 <= value < 1e9 else None


def launch_count(value: Any) -> int:
    """A count the runner reported. Anything else ("many", a float, a list) is a WireError, so that garbage
    costs the candidate its verdict, never the judge (an int() of it raised in the judge and restarted it)."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40:
        return value
    raise WireError(f"the runner reported a launch count that is not one: {str(value)[:40]!r}")


def dataflow_report(value: Any) -> dict[str, Any] | None:
    """A traced call's report (dataflow.py) in the shape the judge reads, or None (no trace, or garbage: the
    judge then takes nothing from it)."""
    if not isinstance(value, dict):
        return None
    outputs = value.get("outputs")
    if not isinstance(outputs, int) or isinstance(outputs, bool) or not 0 <= outputs <= MAX_OUTPUTS:
        return None
    lists = {name: value.get(name) for name in ("untainted", "computed")}
    for items in lists.values():
        if not isinstance(items, list) or not all(
                isinstance(k, int) and not isinstance(k, bool) and 0 <= k < outputs for k in items):
            return None
    counts = {}
    for name in REPORT_COUNTS:  # the trace's own counts only, each one a count
        count = value.get(name, 0)
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count < 1 << 40:
            return None
        counts[name] = count
    return {**counts, **{name: sorted(set(items)) for name, items in lists.items()}, "outputs": outputs,
            "overflow": value.get("overflow") is True}


def pch_record(value: Any) -> dict[str, list[str]]:
    got = value if isinstance(value, dict) else {}
    return {key: [v for v in got.get(key) or [] if v in pch.VARIANTS][:len(pch.VARIANTS)] if isinstance(
        got.get(key), list) else [] for key in ("used", "wanted")}
