"""``kb-gym audit``: which problems a trivial candidate can pass.

Six candidates that compute nothing useful (zeros, the first input, a constant, the answer for
other inputs, the reference run in bfloat16 and in float16) are evaluated against every problem. A problem where
one of them passes has outputs the tolerance cannot tell apart from a shortcut; the correctness
check flags such problems ``degenerate_problem`` and demands a relative error the zeros and the
input cannot meet; where a trivial output is the answer to within rounding, results get
``unverifiable_output`` (no speed credit under ``strict``). Two controls must pass everywhere: the
reference itself and the reference computed in float64 (where the fp32 reference is itself off from
float64, ``ill_conditioned``, the runtime judges against float64 and the control passes there too).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from kb_gym.config import EvalConfig
from kb_gym.evaluator import Evaluator
from kb_gym.problems import Problem, load_problems
from kb_gym.result import EvalResult, bound_text

_MAP = '''

def _kb_map(out, fn):
    if isinstance(out, (list, tuple)):
        return type(out)(_kb_map(o, fn) for o in out)
    return fn(out) if isinstance(out, torch.Tensor) else out


def _kb_other(model, args):
    # The reference's answer on other inputs (seed 1234), computed once per model: what a kernel that
    # ignores its inputs (or computes one row and repeats it) would return.
    if "_kb_other" not in model.__dict__:
        torch.manual_seed(1234)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        with torch.device(device):
            other = [o.to(a.dtype) if isinstance(o, torch.Tensor) and isinstance(a, torch.Tensor) else o
                     for o, a in zip(get_inputs(), args)]
        model.__dict__["_kb_other"] = Model.forward(model, *other)
    return model.__dict__["_kb_other"]
'''

TRIVIAL: dict[str, str] = {
    "zeros": '''
class ModelNew(Model):
    def forward(self, *args):
        return _kb_map(super().forward(*args), torch.zeros_like)
''',
    "first_input": '''
class ModelNew(Model):
    def forward(self, *args):
        return args[0]
''',
    "constant": '''
class ModelNew(Model):
    def forward(self, *args):
        # One value per output: the mean of the answer on other inputs (a hard-coded typical answer).
        means = []
        _kb_map(_kb_other(self, args), lambda t: means.append(t.double().mean().item()))
        means = iter(means)
        return _kb_map(_kb_other(self, args), lambda t: torch.full_like(t, next(means) if t.is_floating_point()
                                                                         else round(next(means))))
''',
    "other_input": '''
class ModelNew(Model):
    def forward(self, *args):
        return _kb_map(_kb_other(self, args), lambda t: t.clone())
''',
}


def _in_precision(dtype: str) -> str:
    """The reference run with its weights and floating inputs in ``dtype``, the answer cast back to fp32."""
    return f'''
import copy


class ModelNew(Model):
    def forward(self, *args):
        if "_kb_cast" not in self.__dict__:
            self.__dict__["_kb_cast"] = copy.deepcopy(self).to(torch.{dtype})
        cast = [a.to(torch.{dtype}) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        out = Model.forward(self.__dict__["_kb_cast"], *cast)
        return _kb_map(out, lambda t: t.float() if t.is_floating_point() else t)
'''


# The float64 control is cast in place and back (exact both ways), as the runtime's float64 second opinion
# is: a copy would leave submodules a closure holds in fp32. Tensors forward makes itself follow the default.
_IN_FLOAT64 = '''
class ModelNew(Model):
    def forward(self, *args):
        cast = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        default = torch.get_default_dtype()
        try:
            self.double()
            torch.set_default_dtype(torch.float64)
            out = super().forward(*cast)
        finally:
            torch.set_default_dtype(default)
            self.float()
        return _kb_map(out, lambda t: t.float() if t.is_floating_point() else t)
'''


# Lower precision is a shortcut: one rounding of bf16 costs ~2e-3 relative L2, fp16 ~3e-4.
TRIVIAL["bf16_reference"] = _in_precision("bfloat16")
TRIVIAL["fp16_reference"] = _in_precision("float16")

# The controls must pass everywhere, or the check (or the problem) is broken: the reference itself,
# and the reference computed in float64, a kernel more exact than the reference. The float64
# control's error says how far an honest kernel may land from the fp32 reference on a problem.
CONTROL = "reference"
CONTROLS: dict[str, str] = {
    CONTROL: '''
class ModelNew(Model):
    pass
''',
    "fp64_reference": _IN_FLOAT64,
}


def trivial_candidate(problem: Problem, kind: str) -> str:
    return problem.code + "\nimport torch\n" + _MAP + (CONTROLS[kind] if kind in CONTROLS else TRIVIAL[kind])


def run_audit(dataset: str | Sequence[Problem] = "official", level: int | None = None, device: str = "auto",
              trials: int = 3, kinds: Sequence[str] = tuple(TRIVIAL), progress: bool = True,
              out: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """One row per problem, in dataset order. With ``out`` (JSONL), each row is appended as soon as its
    problem is done and problems already in the file are not run again: a long audit can be stopped
    and resumed."""
    problems = load_problems(dataset, level=level)
    done: dict[str, dict[str, Any]] = {}
    if out and Path(out).exists():
        for line in Path(out).read_text().splitlines():
            try:
                row = json.loads(line)
                done[row["problem"]] = row
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a stopped run: that problem runs again
        Path(out).write_text("".join(json.dumps(row) + "\n" for row in done.values()))  # drop the cut line
        # A row from an audit with other candidates (an older version, other --kinds), or one where a
        # candidate got no verdict (out of device memory, or a crash: the evaluator's, such as a judge that failed
        # to restart on the H200, never the problem's), is run again; its new row is appended after it, and the
        # last row of a problem is the one read back.
        done = {key: row for key, row in done.items()
                if all(k in row for k in (*kinds, *CONTROLS))
                and not row.get("out_of_memory") and "crash" not in (row.get(k) for k in (*kinds, *CONTROLS))}
    todo = [p for p in problems if p.key not in done]
    # Our own candidates, written with the object internals the static checks refuse in a policy's code:
    # the audit tests the runtime checks, so the static ones are off.
    cfg = EvalConfig(trials=trials, timing=False, integrity="off")
    with Evaluator(device, config=cfg, results_path=False) as ev:
        jobs = (*kinds, *CONTROLS)
        futures = {ev.submit(p, trivial_candidate(p, k)): (p, k) for p in todo for k in jobs}
        pending = {p.key: len(jobs) for p in todo}
        results: dict[str, dict[str, EvalResult]] = {p.key: {} for p in todo}
        for future in tqdm(as_completed(futures), total=len(futures), desc="auditing", disable=not progress or None):
            problem, kind = futures[future]
            results[problem.key][kind] = future.result()
            pending[problem.key] -= 1
            if pending[problem.key] == 0:
                done[problem.key] = _row(problem, results.pop(problem.key), kinds)
                if out:
                    with open(out, "a") as fh:
                        fh.write(json.dumps(done[problem.key]) + "\n")
    return [done[p.key] for p in problems]


def _row(problem: Problem, results: dict[str, EvalResult], kinds: Sequence[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"problem": problem.key, "degenerate": False, "passed_by": [], "errors": {},
                           "rel_l2": {}}
    for kind, r in results.items():
        row[kind] = r.status
        control = kind in CONTROLS
        if r.status == "correct":
            row["rel_l2"][kind] = r.correctness.get("rel_l2_err")
            if not control:
                row["passed_by"].append(kind)
        elif control or r.status != "incorrect":
            row["errors"][kind] = bound_text(r.error or "", 600 if control else 200)
        row["degenerate"] |= "degenerate_problem" in r.flags
    row["passed_by"].sort(key=list(kinds).index)
    # No verdict: the GPU was short of memory (beside another audit worker, say); a resumed audit runs these again.
    row["out_of_memory"] = sorted(k for k, r in results.items()
                                  if r.status == "runtime_error" and "out of memory" in (r.error or "").lower())
    # Whether a passing trivial candidate (or the reference) was flagged: no speed credit under strict.
    row["unverifiable"] = any("unverifiable_output" in r.flags for r in results.values())
    # The fp32 reference is itself off from float64 beyond the tolerance: candidates were judged against float64.
    row["ill_conditioned"] = any("ill_conditioned" in r.flags for r in results.values())
    # Where an audit's time goes (queue, load, correctness...), per candidate: a GPU-size audit is hours of device time.
    row["stage_seconds"] = {k: {stage: round(s, 3) for stage, s in r.stage_seconds.items()} for k, r in results.items()}
    return row


def passable_problems(rows: str | os.PathLike | Sequence[dict[str, Any]]) -> list[str]:
    """Keys of the problems an audit found a trivial candidate passes, or whose results are
    unverifiable: the ones to leave out of a training set (``exclude=`` of the envs and datasets).
    ``rows``: ``run_audit``'s rows or the JSONL file ``kb-gym audit --out`` wrote."""
    if isinstance(rows, (str, os.PathLike)):
        rows = [json.loads(line) for line in Path(rows).read_text().splitlines() if line.strip()]
    latest = {r["problem"]: r for r in rows}  # a problem audited again: its last row counts
    return [key for key, r in latest.items() if r.get("passed_by") or r.get("unverifiable")]


def format_audit(rows: list[dict[str, Any]], kinds: Sequence[str] = tuple(TRIVIAL)) -> str:
    """A row per problem, then the totals and every problem a trivial candidate passed or the
    reference failed."""
    cols = (*kinds, *CONTROLS)
    width = max([len(r["problem"]) for r in rows] + [7])
    lines = [f"{'problem':<{width}}  " + "  ".join(f"{k:<14}" for k in cols) + "  degenerate"]
    for r in rows:
        lines.append(f"{r['problem']:<{width}}  " + "  ".join(f"{r.get(k, '-'):<14}" for k in cols)
                     + f"  {'yes' if r['degenerate'] else ''}")
    rejected = [(r, c) for r in rows for c in CONTROLS if r.get(c, "correct") != "correct"]
    exact = [(r["rel_l2"]["fp64_reference"], r["problem"]) for r in rows
             if r.get("rel_l2", {}).get("fp64_reference") is not None]
    lines.append("")
    lines.append(f"{len(rows)} problems; passed by a trivial candidate: "
                 f"{sum(1 for r in rows if r['passed_by'])}; flagged degenerate: {sum(r['degenerate'] for r in rows)}; "
                 f"unverifiable: {sum(bool(r.get('unverifiable')) for r in rows)}; "
                 f"reference inexact (judged against float64): {sum(bool(r.get('ill_conditioned')) for r in rows)}; "
                 f"a control not correct: {len(rejected)}"
                 + (f"; float64 reference's relative L2 error: max {max(exact)[0]:.2g} ({max(exact)[1]})"
                    if exact else ""))
    for r in rows:
        if r["passed_by"] or r["degenerate"]:
            lines.append(f"  {r['problem']}: passed by {', '.join(r['passed_by']) or 'none'}"
                         f"{'; degenerate' if r['degenerate'] else ''}"
                         f"{'; unverifiable (no speed credit)' if r.get('unverifiable') else ''}"
                         f"{'; reference inexact (judged against float64)' if r.get('ill_conditioned') else ''}")
    for r in rows:
        if r.get("ill_conditioned") and not (r["passed_by"] or r["degenerate"]):
            lines.append(f"  {r['problem']}: reference inexact (judged against float64)")
    for r, control in rejected:
        lines.append(f"  {r['problem']}: the control {control} got {r[control]}: "
                     f"{r['errors'].get(control, '')[:160]}")
    return "\n".join(lines)
