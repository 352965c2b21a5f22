"""``kb-gym bench --batch`` at a CPU size: the mixed batch, its verdicts, and the KernelBench way beside it."""

from __future__ import annotations

import json
import os

import pytest

from kb_gym import load_problems
from kb_gym.batch_bench import batch_part, build_batch, fingerprint, kernelbench_way, run_batch
from kb_gym.batch_report import format_batch, held_coverage, held_split, merge_parts, summarize
from kb_gym.problems.solutions import solution_backend, solution_files


def test_the_batch_is_four_candidates_a_problem_with_our_triton_solutions():
    batch = build_batch("cpu", problems=16, device="cpu")
    keys = [p.key for p, _, _ in batch]
    assert len(batch) == 64 and len(set(keys)) == 16
    assert {kind for _, kind, _ in batch} == {"reference", "triton", "wrong", "raises"}
    assert all(p.size == "cpu" for p, _, _ in batch)
    # on a GPU our CUDA solutions join, labelled as such (they need nvcc and a GPU to build)
    on_gpu = build_batch("cpu", problems=16, device="cuda")
    cuda = [source for _, kind, source in on_gpu if kind == "cuda"]
    assert cuda and all("load_inline" in source for source in cuda)
    # the first eight solved problems (the built-in half beside the official set) take turns over levels and
    # backends: four CUDA, four Triton, all three levels
    first = on_gpu[: 8 * 4]
    assert sorted(k for _, k, _ in first if k in ("cuda", "triton")) == ["cuda"] * 4 + ["triton"] * 4
    assert {p.level for p, _, _ in first} == {1, 2, 3}


def test_the_parts_of_a_batch_deal_out_whole_problems_once_each():
    batch = build_batch("cpu", problems=16, device="cpu")
    parts = [batch_part(batch, (i, 3)) for i in (1, 2, 3)]
    assert sorted(map(id, (row for part in parts for row in part))) == sorted(map(id, batch))
    keys = [{p.key for p, _, _ in part} for part in parts]
    assert not (keys[0] & keys[1] or keys[1] & keys[2] or keys[0] & keys[2])
    with pytest.raises(ValueError):
        batch_part(batch, (4, 3))
    assert fingerprint(batch) == fingerprint(build_batch("cpu", problems=16, device="cpu")) != fingerprint(parts[0])


def _part(i: int, n: int, wall: float, kb_wall: float, busy: float) -> dict:
    rows = [{"problem": f"p{i}", "kind": kind, "status": status, "speedup": None, "total_s": 2.0,
             "stages": {"load": 20.0 if kind == "cuda" else 0.1, "total": 2.0, "queue": 0.5},
             "build_cached": False, "worker_pid": 1}
            for kind, status in (("reference", "correct"), ("cuda", "correct"), ("wrong", "incorrect"))]
    again = [{**rows[1], "build_cached": True, "stages": {"load": 0.1, "total": 1.0}, "total_s": 1.0}]
    return {"size": "gpu", "backend": "local", "workers_per_device": 1, "batch": "b1", "devices": ["cuda:0"],
            "part": f"{i}/{n}", "problems": 1, "wall_s": wall, "gpu_busy": busy, "rows": rows, "cuda_again": again,
            "kernelbench_way": {"wall_s": kb_wall, "rows": [{"status": r["status"]} for r in rows]}}


def test_parts_measured_in_separate_runs_add_up_to_the_batch(tmp_path):
    files = []
    for i, (wall, kb, busy) in enumerate([(10.0, 100.0, 0.5), (30.0, 140.0, 0.7)], 1):
        files.append(tmp_path / f"part{i}.json")
        files[-1].write_text(json.dumps(_part(i, 2, wall, kb, busy)))
    merged = merge_parts(files)
    assert merged["candidates"] == 6 and merged["wall_s"] == 40.0
    assert merged["speedup_over_kernelbench_way"] == 240.0 / 40.0
    assert abs(merged["gpu_busy"] - (0.5 * 10 + 0.7 * 30) / 40) < 1e-9
    assert merged["targets"]["cuda_cold_load_s"] == 20.0 and merged["targets"]["cuda_cache_hits"] == "2/2"
    assert "6.00x faster" in format_batch(merged)
    with pytest.raises(ValueError, match="once each"):
        merge_parts([files[0], files[0]])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**_part(2, 2, 1.0, 1.0, 0.1), "batch": "b2"}))
    with pytest.raises(ValueError, match="one batch"):
        merge_parts([files[0], other])
    from kb_gym.cli import main

    with pytest.raises(SystemExit, match="--merge: parts"):  # the command says what is wrong, no traceback
        main(["bench", "--merge", str(files[0])])


def test_a_candidates_own_time_leaves_out_its_waits_for_a_worker_and_for_the_device():
    """Cache hits are evaluated four at once after the batch: a hit that waited 2 s for the device another
    worker held, or had its load stopped 1 s for another worker's measurement, is not a 2 or 1 s slower hit. A pause
    in its wait for the device is counted once (``paused_for_neighbours`` holds both kinds)."""
    report = _part(1, 1, 10.0, 100.0, 0.5)
    report["cuda_again"][0]["stages"].update(queue=0.25, device_wait=0.5, paused_loading=0.125,
                                             paused_for_neighbours=0.375)
    report["rows"][1]["stages"]["device_wait"] = 0.3
    targets = summarize(report)["targets"]
    assert targets["cuda_cache_hit_total_s"] == 1.0 - 0.25 - 0.5 - 0.125
    assert targets["cuda_cold_total_s"] == 2.0 - 0.5 - 0.3


def test_a_small_batch_gets_the_verdicts_it_should_and_the_kernelbench_way_runs_beside_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    report = run_batch(device="cpu", size="cpu", problems=2, out=str(tmp_path / "batch.json"))
    assert report["candidates"] == 8 and report["problems"] == 2 and report["part"] is None
    assert set(report["statuses"]["reference"]) == {"correct"} and set(report["statuses"]["triton"]) == {"correct"}
    assert set(report["statuses"]["wrong"]) == {"incorrect"}
    assert set(report["statuses"]["raises"]) == {"runtime_error"}
    kb = report["kernelbench_way"]
    assert kb["statuses"].count("correct") == 4 and "incorrect" in kb["statuses"]
    assert report["speedup_over_kernelbench_way"] > 0 and report["gpu_busy"] is None
    assert "KernelBench way" in format_batch(report) and os.path.getsize(tmp_path / "batch.json") > 100
    # where each runner's start-up went (what the timing stage's spare_wait waits for), from the judge's request
    parts = report["correctness_total_s"]  # where the correctness stage went, summed over the batch
    assert parts["candidate"] > 0 and parts["reference"] > 0 and "correctness stage, summed" in format_batch(report)
    startup = report["runner_startup_median_s"]
    assert {"until_ready", "sandbox", "seccomp"} <= set(startup) and startup["until_ready"] >= startup["sandbox"] > 0


def test_the_kernelbench_way_reports_a_broken_candidate():
    relu = next(p for p in load_problems("builtin", size="cpu") if p.name == "1_ReLU")
    assert kernelbench_way(relu, "syntax error(", "cpu", trials=1, reps=1)["status"] == "compile_error"


def test_the_kernelbench_way_runs_a_triton_candidate_from_its_file(monkeypatch):
    """@triton.jit reads its function's source: a candidate exec'd from a string failed with "@jit functions should be
    defined in a Python file", so the KernelBench way judged our Triton solutions compile_error in seconds (part 2/4
    on the H200, 2026-12-04). Triton's interpreter does not check it: on the CPU this runs the loader only."""
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    relu = next(p for p in load_problems("builtin", size="cpu") if p.name == "1_ReLU")
    triton_file = next(f for f in solution_files(device) if f.stem == "1_ReLU" and solution_backend(f) == "triton")
    row = kernelbench_way(relu, triton_file.read_text(), device, trials=1, reps=1)
    assert row["status"] == "correct", row


def test_the_device_held_share_is_the_union_of_the_holds_per_device():
    """Two workers' holds that overlap (shared stages) count once; a hold before the clock is cut at its start; two
    devices are averaged. The held seconds are split by stage, what no stage covers as ``rest``."""
    def row(device, begin, end, **stages):
        return {"device": device, "held_at": [100.0 + begin, 100.0 + end],
                "stages": {"device_held": end - begin, **stages}}

    rows = [row("cuda:0", -1.0, 2.0, correctness=1.0, timing=1.5), row("cuda:0", 1.0, 4.0, timing=2.0),
            row("cuda:0", 6.0, 8.0, teardown=0.5), row("cuda:1", 0.0, 5.0, dataflow=0.5, knockout=0.25)]
    assert held_coverage(rows, 100.0, 10.0) == pytest.approx((0.6 + 0.5) / 2)  # cuda:0 [0, 4] + [6, 8]; cuda:1 [0, 5]
    assert held_coverage(rows, None, 10.0) is None
    split = held_split(rows)
    assert split == pytest.approx({"correctness": 1.0, "timing": 3.5, "kernel checks": 0.75, "teardown": 0.5,
                                   "rest": 3.0 + 3.0 + 2.0 + 5.0 - 5.75})
    assert held_split([{"stages": {"load": 1.0}}]) is None  # no hold (one worker, no host lock)
    report = summarize({"rows": [{**r, "kind": "reference", "status": "correct", "total_s": 1.0,
                                  "build_cached": False} for r in rows],
                        "wall_s": 10.0, "started_at": 100.0, "devices": ["cuda:0", "cuda:1"], "problems": 1,
                        "size": "gpu", "gpu_busy": None})
    assert report["held_coverage"] == pytest.approx(0.55) and "device held 55% of the wall" in format_batch(report)


def test_the_report_counts_the_jobs_run_alone_after_running_out_of_memory():
    """device_turns: how many jobs ran out of the device's memory beside another and ran again alone, how many ran
    alone, and the workers stopped for them, counted from the rows and printed."""
    def row(**turn):
        return {"kind": "reference", "status": "correct", "total_s": 1.0, "build_cached": False, "stages": {},
                **turn}

    rows = [row(), row(alone=True, retried_alone="crash: the judge ran out of the device's memory", evicted=1),
            row(alone=True, evicted=1), row(alone=False, retried_alone=None, evicted=0)]
    report = summarize({"rows": rows, "wall_s": 4.0, "devices": ["cuda:0"], "problems": 1, "size": "gpu",
                        "gpu_busy": None})
    assert report["turns"] == {"alone": 2, "retried_alone": 1, "evicted": 2}
    assert "run again alone: 1; jobs alone: 2; workers stopped for them: 2" in format_batch(report)


def test_the_report_names_the_judges_largest_memory_per_stage_and_its_problem():
    def row(problem, **marks):
        return {"problem": problem, "kind": "reference", "status": "correct", "total_s": 1.0, "build_cached": False,
                "stages": {}, "judge_memory_mib": marks}

    rows = [row("level1/19_ReLU", correctness=[0, 22000, 22300], timing=[0, 45000, 44900]),
            row("level1/23_Softmax", correctness=[0, 30000, 29000], timing=[0, 9000, 8000]), row("cpu_problem")]
    report = summarize({"rows": rows, "wall_s": 4.0, "devices": ["cuda:0"], "problems": 3, "size": "gpu",
                        "gpu_busy": None})
    assert report["judge_memory_peak_mib"] == {"correctness": [29000, "level1/23_Softmax"],
                                               "timing": [44900, "level1/19_ReLU"]}
    assert "timing 44900 (level1/19_ReLU)" in format_batch(report)


def test_the_report_counts_paused_jobs_how_their_gpu_work_was_read_and_the_kills():
    """neighbours.py: the jobs stopped for another worker's measurement, whether NVML read their queued GPU work ("on",
    or why not) and how many that reading killed, so that a batch says whether it ran with the reading and whether it
    killed an honest candidate."""
    def row(paused: float, check: str = "", killed: bool = False):
        return {"kind": "reference", "status": "runtime_error" if killed else "correct", "total_s": 1.0,
                "build_cached": False, "stages": {"paused_for_neighbours": paused}, "neighbour_gpu_check": check,
                "gpu_killed": killed}

    rows = [row(0.0), row(0.4, "on"), row(1.2, "on", killed=True), row(0.3, "not a GPU")]
    report = summarize({"rows": rows, "wall_s": 4.0, "devices": ["cuda:0"], "problems": 1, "size": "gpu",
                        "gpu_busy": None})
    assert report["pauses"] == {"paused": 3, "gpu_check": {"on": 2, "not a GPU": 1}, "gpu_killed": 1}
    assert "measurement: 3 jobs; their queued GPU work read: on 2, not a GPU 1; killed for it: 1" in format_batch(report)


def test_the_report_counts_float64_opinions_their_host_share_and_the_forwards_after_the_load():
    """A wrong candidate's float64 second opinion is held time (23_Softmax's took 15 s on an H100): the batch says how
    many jobs asked for one, how many computed it on the host, and what the judge spent in them; and how many loads
    ran the forward after the load (load_forward.py), so a variant's table says whether it was on."""
    def row(float64: dict, judge: float, forward: dict | None = None):
        return {"kind": "wrong", "status": "incorrect", "total_s": 1.0, "build_cached": False, "stages": {},
                "float64": float64, "correctness_seconds": {"judge": judge}, "load_forward": forward}

    rows = [row({}, 0.1, {"ran": True, "why": "", "seconds": 0.5}),
            row({"judged_against_float64": 1}, 2.0, {"ran": False, "why": "over 512 MB", "seconds": None}),
            row({"judged_against_float64": 1, "float64_sampled": 1, "float64_on": "cpu"}, 15.0)]
    report = summarize({"rows": rows, "wall_s": 4.0, "devices": ["cuda:0"], "problems": 1, "size": "gpu",
                        "gpu_busy": None})
    assert report["float64"] == {"jobs": 2, "on_host": 1, "judge_s": 17.0}
    assert report["load_forward"] == {"ran": 1, "seconds": 0.5}
    assert ("float64 second opinions: 2 jobs (1 on the host), the judge's correctness seconds in them 17.0; "
            "forwards after the load: 1 (0.5 s)") in format_batch(report)
