"""The float64 second opinion on a narrow miss, computed by the judge on its own reference model."""

from __future__ import annotations

from typing import Any

import torch

from kb_gym.worker.checks import (
    Comparison,
    compare_outputs,
    flatten_outputs,
    judge_against_float64,
    near_miss,
    reference_is_inexact,
)
from kb_gym.worker.loading import out_of_device_memory, trim_traceback


def judge(device: torch.device, ref_model: Any, inputs: list[Any], cand_out: Any, ref_out: Any, atol: float,
          rtol: float, result: dict[str, Any], state: dict[str, Any], trivial: list[torch.Tensor] | None = None,
          other_answers: list[torch.Tensor] | None = None) -> Comparison:
    """``compare_outputs``, with a second opinion from float64 on a narrow miss: where the fp32 reference
    itself is off from the float64 answer (``ill_conditioned``), the candidate is held to the reference's
    own accuracy instead (checks.judge_against_float64). Otherwise the first verdict stands."""
    cmp = compare_outputs(cand_out, ref_out, atol, rtol, trivial, other_answers)
    if cmp.ok or not near_miss(cmp):
        return cmp
    exact = float64_answer(device, ref_model, inputs, ref_out, result, state)
    reference_errors = None if exact is None else reference_is_inexact(ref_out, exact, atol, rtol)
    if reference_errors is None:
        return cmp
    if "ill_conditioned" not in result["flags"]:
        result["flags"].append("ill_conditioned")
    report = result.setdefault("correctness", {})
    report["judged_against_float64"] = report.get("judged_against_float64", 0) + 1
    second = judge_against_float64(cand_out, ref_out, exact, atol, rtol, [*(trivial or []), *(other_answers or [])],
                                   reference_errors)
    if not second.ok:
        second.reason = f"{cmp.reason}; {second.reason}"
        return second
    second.degenerate |= cmp.degenerate
    second.max_abs_err, second.max_rel_err = cmp.max_abs_err, cmp.max_rel_err  # against the fp32 reference
    return second


def float64_answer(device: torch.device, ref_model: Any, inputs: list[Any], ref_out: Any, result: dict[str, Any],
                   state: dict[str, Any]) -> list[torch.Tensor] | None:
    """The reference's answer on ``inputs`` computed in float64 and cast to the reference's dtypes, or None
    where the reference does not run in float64 (a kernel of its own, say).

    Where the device's memory does not hold the float64 model, inputs and answer beside what the judge and the
    runner already hold (a GPU-size problem's 6 GB outputs on an 80 GB card: H100, session 39), it is computed on
    the host instead: the second opinion is the judge's own work, and its memory is not the candidate's fault."""
    if not isinstance(ref_model, torch.nn.Module) or state.get("float64_failed"):
        return None
    report = result.setdefault("correctness", {})
    out = None
    if not state.get("float64_on_host"):  # a job's later trials go straight to the host once the device could not
        try:
            out = _in_float64(ref_model, inputs, device)
        except Exception as exc:  # noqa: BLE001
            if device.type == "cpu" or not out_of_device_memory(exc):
                return _failed(exc, report, state)
    if out is None:  # outside the handler: its traceback would keep the failed attempt's tensors on the device
        report["float64_on"] = state["float64_on_host"] = "cpu"
        try:
            out = _in_float64(ref_model, inputs, torch.device("cpu"))
        except Exception as exc:  # noqa: BLE001
            return _failed(exc, report, state)
    refs = flatten_outputs(ref_out)
    if len(out) != len(refs) or any(o.shape != r.shape for o, r in zip(out, refs, strict=True)):
        return None
    answers = []
    for i, r in enumerate(refs):  # one float64 tensor at a time is released as its cast is made
        answers.append(out[i].to(device=r.device, dtype=r.dtype))
        out[i] = None
    return answers


def _failed(exc: Exception, report: dict[str, Any], state: dict[str, Any]) -> None:
    report["float64_error"] = trim_traceback(exc, "")[-300:]
    state["float64_failed"] = True
    return None


def _in_float64(ref_model: torch.nn.Module, inputs: list[Any], where: torch.device) -> list[Any]:
    """``ref_model`` run in float64 on ``where`` on copies of ``inputs``: floating inputs widened (a copy made
    once, not a clone and then a cast), other tensors copied, so nothing the forward changes in place is the
    judge's.

    The model is cast in place, not copied: a copy would leave submodules that a closure holds (minGPT's
    ``mlpf`` lambda) in fp32. Afterwards every parameter and buffer gets its own tensor back, on its own device.
    Tensors the forward makes itself (an LSTM's random initial state) follow the default dtype, float64 here."""
    held = [(table, key, t) for m in ref_model.modules() for table in (m._parameters, m._buffers)
            for key, t in table.items() if t is not None]
    kept = [t.data if isinstance(t, torch.nn.Parameter) else t for *_, t in held]
    default = torch.get_default_dtype()
    try:
        args = [(x.to(where, torch.float64, copy=True) if x.is_floating_point() else x.to(where, copy=True))
                if isinstance(x, torch.Tensor) else x for x in inputs]
        ref_model.to(where, torch.float64)
        torch.set_default_dtype(torch.float64)
        with torch.no_grad():
            out = flatten_outputs(ref_model(*args))
        del args
        if where.type == "cuda":
            torch.cuda.synchronize(where)
        return out
    finally:
        torch.set_default_dtype(default)
        for (table, key, t), data in zip(held, kept, strict=True):
            if isinstance(t, torch.nn.Parameter):
                t.data = data  # .to() swapped the Parameter's data: the same Parameter gets its old tensor
                table[key] = t
            else:
                table[key] = data
