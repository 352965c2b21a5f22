"""Whether the candidate's kernels did the work, asked after it was found correct (and timed): the dataflow trace
(correctness.pytorch_alone, dataflow.py), then the knockout (correctness.kernels_needed). Either flags
``token_kernel``: no speed credit under ``strict``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from kb_gym.worker.correctness import kernels_needed, pytorch_alone
from kb_gym.worker.timed_checks import timed_output_check
from kb_gym.worker.timing import reference_outputs

if TYPE_CHECKING:
    from kb_gym.worker.job import WorkerContext


def dataflow_check(ctx: WorkerContext, job: dict[str, Any], ref_mod: Any, ref_model: Any, dtype: torch.dtype,
                   atol: float, rtol: float, result: dict[str, Any], state: dict[str, Any],
                   deadline: float) -> None:
    """``token_kernel`` where PyTorch computed the whole answer and the kernels only moved it or fed it constants
    (correctness.pytorch_alone, dataflow.py): round 13's copy into an ``empty_like`` buffer, one element moved into a
    NaN-filled output, the 1.0 it is multiplied by. The knockout finds those kernels needed."""
    runner = state.get("runner")
    if (runner is None or not job["config"].get("dataflow_check", True) or not result.get("correct")
            or result.get("status") not in (None, "correct") or not result.get("custom_kernel_launches")):
        return
    widen = bool(state.get("widen"))
    seed = int(job["seed"])
    report = pytorch_alone(
        runner, (ctx.seed(seed, "dataflow", 0), ctx.seed(seed, "dataflow", 1)),
        lambda s: reference_outputs(ref_model, ref_mod, s, ctx.device, dtype, runner, widen),
        timed_output_check(ctx.device, ref_mod, ref_model, dtype, atol, rtol, result, state, widen),
        atol=atol, rtol=rtol, deadline=deadline, byte_limit=state.get("byte_limit", 1 << 30), widen=widen)
    result["correctness"]["dataflow"] = report
    if report["verdict"] == "pytorch" and "token_kernel" not in result["flags"]:
        result["flags"].append("token_kernel")


def knockout_check(ctx: WorkerContext, job: dict[str, Any], ref_mod: Any, ref_model: Any, dtype: torch.dtype,
                   atol: float, rtol: float, result: dict[str, Any], state: dict[str, Any],
                   deadline: float) -> None:
    """``token_kernel`` where the candidate's kernels ran but its answer did not need them (correctness.kernels_needed):
    the job's last call, on a runner nothing else will use. Where it cannot run (under a second left) the kernels
    are not taken as needed: ``token_kernel`` too, never a silent pass."""
    runner = state.get("runner")
    left = deadline - time.monotonic()
    if (runner is None or not result.get("correct") or result.get("status") not in (None, "correct")
            or not result.get("custom_kernel_launches") or "token_kernel" in result["flags"]):
        return
    widen = bool(state.get("widen"))
    needed = left >= 1.0 and kernels_needed(
        runner, ctx.seed(int(job["seed"]), "knockout"),
        lambda s: reference_outputs(ref_model, ref_mod, s, ctx.device, dtype, runner, widen),
        timed_output_check(ctx.device, ref_mod, ref_model, dtype, atol, rtol, result, state, widen),
        timeout=min(left, 10.0), byte_limit=state.get("byte_limit", 1 << 30), chunk_bytes=state.get("chunk_bytes", 0),
        widen=widen, rtol=rtol, report=result.setdefault("correctness", {}))
    if not needed and "token_kernel" not in result["flags"]:
        result["flags"].append("token_kernel")
