"""The calibrations a device's judges share (kb_gym/calibration_board.py): what the evaluator keeps of a judge's
``calibration`` messages and hands to the device's other judges with each grant."""

from __future__ import annotations

from kb_gym import calibration_board
from kb_gym.calibration_board import CalibrationBoard, problem_hash

P = problem_hash("class Model: ...")


def entry(measured_at: float, overhead_ms: float = 1.0, problem: str = P, chunk: int = 0) -> dict:
    return {"key": [problem, "fp32", False, chunk, False], "overhead_ms": overhead_ms, "spread_ms": 0.01,
            "measured_at": measured_at}


def test_the_newest_entry_per_key_is_kept_and_handed_out_for_its_problem_and_device_only():
    board = CalibrationBoard()
    assert board.keep("cuda:0", entry(10.0, 1.0))
    assert board.keep("cuda:0", entry(5.0, 2.0))  # older: well formed, not kept
    assert board.keep("cuda:0", entry(12.0, 3.0, chunk=1 << 20))  # the same problem's other path
    assert board.keep("cuda:1", entry(20.0, 4.0))
    assert board.keep("cuda:0", entry(30.0, 5.0, problem=problem_hash("other")))
    assert sorted(e["overhead_ms"] for e in board.for_problem("cuda:0", P)) == [1.0, 3.0]
    assert [e["overhead_ms"] for e in board.for_problem("cuda:1", P)] == [4.0]
    assert board.keep("cuda:0", entry(11.0, 6.0))  # newer: replaces
    assert sorted(e["overhead_ms"] for e in board.for_problem("cuda:0", P)) == [3.0, 6.0]


def test_a_malformed_message_is_dropped_and_changes_nothing():
    board = CalibrationBoard()
    board.keep("cpu", entry(1.0))
    for bad in (None, "x", {}, {"key": [P]}, {"measured_at": 2.0}, {"key": [[1]], "measured_at": 2.0},
                {"key": [], "measured_at": 2.0}, {"key": [P], "measured_at": "soon"},
                {"key": [P, "fp32", False, 0, False], "measured_at": float("nan")},
                {"key": [3, "fp32"], "measured_at": 2.0}):
        assert not board.keep("cpu", bad), bad
    assert [e["measured_at"] for e in board.for_problem("cpu", P)] == [1.0]


def test_the_oldest_keys_go_past_the_bound_and_what_is_handed_out_is_a_copy(monkeypatch):
    monkeypatch.setattr(calibration_board, "MAX_KEYS", 3)
    board = CalibrationBoard()
    for k in range(5):
        board.keep("cpu", entry(float(k), problem=problem_hash(str(k))))
    assert [board.for_problem("cpu", problem_hash(str(k))) != [] for k in range(5)] == [False, False, True, True, True]
    handed = board.for_problem("cpu", problem_hash("4"))
    handed[0]["overhead_ms"] = 99.0
    assert board.for_problem("cpu", problem_hash("4"))[0]["overhead_ms"] == 1.0
