"""The problem audit: trivial candidates never pass, and degenerate problems are flagged (on the CPU in CI; on a GPU
with KB_GYM_ADVERSARIAL_DEVICE, device.py)."""

from __future__ import annotations

import json

from device import DEVICE

from kb_gym import Problem, get_problem, load_problems
from kb_gym.audit import TRIVIAL, format_audit, run_audit

TINY = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    """Outputs so small that zeros pass an absolute tolerance of 1e-4."""
    def forward(self, x):
        return torch.softmax(x, dim=1) * 1e-3

def get_inputs():
    return [torch.randn(16, 4096)]

def get_init_inputs():
    return []
'''


def test_audit_flags_degenerate_problem_and_no_trivial_candidate_passes(tmp_path):
    relu = get_problem(load_problems("builtin"), name="level1/1_ReLU")
    tiny = Problem(id=99, name="99_TinySoftmax", level=1, code=TINY)
    out = tmp_path / "audit.jsonl"
    rows = run_audit([relu, tiny], device=DEVICE, trials=2, progress=False, out=out)
    written = {r["problem"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert written == {r["problem"]: r for r in rows}  # every row reached the file, in completion order
    by_name = {r["problem"]: r for r in rows}
    assert set(by_name) == {"level1/1_ReLU", "level1/99_TinySoftmax"}
    for row in rows:
        assert row["passed_by"] == [], row
        assert set(TRIVIAL) <= set(row) and row["reference"] == "correct"
        # The float64 control: a kernel more exact than the reference passes, and its error is on record.
        assert row["fp64_reference"] == "correct" and row["rel_l2"]["fp64_reference"] < 1e-5, row
    assert by_name["level1/99_TinySoftmax"]["degenerate"] and not by_name["level1/99_TinySoftmax"]["unverifiable"]
    assert not by_name["level1/1_ReLU"]["degenerate"]
    # Where the time went, per candidate: the queue and the evaluation's total at least.
    assert set(by_name["level1/1_ReLU"]["stage_seconds"]) == {*TRIVIAL, "reference", "fp64_reference"}
    assert all(s["total"] >= s.get("correctness", 0) > 0 for s in by_name["level1/1_ReLU"]["stage_seconds"].values())
    text = format_audit(rows)
    assert "99_TinySoftmax" in text and "flagged degenerate: 1" in text


def test_audit_resumes_from_its_jsonl_and_reruns_a_cut_line(tmp_path):
    """Rows already written are kept as they are (not re-run); a half-written last line is re-run."""
    problems = load_problems("builtin", level=1)[:2]
    out = tmp_path / "audit.jsonl"
    kept = {"problem": problems[0].key, "degenerate": False, "passed_by": ["sentinel"], "errors": {},
            "zeros": "incorrect", "reference": "correct", "fp64_reference": "correct"}
    out.write_text(json.dumps(kept) + "\n" + '{"problem": "' + problems[1].key + '", "degen')
    rows = run_audit(problems, device=DEVICE, trials=1, kinds=("zeros",), progress=False, out=out)
    assert rows[0] == kept
    assert rows[1]["problem"] == problems[1].key and rows[1]["zeros"] == "incorrect"
    assert json.loads(out.read_text().splitlines()[-1]) == rows[1]
    # Asked for a candidate the kept row lacks, the audit runs that problem again.
    rows = run_audit(problems[:1], device=DEVICE, trials=1, kinds=("zeros", "first_input"), progress=False, out=out)
    assert rows[0]["passed_by"] == [] and rows[0]["first_input"] == "incorrect"
    # A row where a candidate ran out of device memory (beside another worker) has no verdict: it runs again.
    short = {**rows[0], "passed_by": ["sentinel"], "out_of_memory": ["fp64_reference"]}
    out.write_text(json.dumps(short) + "\n")
    rows = run_audit(problems[:1], device=DEVICE, trials=1, kinds=("zeros",), progress=False, out=out)
    assert rows[0]["passed_by"] == [] and rows[0]["out_of_memory"] == []
    # A control that crashed (a judge that failed to restart: the evaluator's failure, not the problem's) too.
    out.write_text(json.dumps({**rows[0], "passed_by": ["sentinel"], "fp64_reference": "crash"}) + "\n")
    rows = run_audit(problems[:1], device=DEVICE, trials=1, kinds=("zeros",), progress=False, out=out)
    assert rows[0]["passed_by"] == [] and rows[0]["fp64_reference"] == "correct"


ALWAYS_ZERO = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        m = x.amax(1, keepdim=True)
        return m - m.mean(1, keepdim=True)

def get_inputs():
    return [torch.randn(32, 128)]

def get_init_inputs():
    return []
'''


def test_audit_reports_a_problem_zeros_pass_as_unverifiable():
    rows = run_audit([Problem(id=98, name="98_AlwaysZero", level=2, code=ALWAYS_ZERO)], device=DEVICE, trials=2,
                     progress=False)
    (row,) = rows
    assert "zeros" in row["passed_by"] and row["unverifiable"] and row["reference"] == "correct"
    assert "unverifiable: 1" in format_audit(rows)


def test_no_trivial_candidate_passes_a_built_in_problem_and_every_reference_does():
    # at their CPU size on any device: the GPU-size audit of the built-in set is `scripts/gpu_check.sh audit`'s
    # (AUDIT_DATASET=builtin; minutes of multi-GB outputs on one worker)
    rows = run_audit(load_problems("builtin", size="cpu"), device=DEVICE, trials=2, progress=False)
    assert len(rows) == len(load_problems("builtin"))
    assert [r["problem"] for r in rows if r["passed_by"] or r["degenerate"] or r["unverifiable"]] == []
    assert [r["problem"] for r in rows if r["reference"] != "correct"] == []


CANCELLING_SUM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    """Like minGPT and the LSTM of level 3: a submodule reached through a closure, a tensor made in forward."""
    def __init__(self):
        super().__init__()
        self.scale = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.scale.weight.fill_(1.0)
        scale = self.scale
        self.apply_scale = lambda t: scale(t.unsqueeze(-1)).squeeze(-1)

    def forward(self, x):
        offset = torch.zeros(x.shape[0], device=x.device)
        return self.apply_scale(x.sum(dim=1)) + offset

def get_inputs():
    return [torch.randn(8192, 2048) + (b := torch.randn(2048) * 20) - b.mean()]

def get_init_inputs():
    return []
'''


def test_audit_passes_the_float64_control_where_the_reference_itself_is_inexact():
    """The fp32 sum of cancelling terms is off from float64 on ~0.2% of rows (L2/14 of the official set): the
    float64 control is more exact than the reference and must still pass; the row says the reference is inexact.
    Both the control and the runtime's second opinion run this model in float64 through its closure."""
    problem = Problem(id=97, name="97_CancellingSum", level=1, code=CANCELLING_SUM)
    (row,) = run_audit([problem], device=DEVICE, trials=2, kinds=("zeros",), progress=False)
    assert row["reference"] == "correct" and row["fp64_reference"] == "correct", row
    assert row["ill_conditioned"] and row["passed_by"] == [] and not row["unverifiable"]
    assert "reference inexact (judged against float64): 1" in format_audit([row], ("zeros",))
