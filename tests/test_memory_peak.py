"""scripts/memory_peak.py: what the judge held at each stage's peak, from the allocation histories it writes under
KB_GYM_MEMORY_HISTORY (kb_gym/worker/memory_history.py), in torch.cuda.memory's snapshot format."""

from __future__ import annotations

import importlib.util
import pickle
import sys
from pathlib import Path

GIB = 1 << 30


def _script():
    path = Path(__file__).resolve().parents[1] / "scripts" / "memory_peak.py"
    spec = importlib.util.spec_from_file_location("memory_peak", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _frames(line: int, name: str) -> list[dict]:
    # innermost first, as the snapshot lists them: torch's own frame, then the judge's
    return [{"filename": "/site/torch/random.py", "line": 1, "name": "randn"},
            {"filename": "/site/kb_gym/worker/inputs.py", "line": line, "name": name},
            {"filename": "/site/kb_gym/worker/correctness.py", "line": 140, "name": "run_trials"},
            {"filename": "/site/kb_gym/worker/job.py", "line": 500, "name": "_pipeline"}]


def _history(tmp_path: Path) -> list[tuple[str, int]]:
    """One job's three marks: load (nothing), correctness (a 6 GiB peak of three tensors, one freed before a
    smaller second rise), timing (a 4 GiB peak made of what correctness left plus its own)."""
    events, t = [], 0

    def act(action: str, addr: int, size: int = 0, line: int = 0, name: str = "") -> None:
        nonlocal t
        t += 10
        events.append({"action": action, "addr": addr, "size": size, "time_us": t,
                       "frames": _frames(line, name) if action == "alloc" else []})

    act("segment_alloc", 900, 8 * GIB)  # the allocator's own actions are not tensors
    marks = [("load", t)]
    act("alloc", 1, 2 * GIB, 50, "make_inputs")
    act("alloc", 2, 2 * GIB, 55, "make_inputs")
    act("alloc", 3, 2 * GIB, 61, "clone_inputs")  # the peak: 6 GiB
    act("free_requested", 3)
    act("free_completed", 3)
    act("alloc", 4, GIB, 70, "answer")  # 5 GiB: not a new peak
    act("free_completed", 2)
    marks.append(("correctness", t))
    act("alloc", 5, GIB, 80, "timed")  # 4 GiB: inputs 1 and 4 and this
    act("free_completed", 5)
    marks.append(("timing", t))
    for stage, end in marks:  # each mark writes the history so far, as the judge does
        snapshot = {"segments": [], "device_traces": [[e for e in events if e["time_us"] <= end]]}
        (tmp_path / f"level1_19_ReLU-3-{stage}.pickle").write_bytes(pickle.dumps(snapshot))
    return marks


def test_each_stage_names_what_was_alive_at_its_own_peak(tmp_path, monkeypatch, capsys):
    script = _script()
    marks = _history(tmp_path)
    events = pickle.loads((tmp_path / "level1_19_ReLU-3-timing.pickle").read_bytes())["device_traces"][0]
    peaks = script.stage_peaks(events, marks)
    assert "load" not in peaks  # no tensor was made before its mark
    most, groups = peaks["correctness"]
    assert most == 6 * GIB
    assert groups[0] == ("inputs.py:50 make_inputs < correctness.py:140 run_trials", 2 * GIB, 1)
    assert {site.split()[0] for site, _, _ in groups} == {"inputs.py:50", "inputs.py:55", "inputs.py:61"}
    most, groups = peaks["timing"]  # its own window: the freed clone and the answer's rise are correctness's
    assert most == 4 * GIB and {site.split()[0] for site, _, _ in groups} == {"inputs.py:50", "inputs.py:70",
                                                                            "inputs.py:80"}

    monkeypatch.setattr(sys, "argv", ["memory_peak.py", str(tmp_path), "level1_19_ReLU"])
    script.main()
    printed = capsys.readouterr().out
    assert "# level1_19_ReLU-3:" in printed
    assert "== correctness: 6.00 GiB held at its peak" in printed and "== timing: 4.00 GiB" in printed


def test_the_load_window_begins_at_the_jobs_start_not_with_the_last_jobs_tail(tmp_path):
    """The history a judge keeps spans its earlier jobs; the "start" mark (written as the job begins) keeps their
    peaks out of this job's load stage, while what they left alive still counts (the judge held it)."""
    script = _script()
    events = [{"action": "alloc", "addr": 1, "size": 6 * GIB, "time_us": 10, "frames": _frames(50, "last_job")},
              {"action": "alloc", "addr": 2, "size": GIB, "time_us": 20, "frames": _frames(51, "left_alive")},
              {"action": "free_completed", "addr": 1, "size": 0, "time_us": 30, "frames": []},
              {"action": "alloc", "addr": 3, "size": 2 * GIB, "time_us": 50, "frames": _frames(60, "this_job")}]
    peaks = script.stage_peaks(events, [("start", 40), ("load", 60)])
    assert "start" not in peaks
    most, groups = peaks["load"]
    assert most == 3 * GIB and {site.split()[0] for site, _, _ in groups} == {"inputs.py:51", "inputs.py:60"}
    # without the start mark the last job's 6 GiB (gone before this job began) was reported as the load stage's
    assert script.stage_peaks(events, [("load", 60)])["load"][0] == 7 * GIB
