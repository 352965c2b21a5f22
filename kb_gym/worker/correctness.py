"""Correctness trials, run by the judge: fresh secret-seeded inputs per trial, the candidate's outputs
from its runner, the reference's from the judge's own model, and every check on the judge's side."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kb_gym.worker.checks import Comparison, all_finite, compare_outputs, flatten_outputs, inexact
from kb_gym.worker.float64 import judge
from kb_gym.worker.inputs import make_inputs
from kb_gym.worker.loading import StageError
from kb_gym.worker.runner_client import RunnerProcess
from kb_gym.worker.runner_replies import CallReply
from kb_gym.worker.tensors import output_form


@dataclass
class TrialSetup:
    """What every call of one job needs: the problem, the judge's reference, the candidate's runner."""

    device: torch.device
    dtype: torch.dtype
    ref_mod: Any
    ref_model: Any
    runner: RunnerProcess
    atol: float
    rtol: float
    deadline: float  # time.monotonic() by which the stage must end

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.runner.kill()
            raise StageError("timeout", "the correctness stage exceeded its time limit")
        return left


def output_byte_limit(ref_out: Any) -> int:
    """The most bytes a candidate's outputs may take: twice the reference's, plus a margin."""
    return 2 * sum(t.numel() * t.element_size() for t in flatten_outputs(ref_out)) + (1 << 20)


def _form_text(form: str) -> str:
    """An output form (tensors.output_form) in words: "1 tensor (a tensor)", "2 tensor(s) ((t,t))"."""
    shown = {"t": "a tensor", "n": "a number"}.get(form) or (form if len(form) <= 60 else form[:57] + "...")
    return f"{form.count('t') + form.count('n')} tensor(s) ({shown})"


def note_reply(reply: CallReply, result: dict[str, Any], counts: dict[str, Any]) -> None:
    counts["launches"] += reply.launches
    counts["backends"].update(reply.backends)
    if reply.mutated and "input_mutation" not in result["flags"]:
        result["flags"].append("input_mutation")
    if reply.numerics_changed and "precision_change" not in result["flags"]:
        result["flags"].append("precision_change")


# An answer is kept to test the next one against (trials, and timed calls on a degenerate problem) up to this size.
KEPT_ANSWER_ELEMENTS = 1 << 24
# Over it, the trials keep this many of each output's elements, at the same drawn places every trial, and hold the
# candidate's values there against the last trial's answer there (round 13: on a 4,100 x 4,096 answer that barely
# moves with its input, nothing was kept, and the first call's answer returned for ever passed every trial).
SAMPLED_ANSWER_ELEMENTS = 1 << 20


def _sample_places(refs: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """For each floating output, the flat indices of the elements the trials compare with another trial's answer
    (None for the rest), drawn from a seed the candidate never sees (the trials' seeds follow the job's)."""
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    return [torch.randint(r.numel(), (SAMPLED_ANSWER_ELEMENTS,), generator=gen).to(r.device)
            if inexact(r) and r.numel() else None for r in refs]


def _sampled(outputs: list[torch.Tensor], places: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    return [None if i is None else t.detach().reshape(-1)[i] for t, i in zip(outputs, places, strict=True)]


def _sampled_against_previous(cand: Any, sampled_refs: list[torch.Tensor | None], places: list[torch.Tensor | None],
                              previous: list[torch.Tensor | None], atol: float, rtol: float) -> Comparison:
    """The previous-answer test of ``compare_outputs`` on the drawn elements of large outputs, output by output.
    Called after the whole comparison passed, so the outputs have the reference's structure."""
    worst = Comparison(True)
    cand_sampled = _sampled(flatten_outputs(cand), places)
    for i, (c, r, p) in enumerate(zip(cand_sampled, sampled_refs, previous, strict=True)):
        if c is None or p is None:
            continue
        cmp = compare_outputs([c], [r], atol, rtol, other_answers=[p])
        worst.degenerate |= cmp.degenerate
        worst.answers_coincide |= cmp.answers_coincide
        if not cmp.ok:
            where = f"output {i}, drawn elements" if len(sampled_refs) > 1 else "drawn elements"
            cmp.reason = f"{where}: {cmp.reason}"
            cmp.degenerate = worst.degenerate
            return cmp
    return worst


def run_trials(setup: TrialSetup, seeds: list[int], extra_seed: int, result: dict[str, Any],
               state: dict[str, Any], floor_ms: Any) -> None:
    device, dtype, atol, rtol = setup.device, setup.dtype, setup.atol, setup.rtol
    ref_model = setup.ref_model
    trials = len(seeds)
    # where the stage's time goes, summed over the trials (the rerun and the widened trial in "extra"): the judge's
    # inputs and reference forwards, the candidate's calls with their outputs' crossing, the judge's comparisons
    spent = dict.fromkeys(("inputs", "reference", "candidate", "judge", "extra"), 0.0)
    began = time.perf_counter()
    # added to what the load stage recorded there (its memory mark, job._memory_mark), not in place of it
    report = result.setdefault("correctness", {})
    report.update(trials=trials, passed=0, max_abs_err=0.0, max_rel_err=0.0, rel_l2_err=0.0, seconds=spent)
    degenerate = identity = unverifiable = False
    previous: list[torch.Tensor] = []
    places: list[torch.Tensor | None] | None = None  # drawn elements of large outputs, and the last answer there
    previous_sampled: list[torch.Tensor | None] = []
    earlier: tuple[Any, Any] | None = None  # the last trial's (candidate output, answer), when small
    pairs = coincident_pairs = 0  # consecutive trials compared, and those whose answers were the same
    counts: dict[str, Any] = {"launches": 0, "backends": set()}
    last: tuple[int, list[Any], Any] | None = None
    for trial, seed in enumerate(seeds):
        # The last trial's inputs, answer and candidate outputs go before this trial's are made: held across it (by
        # ``last``, ``refs``, ``reply``), a 6.4 GB problem's judge peaked at ~45 GB of an H100 (seven outputs' worth)
        last = reply = refs = answers = inputs = cand_out = None
        t0 = time.perf_counter()
        own = make_inputs(setup.ref_mod, seed, device, dtype)
        t1 = time.perf_counter()
        spent["inputs"] += t1 - t0
        with torch.no_grad():
            if trial == 0:
                ref_out, flops = _counting_flops(ref_model, own)
                state["floor_ms"] = floor_ms(own, ref_out, ref_model, flops)
                state["byte_limit"] = output_byte_limit(ref_out)
                state["ref_out_bytes"] = sum(t.numel() * t.element_size() for t in flatten_outputs(ref_out))
            else:
                ref_out = ref_model(*own)
        _sync(device)
        t_ref = time.perf_counter()
        spent["reference"] += t_ref - t1
        # The reference's forward had inputs of its own (it may write to them); the comparisons' are made again from
        # the seed once they are gone. A clone of them held beside the originals was one more input's worth at the
        # forward's peak (a 7.5 GB RMSNorm's judge held 42 GB).
        own = None
        inputs = make_inputs(setup.ref_mod, seed, device, dtype)
        t2 = time.perf_counter()
        spent["inputs"] += t2 - t_ref
        try:
            reply = setup.runner.call(seed, timeout=setup.remaining(), byte_limit=state["byte_limit"],
                                      check_mutation=True)
        except StageError as exc:
            if exc.status in ("runtime_error", "incorrect"):
                exc.message = f"trial {trial + 1}/{trials}: {exc.message}"
            raise
        finally:
            spent["candidate"] += time.perf_counter() - t2
        t3 = time.perf_counter()
        note_reply(reply, result, counts)
        cand_out = reply.outputs
        refs = flatten_outputs(ref_out)
        answers = [r for r in refs if inexact(r)]
        small = sum(r.numel() for r in refs) <= KEPT_ANSWER_ELEMENTS
        if not small and places is None:
            places = _sample_places(refs)
        sampled_refs = [] if small else _sampled(refs, places)
        expected = output_form(ref_out)
        if reply.form != expected:  # a tuple of one where the reference returns a tensor, and so on
            # a runner always says its form: one that said none was rewritten (round 33: "" skipped the check)
            got = _form_text(reply.form) if reply.form else "no form (its runner said none)"
            cmp = Comparison(False, f"forward returned {got}, the reference returns {_form_text(expected)}")
        else:
            cmp = judge(device, ref_model, inputs, cand_out, ref_out, atol, rtol, result, state,
                        trivial_outputs(ref_out, inputs), previous)
        if cmp.ok and not cmp.by_float64 and previous_sampled:
            cmp = _sampled_against_previous(cand_out, sampled_refs, places, previous_sampled, atol, rtol)
        coincide = cmp.answers_coincide
        degenerate |= cmp.degenerate
        unverifiable |= cmp.unverifiable
        identity |= cmp.degenerate and is_input(inputs, ref_out, atol, rtol)
        report["max_abs_err"] = max(report["max_abs_err"], cmp.max_abs_err)
        report["max_rel_err"] = max(report["max_rel_err"], cmp.max_rel_err)
        report["rel_l2_err"] = max(report["rel_l2_err"], cmp.rel_l2)
        failed_trial = None if cmp.ok else trial + 1
        by_float64 = cmp.by_float64
        if cmp.ok and earlier is not None and not by_float64:
            # The same test backwards: the earlier trial's answer held against this trial's. An output
            # that ignores its inputs cannot sit within 0.3x the distance between two answers of both
            # (the triangle inequality), so it fails here even when it landed close to this answer.
            cmp = compare_outputs(earlier[0], earlier[1], atol, rtol, other_answers=answers)
            degenerate |= cmp.degenerate
            coincide |= cmp.answers_coincide
            failed_trial = None if cmp.ok else trial
        if previous or previous_sampled:
            pairs += 1
            coincident_pairs += coincide
        earlier = None
        spent["judge"] += time.perf_counter() - t3
        if failed_trial is not None:
            report["failed_trial"] = failed_trial
            report["reason"] = cmp.reason
            result.update(status="incorrect", error=f"trial {failed_trial}/{trials}: {cmp.reason}")
            break
        report["passed"] += 1
        last = (seed, inputs, ref_out)
        # The last trial's answer, as a shortcut that ignores its inputs would return it: where it
        # passes, the output barely depends on the inputs (a mean over 1e8 values) and is held to
        # a relative error well below how far it moves between inputs. Kept only when small.
        previous = answers if small else []
        previous_sampled = sampled_refs
        # Not after a float64 verdict: against this fp32 answer the output fails by construction.
        earlier = (flatten_outputs(cand_out), refs) if small and not by_float64 else None
        del cand_out, ref_out
    # The last trial's candidate outputs go before the rerun's come: held across it (by ``reply``), a 6.4 GB
    # problem's judge held two of them at once
    reply = refs = answers = sampled_refs = None
    # Answers that never move between inputs leave a kernel indistinguishable from a memorised answer.
    unverifiable |= pairs > 0 and coincident_pairs == pairs
    extra_from = time.perf_counter()
    inputs = None  # the last trial's: ``last`` holds them for the rerun, and nothing past it
    if last is not None:
        _determinism_rerun(setup, last, result, state, counts)
        last = None  # its inputs and answer go before the widened trial's are made
    if identity and result.get("status") != "incorrect":
        widened = _widened_trial(setup, extra_seed, result, state, counts)
        unverifiable = unverifiable if widened is None else widened
        # The timed calls then run on such inputs too (judge_timing.timing_stage): a forward that told this trial by
        # its values (both signs) computed here and returned its input in every timed call, and passed them all
        # (round 12).
        state["widen"] = widened is not None
    spent["extra"] = time.perf_counter() - extra_from
    report["seconds"] = {k: round(v, 4) for k, v in spent.items()} | {"total": round(time.perf_counter() - began, 4)}
    if degenerate:
        result["flags"].append("degenerate_problem")
    if unverifiable and result.get("status") != "incorrect":
        result["flags"].append("unverifiable_output")
    result["custom_kernel_launches"] = counts["launches"]
    result["backend"] = ",".join(sorted(counts["backends"])) or "torch"
    if counts["launches"] == 0:
        result["flags"].append("no_custom_kernel")
    if result.get("status") != "incorrect":
        result["correct"] = True


def _determinism_rerun(setup: TrialSetup, last: tuple[int, list[Any], Any], result: dict[str, Any],
                       state: dict[str, Any], counts: dict[str, Any]) -> None:
    """Run the candidate again on the last trial's inputs: an answer that changes between two calls
    on the same data depends on hidden state (a cache, a race, uninitialised memory)."""
    seed, inputs, ref_out = last
    try:
        reply = setup.runner.call(seed, timeout=setup.remaining(), byte_limit=state["byte_limit"],
                                  check_mutation=True)
    except StageError as exc:
        if exc.status in ("runtime_error", "incorrect"):
            exc.message = "rerun on the same inputs: " + exc.message
        raise
    note_reply(reply, result, counts)
    cmp = judge(setup.device, setup.ref_model, inputs, reply.outputs, ref_out, setup.atol, setup.rtol, result, state)
    if not cmp.ok:
        result["flags"].append("nondeterministic")
        result.update(status="incorrect",
                      error=f"a second run on the same inputs gave a different answer: {cmp.reason}")


def _sync(device: torch.device) -> None:
    """The reference's forward finished before its time is read (a GPU runs it asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_input(inputs: list[Any], ref_out: Any, atol: float, rtol: float) -> bool:
    """Whether the one output is an input, as shaped or in another layout (input_views), within the tolerance."""
    outs = flatten_outputs(ref_out)
    return len(outs) == 1 and any(compare_outputs(x, outs[0], atol, rtol).ok for x in input_views(inputs, outs))


def input_views(inputs: list[Any], refs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every floating (or complex) input, and where the outputs take another layout of its elements, that layout:
    the input with its last two dimensions swapped, or reshaped to an output's shape of the same element count.
    Each is free to return (a view), so where one passes an output's tolerance it is a trivial output (round 17:
    ``(x + 1e-6 tanh(x @ x)).t()`` answered with ``x.t()``, correct at 4.2-10.2x). A layout that is an output
    exactly is left out: the problem is then data movement (a transpose), whose honest kernels keep their credit
    (round 15), while the free view itself launches no kernel of the candidate's (the dataflow stage). No list of
    layouts is complete (a flip, a slice)."""
    answers = [r for r in refs if inexact(r)]
    shapes = {tuple(r.shape) for r in answers}
    views: list[torch.Tensor] = []
    for x in inputs:
        if not (isinstance(x, torch.Tensor) and inexact(x)):
            continue
        views.append(x)
        others = [x.transpose(-2, -1)] if x.dim() >= 2 and tuple(x.transpose(-2, -1).shape) in shapes else []
        others += [x.reshape(shape) for shape in sorted(shapes)
                   if shape != tuple(x.shape) and x.numel() == math.prod(shape) and x.is_contiguous()]
        views += [v for v in others if not any(v.shape == r.shape and v.dtype == r.dtype and torch.equal(v, r)
                                               for r in answers)]
    return views


def _widened_trial(setup: TrialSetup, seed: int, result: dict[str, Any], state: dict[str, Any],
                   counts: dict[str, Any]) -> bool | None:
    """On this problem's own inputs the answer is the input itself (ReLU of ``torch.rand``), so returning
    the input passes every trial. One more trial on inputs with both signs and values beyond +-1 tells
    a kernel from a copy; skipped (None) when the reference is not finite there (its domain is narrower)
    or is the input there too. Otherwise returns whether a trivial output still passes on these inputs."""
    atol, rtol = setup.atol, setup.rtol
    try:
        with torch.no_grad():  # inputs of its own, as in the trials (run_trials)
            ref_out = setup.ref_model(*make_inputs(setup.ref_mod, seed, setup.device, setup.dtype, widen=True))
    except Exception:  # noqa: BLE001 - the reference's own domain is narrower: no verdict from this trial
        return None
    inputs = make_inputs(setup.ref_mod, seed, setup.device, setup.dtype, widen=True)
    refs = flatten_outputs(ref_out)
    finite = all(all_finite(r) for r in refs if inexact(r))
    if not finite or is_input(inputs, ref_out, atol, rtol):
        return None
    try:
        reply = setup.runner.call(seed, timeout=setup.remaining(), byte_limit=state["byte_limit"], widen=True,
                                  check_mutation=True)
    except StageError as exc:
        if exc.status in ("runtime_error", "incorrect"):
            exc.message = "trial on inputs of both signs: " + exc.message
        raise
    note_reply(reply, result, counts)
    result["correctness"]["widened_trial"] = True
    cmp = judge(setup.device, setup.ref_model, inputs, reply.outputs, ref_out, atol, rtol, result, state,
                trivial_outputs(ref_out, inputs))
    if not cmp.ok:
        result.update(status="incorrect", error="this problem's inputs make its output equal its input, so one "
                      f"more trial ran on inputs of both signs (3 * randn): {cmp.reason}")
    return cmp.unverifiable


def _counting_flops(model: Any, inputs: list[Any]) -> tuple[Any, int | None]:
    """The reference output and its floating-point operation count (None when not countable)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter:
            out = model(*inputs)
        return out, int(counter.get_total_flops())
    except Exception:  # noqa: BLE001 - exotic ops: fall back to the memory floor alone
        return model(*inputs), None


def trivial_outputs(ref_out: Any, inputs: list[Any]) -> list[torch.Tensor]:
    refs = flatten_outputs(ref_out)
    # zeros as one element seen at every place (stride 0): flattened and sliced as the comparisons do, still a view, so
    # a 6.4 GB output's zeros take no memory (a full tensor of them did, on the device, each trial)
    trivial = [torch.zeros((), dtype=r.dtype, device=r.device).expand(r.numel()).view(r.shape)
               for r in refs if inexact(r)]
    # every input, not the first only (round 17: ``b + 1e-6 tanh(a @ a)`` answered with ``b``, 10-16x, correct), and
    # in the outputs' layouts (input_views); the comparisons take those of an output's shape
    trivial += input_views(inputs, refs)
    return trivial


# Under this share of an output's nonzero elements wrong with the candidate's kernels knocked out, the kernels made a
# sliver of it (round 15: one element of 16,384 computed by a kernel, PyTorch the rest). An honest kernel that writes
# a fresh buffer leaves it wrong nearly everywhere when skipped, an in-place epilogue wherever it changes a value (a
# ReLU: half). Counted against the nonzero elements: a sparse answer written over a zero fill is wrong wherever it
# is not zero (round 16: a ReLU of x - 2.5, 0.6% nonzero). Low, because what lies between is ambiguous (round 16: an
# honest in-place clamp that clips 0.44% of PyTorch's matmul output looks like a kernel computing 0.44% of it): it
# holds a handful of elements (0.2%: 32 of 16,384), not a share of the work; the dataflow stage does the rest.
SLIVER_SHARE = 0.002


def kernels_needed(runner: RunnerProcess, seed: int, reference: Callable[[int], Any],
                   check: Callable[[Any, Any, int], str | None], *, timeout: float, byte_limit: int,
                   chunk_bytes: int = 0, widen: bool = False, rtol: float = 0.0,
                   report: dict[str, Any] | None = None) -> bool:
    """Whether the candidate's answer needs its own kernels: one forward on fresh inputs with them doing nothing
    (launches.py). A launch count cannot tell a kernel that computes the answer from one that touches one element
    of a PyTorch answer (round 12: the reference plus a one-element Triton kernel kept its speed credit); a right
    answer without the kernels can, and so can one wrong in under ``SLIVER_SHARE`` of its elements (round 15: a
    kernel that computes one element). Anything else (a wrong answer, an exception, a crash, a hang) says they were
    needed. Run last, on a runner nothing else will use: what a skipped kernel leaves behind harms no later call.
    ``report`` gets the share of elements the knocked-out answer got wrong, where it could be measured."""
    try:
        reply = runner.call(seed, timeout=timeout, byte_limit=byte_limit, timed=bool(chunk_bytes),
                            chunk_bytes=chunk_bytes, widen=widen, knockout=True)
        expected = reference(seed)
        if check(reply.outputs, expected, seed) is None:
            return False
        share = wrong_share(reply.outputs, expected, rtol)
        if report is not None and share is not None:
            report["knockout_wrong_share"] = share
        return share is None or share >= SLIVER_SHARE
    except Exception:  # noqa: BLE001 - StageError or what the judgement of spoiled outputs raises: kernels matter
        return True


def wrong_share(outputs: Any, expected: Any, rtol: float) -> float | None:
    """The share of an output's elements off the reference's by more than ``rtol`` of it (NaN where the reference
    has a number is wrong), against its nonzero elements (at most 1), the largest over the outputs (a kernel that
    computes a whole small output, a loss beside a big tensor, made all of that output: a reduction's work is not a
    sliver), or None where the outputs are not the reference's shapes (drawn chunks of a large output: the share is
    not measured, and the kernels count as needed as before). No absolute tolerance: on a problem of tiny values (a
    degenerate one) a skipped kernel's zero-filled buffer would be within it everywhere, and an honest kernel would
    look like a sliver; rounding in PyTorch's part only makes a sliver look bigger."""
    cand, ref = flatten_outputs(outputs), flatten_outputs(expected)
    if len(cand) != len(ref) or any(c.shape != r.shape for c, r in zip(cand, ref, strict=True)):
        return None
    shares = []
    for c, r in zip(cand, ref, strict=True):
        if not r.numel():
            continue
        if not (c.is_floating_point() or r.is_floating_point()):
            wrong = (c.to(r.device) != r).sum()
        else:
            c, r = c.to(r.device, torch.float64), r.to(torch.float64)
            wrong = (~torch.isclose(c, r, rtol=rtol, atol=0.0, equal_nan=True)).sum()
        shares.append(min(1.0, int(wrong) / max(1, int(r.count_nonzero()))))
    return max(shares) if shares else None


def pytorch_alone(runner: RunnerProcess, seeds: tuple[int, int], reference: Callable[[int], Any],
                  check: Callable[[Any, Any, int], str | None], *, atol: float, rtol: float, deadline: float,
                  byte_limit: int, widen: bool = False) -> dict[str, Any]:
    """Whether PyTorch computed the whole answer while the candidate's kernels only moved it or fed it constants
    (dataflow.py): two traced forwards on fresh inputs, the second reporting which outputs no kernel's work reached.
    ``verdict``: "pytorch" where every output of a right answer is PyTorch's (no kernel's work reached it, or PyTorch
    had computed it anyway), "kernels" where one is not,
    "inconclusive" where the traced call failed, answered wrong or sent no report (no flag: the knockout stands)."""
    try:
        expected = reference(seeds[-1])
        # results of the outputs' sizes are the ones the runner samples (dataflow.DataflowTrace.remember)
        spec = {"atol": atol, "rtol": rtol, "numels": sorted({t.numel() for t in flatten_outputs(expected)})}
        for phase, seed in enumerate(seeds, start=1):
            reply = runner.call(seed, timeout=max(0.5, deadline - time.monotonic()), byte_limit=byte_limit,
                                widen=widen, dataflow={**spec, "phase": phase})
        why = check(reply.outputs, expected, seeds[-1])
    except Exception as exc:  # noqa: BLE001 - StageError, or what judging the traced outputs raises
        return {"verdict": "inconclusive", "why": f"{type(exc).__name__}: {str(exc)[:300]}"}
    report = reply.dataflow
    if report is None:
        return {"verdict": "inconclusive", "why": "the runner sent no report of the traced call"}
    # the judge's own keys last: nothing in the runner's report stands in for them
    if why is not None:
        return {**report, "verdict": "inconclusive", "why": f"the traced call's answer was wrong: {why[:300]}"}
    if report["overflow"]:  # more of PyTorch's results than an honest forward makes: the answer cannot be traced
        return {**report, "verdict": "pytorch", "why": "too many PyTorch results of the output's size to follow"}
    alone = report["outputs"] > 0 and len(set(report["untainted"]) | set(report["computed"])) == report["outputs"]
    return {**report, "verdict": "pytorch" if alone else "kernels"}
