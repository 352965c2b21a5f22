"""The problem audit: trivial candidates never pass, and degenerate problems are flagged."""

from __future__ import annotations

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


def test_audit_flags_degenerate_problem_and_no_trivial_candidate_passes():
    relu = get_problem(load_problems("builtin"), name="level1/1_ReLU")
    tiny = Problem(id=99, name="99_TinySoftmax", level=1, code=TINY)
    rows = run_audit([relu, tiny], device="cpu", trials=2, progress=False)
    by_name = {r["problem"]: r for r in rows}
    assert set(by_name) == {"level1/1_ReLU", "level1/99_TinySoftmax"}
    for row in rows:
        assert row["passed_by"] == [], row
        assert set(TRIVIAL) <= set(row)
    assert by_name["level1/99_TinySoftmax"]["degenerate"]
    assert not by_name["level1/1_ReLU"]["degenerate"]
    text = format_audit(rows)
    assert "99_TinySoftmax" in text and "flagged degenerate: 1" in text
