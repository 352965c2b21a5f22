"""Red team, round 7: timed outputs on degenerate problems, sparse files in the build cache, output descriptions
the judge cannot build, the burst's replies.

Each test asserts the verdict a sound judge gives the attack (and, where it matters, that the next honest
evaluation on the same Evaluator is judged as on a fresh one). An attack that got through when this pass was made
was marked ``xfail(strict=True)`` until the judge was fixed: all five that got through (a memorised answer in timed
calls, sparse files in the build cache, three replies the judge could not decode) are stopped since (session 17).
All run with ``integrity="off"`` (the design must hold when a static check misses).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from device import DEVICE
from test_judge_isolation import CHECK, GELU, HONEST, TIMED, cand, honest_after

from kb_gym import Evaluator, Problem


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


# The runner module and the tensors module, reached as round 4 reached them (no static finding needed here).
RUNNER = '''
_mods = vars(torch)["sys"].modules
_runner = [m for m in list(_mods.values()) if "Runner" in vars(m) and "timed_call" in vars(m)][0]
'''


# --- 1. a memorised answer in timed calls, on a problem whose answers barely move between inputs -------------
#
# The correctness trials hold an output to a relative L2 error of 0.3x the distance between two trials' answers
# where another input's answer passes the tolerance (checks.compare_outputs with ``other_answers``: "an output
# that ignores its inputs cannot sit within 0.3x the distance between two answers of both"). The timed calls are
# checked by timed_checks.timed_output_check with compare_outputs(cand, ref, atol, rtol) alone: no trivial outputs, no other
# answers, so only the elementwise tolerance and the 1 x rtol relative L2 bound. On a problem whose answer moves
# between inputs by more than the trials' "coincide" floor (1e-5, else unverifiable_output) but less than the
# tolerance, the answer of one input passes every timed call of other inputs. The candidate computes honestly
# until it sees the determinism rerun (the same inputs twice in a row: the trials are over, whatever their
# count), then returns the answer it kept, without touching its inputs. The problem below: the column means of
# 1 + 0.0015 * randn(4096, 64); answers move by ~3.3e-5 (relative L2), 6 sigma inside the 2e-4 elementwise
# tolerance. Measured: ``correct``, 4.9-6.0x (a true 1x), flags degenerate_problem (a note) and no_custom_kernel
# (plain PyTorch: a one-line Triton kernel beside it would take that flag away too).
# Fix: check timed outputs with the same guard as the trials, e.g. pass the previous pair's reference output
# (and the trials' answers) as ``other_answers`` in timed_output_check, or keep the relative bound the trials
# derived for the problem (0.3x the answer distance) and hold every timed output to it.
# Stopped since (session 17): on a problem the trials found degenerate, a timed output is compared with the last
# timed call's answer as the other answer (its float64 second opinion too): incorrect, timing_mismatch.

MEAN_NEAR_ONE = Problem(id=7, name="7_MeanNearOne", level=1, code='''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x.mean(dim=0)

def get_inputs():
    return [1.0 + 0.0015 * torch.randn(4096, 64)]

def get_init_inputs():
    return []
''')

HONEST_MEAN = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x.mean(dim=0)
'''

MEMORISED_AFTER_THE_RERUN = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        if getattr(self, "stale", False):
            return self.kept
        if getattr(self, "last", None) is not None and torch.equal(x, self.last):
            self.stale = True  # the determinism rerun: the correctness trials are over
        self.last, self.kept = x.clone(), x.mean(dim=0)
        return self.kept
'''


def test_the_near_constant_problem_is_judged_sanely_for_an_honest_kernel(ev):
    """The control for the next test: the problem is sound, an honest kernel is correct at ~1x, the problem is
    noted degenerate (another input's answer passes the tolerance) but not unverifiable."""
    r = ev.evaluate(MEAN_NEAR_ONE, HONEST_MEAN, config=TIMED)
    assert r.status == "correct", (r.status, r.error)
    assert "degenerate_problem" in r.flags and "unverifiable_output" not in r.flags, r.flags
    assert r.speedup is not None and r.speedup < 2.5, r.speedup


# Spot-checked timed outputs (over timed_output_sample_bytes: 64 MB, most GPU-size outputs; 128 bytes stands in)
# get the same guard on the chunks drawn after the call (session 25: they crossed whole until then).
@pytest.mark.parametrize("sample_bytes", [0, 128], ids=["whole", "chunks"])
def test_a_memorised_answer_in_timed_calls_is_caught_on_a_degenerate_problem(ev, sample_bytes):
    r = ev.evaluate(MEAN_NEAR_ONE, MEMORISED_AFTER_THE_RERUN, config=TIMED.replace(timed_output_sample_bytes=sample_bytes))
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.error, r.speedup, r.flags)
    assert isinstance(r.correctness.get("timed_output_check"), dict) == bool(sample_bytes), r.correctness


# --- 2. sparse files in the build folder, written out whole by the judge's copy -----------------------------
#
# After a load that built nothing from the cache, the judge copies the runner's build folder ($TORCH_EXTENSIONS_DIR,
# beneath the scratch folder) into the host's build cache (build_cache.keep -> copy_regular_files, with
# shutil.copyfileobj), under the candidate's own source hash. The runner may write no file over 1 GB
# (RLIMIT_FSIZE) and the watchdog holds the tree's disk use to disk_limit_mb, but both count allocated blocks
# (scratch_disk._walk: st_blocks): a file truncated to 1 GB holds none. The judge's copy reads it as zeros and
# writes every byte: measured, two such files (0 bytes allocated in the runner) became 2.1 GB in the cache entry
# in 2 s of the load stage, with disk_limit_mb=500. Nothing bounds how many (the watchdog stops a folder at 100,000
# entries): 1,000 of them would be 1 TB of the host's disk written by the judge (the build cache, the results
# store and every later evaluation share it), and the cache entry outlives the runner, the judge and the Evaluator.
# The source need not build anything: keep() runs for any candidate whose build folder is not empty.
# Fix: in copy_regular_files, skip (or refuse to keep) files whose size exceeds their allocated blocks (or copy
# holes as holes: os.lseek SEEK_DATA/SEEK_HOLE, copy_file_range), and bound a kept entry's total bytes by the
# disk limit, dropping the entry beyond it.
# Stopped since (session 17): sparse files are never copied, an entry holds at most 1 GB, and the whole cache is
# held under KB_GYM_EXTENSIONS_MAX_GB by evicting the least recently used entries.

SPARSE_BUILD = cand('''
import os
_ext = os.environ["TORCH_EXTENSIONS_DIR"]
os.makedirs(_ext, exist_ok=True)
with open(os.path.join(_ext, "kernel.so"), "wb") as _fh:
    _fh.truncate((1 << 30) - (1 << 12))  # 1 GB that holds no block: under the file limit and the disk watchdog
''')


def _allocated(folder: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def test_sparse_files_in_the_build_folder_are_not_written_out_whole(monkeypatch, tmp_path):
    cache = tmp_path / "extensions"
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(cache))
    source = SPARSE_BUILD + f"\n# round 7 {uuid.uuid4().hex}\n"
    try:
        with Evaluator(DEVICE, results_path=False, baseline_cache=False) as fresh:
            r = fresh.evaluate(GELU, source, config=CHECK.replace(disk_limit_mb=500))
            kept = _allocated(cache) if cache.exists() else 0
            honest_after(fresh)
    finally:
        shutil.rmtree(cache, ignore_errors=True)  # a gigabyte today: not left to pytest's retention of tmp_path
    # the runner held a few kB of real blocks: a sound copy keeps about as much, never a gigabyte
    assert kept < 64 << 20, (kept, r.status, r.error)


# --- 3. an output description the judge cannot build a tensor for -------------------------------------------
#
# tensors.expected_nbytes checks each described output's dtype, its shape (integers in [0, 2^40)), and that its
# byte count matches; shape [0, 2^39, 2^39] passes (no element, 0 bytes). tensors.decode then calls
# torch.empty([0, 2^39, 2^39]), which raises RuntimeError("Stride calculation overflowed"): not a WireError, so
# RunnerProcess.call lets it through, and job.run_job's last resort reports "the judge failed" (crash) and
# restarts the judge: the candidate's verdict is a crash, not ``incorrect``, and every such candidate costs a judge
# restart (on a GPU host: its CUDA context, warm-up, compiled baselines and calibrations). The same description in
# a burst reply (burst_outputs) reaches the same decode from the timing stage, where judge_timing.timing_stage reports it as
# "the baseline failed while timing". Fix: build the empty tensor from a checked shape (or catch RuntimeError in
# decode as a WireError), e.g. reject shapes whose strides overflow int64 (the product of all dims but one).
# Stopped since (session 17): expected_nbytes refuses shapes whose strides overflow or with over 64 dimensions,
# and decode turns anything torch refuses to build into a WireError: the candidate's incorrect.

OVERFLOWING_SHAPE = [0, 1 << 39, 1 << 39]
STRIDE_OVERFLOW = cand(RUNNER + f'''
_real_describe = _runner.describe


def _describe(flat):
    return [{{**m, "shape": {OVERFLOWING_SHAPE}, "nbytes": 0}} for m in _real_describe(flat)]


_runner.describe = _describe
''', "return torch.empty(0)")


def test_an_output_shape_whose_strides_overflow_is_the_candidates_verdict(ev):
    r = ev.evaluate(GELU, STRIDE_OVERFLOW, config=CHECK)
    restarts = r.worker.get("restarts")
    honest_after(ev)
    assert r.status == "incorrect" and "judge failed" not in (r.error or ""), (r.status, r.error, restarts)


BURST_OVERFLOW = cand(RUNNER + f'''
_META = [{{"dtype": "float32", "shape": {OVERFLOWING_SHAPE}, "device": "cpu", "nbytes": 0}}]


def _burst(self, msg):
    n = len(msg.get("seeds") or [])
    self.send({{"type": "burst_done", "event_ms": [1e-3] * n, "commitments": [0] * n, "structure": "tensor",
               "outputs": _META}})


def _burst_outputs(self, msg):
    self.send({{"type": "burst_outputs", "outputs": _META * len(msg.get("want") or []), "payload_bytes": 0}})


_runner.Runner._burst = _burst
_runner.Runner._send_burst_outputs = _burst_outputs
''')


def test_an_overflowing_shape_in_a_burst_reply_is_the_candidates_verdict(ev):
    r = ev.evaluate(GELU, BURST_OVERFLOW, config=TIMED.replace(burst_check=True))
    honest_after(ev)
    assert r.status == "incorrect" and "baseline" not in (r.error or ""), (r.status, r.error)


# --- 4. a chunk reply whose description is not a list of objects ---------------------------------------------
#
# Timed outputs larger than timed_output_sample_bytes are spot-checked: after "done" the judge asks for chunks and
# RunnerProcess._sampled reads the runner's "chunk_bytes" reply. It checks that ``outputs`` is a list, then calls
# ``d.get("nbytes")`` on each item: an item that is a number raises AttributeError in the judge, outside the
# WireError handling, and judge_timing.timing_stage turns it into "the baseline failed while timing: ... AttributeError"
# (runtime_error): the reference is blamed for the candidate's reply. No judge restart on the CPU (restart follows
# sticky_cuda_error). Fix: check that every described item is a dict (WireError otherwise), as expected_nbytes does.
# Stopped since (session 17): it is.

CHUNKS_NOT_OBJECTS = cand(RUNNER + '''
def _chunks(self, msg):
    self.send({"type": "chunk_bytes", "outputs": [1], "payload_bytes": 0})


_runner.Runner._send_chunks = _chunks
''')


def test_a_malformed_chunk_reply_is_the_candidates_verdict(ev):
    r = ev.evaluate(GELU, CHUNKS_NOT_OBJECTS, config=TIMED.replace(timed_output_sample_bytes=1 << 12))
    honest_after(ev)
    assert r.status == "incorrect" and "baseline" not in (r.error or ""), (r.status, r.error)


# --- 5. controls that hold: a burst reply that commits to nothing, a chunk reply of the wrong sizes ------------
#
# The burst's drawn outputs are checked against the commitments "burst_done" carried (keyed by a fresh nonce), and
# chunk replies against the sizes asked for: forged zeros are the candidate's ``incorrect`` with tampering (or a
# wire error), and the next candidate is judged as on a fresh Evaluator.

BURST_OF_ZEROS = cand(RUNNER + '''
def _burst(self, msg):
    n = len(msg.get("seeds") or [])
    self.burst_held = [[torch.zeros(64, 256, device=self.device)] for _ in range(n)]
    self.send({"type": "burst_done", "event_ms": [1e-3] * n, "commitments": [0] * n, "structure": "tensor",
               "outputs": [{"dtype": "float32", "shape": [64, 256], "device": self.device.type, "nbytes": 65536}]})


_runner.Runner._burst = _burst
''')

CHUNKS_OF_THE_WRONG_SIZE = cand(RUNNER + '''
def _chunks(self, msg):
    self.send_tensors({"type": "chunk_bytes", "outputs": [{"dtype": "uint8", "shape": [1], "device": self.device.type,
                                                            "nbytes": 1}]},
                      [torch.zeros(1, dtype=torch.uint8, device=self.device)])


_runner.Runner._send_chunks = _chunks
''')


@pytest.mark.parametrize("source, config", [
    pytest.param(BURST_OF_ZEROS, TIMED.replace(burst_check=True), id="burst_commits_to_nothing"),
    pytest.param(CHUNKS_OF_THE_WRONG_SIZE, TIMED.replace(timed_output_sample_bytes=1 << 12), id="chunks_wrong_size"),
])
def test_forged_burst_and_chunk_replies_are_incorrect(ev, source, config):
    r = ev.evaluate(GELU, source, config=config)
    honest_after(ev)
    assert r.status == "incorrect" and r.speedup is None, (r.status, r.error, r.flags)


def test_the_honest_gelu_is_unchanged_after_the_module(ev):
    """The module's Evaluator judges an honest candidate as a fresh one would, timed too."""
    r = ev.evaluate(GELU, HONEST, config=TIMED)
    assert r.status == "correct" and set(r.flags) <= {"no_custom_kernel"}, (r.status, r.flags)
