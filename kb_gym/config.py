"""EvalConfig: every knob of one evaluation, with the defaults DESIGN.md's protocol asks for."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}

# Tolerances by preset and precision: (atol, rtol). "kernelbench-v0.1" is the original harness's
# single 1e-2 for everything; "default" is tighter for fp32 so that wrong-but-close kernels fail.
TOLERANCE_PRESETS: dict[str, dict[str, tuple[float, float]]] = {
    "default": {"fp32": (1e-4, 1e-4), "fp16": (1e-2, 1e-2), "bf16": (1e-2, 1e-2)},
    "kernelbench-v0.1": {"fp32": (1e-2, 1e-2), "fp16": (1e-2, 1e-2), "bf16": (1e-2, 1e-2)},
}
BASELINES = ("eager", "compile")


@dataclass
class EvalConfig:
    """How a candidate is checked and timed. Passed to the worker as plain data.

    Stage limits are wall-clock seconds; a stage that overruns gets ``timeout`` and the worker is
    replaced. ``timing_target_rel_ci`` is the half-width of the 95% interval of the median speedup,
    relative to it, at which timing stops early (never before ``timing_min_reps`` pairs).
    """

    precision: str = "fp32"
    # fp32 means fp32: matmuls and cuDNN convolutions (the reference's, and torch calls inside a
    # candidate) run without TF32. PyTorch's own default, which KernelBench's harness keeps, runs
    # convolutions in TF32 (~1e-3 relative error), far outside the default fp32 tolerance.
    tf32: bool = False
    tolerance: str = "default"
    atol: float | None = None
    rtol: float | None = None
    trials: int = 5
    baseline: str = "eager"
    timing: bool = True
    timing_warmup: int = 3
    timing_min_reps: int = 10
    timing_max_reps: int = 200
    timing_target_rel_ci: float = 0.01
    timing_max_seconds: float = 20.0
    timing_input_sets: int = 4
    check_timed_outputs: bool = True
    # After the timing loop, K forwards back to back under the judge's clock confirm the event times the
    # candidate's runner reported (worker/burst.py). Off by default until measured on a GPU: on a 2-core CPU it
    # catches a false 1 us claim for a 0.06 ms forward in about half the tries (docs/integrity.md, Open).
    burst_check: bool = False
    # On a GPU, after the timing loop, a claim under a time slice (2 ms) is held to the runner's GPU time as a pristine
    # probe process sees it: the GPU's time slices between contexts (worker/probe_check.py; docs/integrity.md). On by
    # default since session 36 (KB_GYM_PROBE_CHECK=0 turns it off): no honest charge or unverified claim in 19 probed
    # batch evaluations (H100, H200) and 12 probed fidelity evaluations with the reading after the exit (H200), the
    # fidelity targets held with it, and its seconds 1.42x the run's wall without them (docs/benchmarks.md 1d).
    probe_check: bool = field(default_factory=lambda: os.environ.get("KB_GYM_PROBE_CHECK", "1") != "0")
    # After the knockout's kin, two untimed forwards traced op by op ask whether PyTorch computed the whole answer
    # while the candidate's kernels only moved it or fed it constants (worker/dataflow.py): token_kernel then.
    dataflow_check: bool = True
    # Timed outputs larger than this are checked on 16 random 1 MB chunks drawn after each call reports done
    # (worker/spot_check.py) instead of crossing whole every call; correctness trials always compare whole.
    # 0: always whole.
    timed_output_sample_bytes: int = 64 << 20
    reuse_cached_baseline: bool = False
    load_timeout: float = 300.0
    correctness_timeout: float = 120.0
    timing_timeout: float = 180.0
    # Host memory of the worker's tree but the judge's own pages: what the candidate controls (host_memory.py).
    memory_limit_mb: int = 32_000
    # Disk under the worker's scratch folder, removed files it still holds included (scratch_disk.py); 0: none.
    disk_limit_mb: int = 8_000
    max_source_chars: int = 200_000
    integrity: str = "strict"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {self.precision!r}")
        if self.tolerance not in TOLERANCE_PRESETS:
            raise ValueError(f"tolerance must be one of {sorted(TOLERANCE_PRESETS)}, got {self.tolerance!r}")
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        from kb_gym.integrity import get_policy

        get_policy(self.integrity)  # ValueError naming the known policies
        if self.trials < 1:
            raise ValueError("trials must be >= 1")
        if self.timing_min_reps < 3 or self.timing_max_reps < self.timing_min_reps:
            raise ValueError("need 3 <= timing_min_reps <= timing_max_reps")
        if self.timed_output_sample_bytes < 0:
            raise ValueError("timed_output_sample_bytes must be >= 0 (0: timed outputs always cross whole)")

    @property
    def tolerances(self) -> tuple[float, float]:
        atol, rtol = TOLERANCE_PRESETS[self.tolerance][self.precision]
        return (self.atol if self.atol is not None else atol, self.rtol if self.rtol is not None else rtol)

    def stage_limit(self, stage: str) -> float:
        # the dataflow trace and the knockout (forwards traced, or with the candidate's kernels doing nothing) are
        # correctness calls, after timing
        checks = {"correctness": self.correctness_timeout, "dataflow": self.correctness_timeout,
                  "knockout": self.correctness_timeout}
        return {"load": self.load_timeout, "timing": self.timing_timeout, **checks}.get(stage, self.load_timeout)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["atol"], data["rtol"] = self.tolerances
        return data

    @property
    def numerics(self) -> str:
        """The arithmetic the baseline runs in: part of a cached baseline's key."""
        return f"{self.precision}-{'tf32' if self.tf32 else 'ieee'}" if self.precision == "fp32" else self.precision

    def replace(self, **changes: Any) -> EvalConfig:
        return dataclasses.replace(self, **changes)


# Named starting points for EvalConfig (``Evaluator(config="rl")``, ``config_preset("rl")``).
# "rl": for training loops, where thousands of candidates meet the same problems. The baseline is
# timed interleaved once per problem and hardware (and numerics, torch and Triton versions: the cache
# key) and then reused from the cache with its interval; timing stops at a 2% interval or 60 pairs or
# 5 s; correctness keeps its 5 trials (fewer would let the hard-coded-answer and fp16 attacks through
# more often: docs/integrity.md); candidates that fail correctness are never timed (as always).
# Its trade-offs are to be measured on the GPU (docs/benchmarks.md): not yet done.
CONFIG_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "rl": {"reuse_cached_baseline": True, "timing_target_rel_ci": 0.02, "timing_min_reps": 10,
           "timing_max_reps": 60, "timing_max_seconds": 5.0, "timing_warmup": 2},
}


def config_preset(name: str, **overrides: Any) -> EvalConfig:
    """The EvalConfig a preset names, with keyword overrides on top."""
    if name not in CONFIG_PRESETS:
        raise ValueError(f"unknown config preset {name!r}; known: {sorted(CONFIG_PRESETS)}")
    return EvalConfig(**{**CONFIG_PRESETS[name], **overrides})


def resolve_config(config: EvalConfig | str | None, **overrides: Any) -> EvalConfig:
    """An EvalConfig, a preset's name (``"rl"``) or None (the defaults), with keyword overrides on top."""
    if isinstance(config, str):
        config = config_preset(config)
    config = config or EvalConfig()
    return config.replace(**overrides) if overrides else config


def parse_key_values(pairs: Sequence[str], flag: str) -> dict[str, Any]:
    """``["max_steps=10", "learning_rate=1e-6"]`` -> ``{"max_steps": 10, "learning_rate": 1e-06}``: values as
    JSON where they parse (``3``, ``true``, ``[1]``), else strings. ``ValueError`` names ``flag`` on a pair
    without ``=``."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out
