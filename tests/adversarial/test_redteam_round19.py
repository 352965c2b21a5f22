"""Red team, round 19: the parts changed in sessions 26-27: memfds mapped before any candidate runs (the runner's
premap at start-up and as a job prepares it, the judge's mapping in a background thread), calibrations shared between
the judges of one device, the zygote's handling of the descriptors it passes, and what else of a runner's replies the
judge keeps.

Each test asserts what a sound judge does. The three holes below were reproduced 3 of 3 times (three runs of this
file, session 28, a helper's pass) and fixed in the same session (each "Fixed:" line says how). ``integrity="off"``
throughout (the runtime must hold where a static check misses). Numbers are from this 2-core CPU.

Got through (3 of 3 each), fixed:

1. The dataflow report's counts are kept whole (``runner_replies.dataflow_report``): every string key with an integer
   value of the traced call's "dataflow" is copied into ``result.correctness["dataflow"]`` (``pytorch_alone``
   spreads it into its report), however many keys and however long, so the candidate decides the size of its own
   result (round 9's backends bloat, through another field). The candidate rebinds the protocol's ``encode`` (as
   round 9) and adds 50,000 keys of 120 characters to each "done" that carries a report: ``correct``, and a
   6.6 MB ``correctness`` in the result and the results store (a 6.6 MB line for one evaluation).
2. The same keys in 4-byte UTF-8 characters: the runner writes them raw (its message, 7.1 MB, is under the 8 MB a
   message may take), the judge re-encodes its result with ``ensure_ascii`` (12 bytes a character), so the judge's
   result grows to ~21 MB, past the protocol's 8 MB: the evaluator reads "worker wrote an oversized message", the
   evaluation is a ``crash`` in the knockout stage and the judge is restarted (``worker["restarts"]`` 0 -> 1 for the
   next candidate). The same report can also carry ``"verdict": 0`` (an integer), which overrides the judge's own
   "pytorch" in ``{"verdict": ..., **report}``; that gains nothing a forged ``untainted`` list does not already
   (the report is the runner's: defence in depth), so it has no test here.
   Fixed: ``runner_replies.dataflow_report`` keeps the counts the trace makes (``dataflow.REPORT_COUNTS``), each a
   count, and at most ``tensors.MAX_OUTPUTS`` outputs; ``correctness.pytorch_alone`` puts the judge's ``verdict``
   and ``why`` after the report; and a judge's result over 1 MB (``job.RESULT_BYTES``) loses its largest parts and
   becomes a ``crash`` that says so instead of a message the evaluator refuses (``job._bounded``).
3. The zygote takes at most four descriptors from a spawn request (``socket.recv_fds(sock, 1 << 16, 4)``, and
   ``len(fds) not in (3, 4)``), but a judge with both a payload memfd and a device buffer
   (``KB_GYM_DEVICE_PAYLOAD=1``, session 27) passes five: stdin, stdout, stderr, the memfd and the buffer's handle.
   The kernel drops the fifth (MSG_CTRUNC, unchecked) and the runner is told its handle is fd 4, which the child's
   ``closerange`` emptied: on this CPU (the device buffer faked in the judge) fd 4 in the runner was another file
   (size 0, another inode) by the time the candidate ran. On a GPU ``device_payload.from_env`` would import
   whatever fd 4 is after CUDA's start (likely one of the driver's own descriptors), fail, and ``os.close`` it in
   ``attach``'s ``finally``: the device buffer never works in a forked runner, and the runner may lose a CUDA
   descriptor. Fixed: the zygote takes up to five (``zygote.MAX_FDS``), the request says how many it sends
   (``runner_pool.Zygote.spawn``), and one whose count differs, or whose ``recvmsg`` flags say truncated, is refused
   instead of forked with what arrived.

Held (normal tests):

4. A candidate whose outputs are premapped (a 64 MB output whose size the evaluator had learnt, so the runner mapped
   its memfd as the job prepared it and the judge maps it in its background thread), at import: punching holes
   through the whole memfd from a thread for 2 s, racing the judge's background mapping; growing it as far as its
   1 GB file limit allows (1 TB: EFBIG) and sealing it against growth and writes (the write seal fails, EBUSY, under
   the mappings); a forked child that keeps its own mapping and rewrites the first page for 30 s (its writes after
   the commitment are ``tampering``, else ``correct``). The first two are ``correct``; none costs a judge restart (no
   SIGBUS: the judge's mapping is of bytes the sealed file holds), and the next honest candidate again has its memfd
   premapped (``payload_premap_s`` > 0) and crosses it. 20-24 s each here.

Not a test: calibrations shared between a device's judges (``calibration_board.py``, the judge's adoption)
carry only what judges measured in pristine spares, keyed by the problem's hash, precision, tf32, chunk size and
widening; nothing of a runner's replies reaches that list, and a timestamp from the future is refused. What a
candidate can do to a calibration is round 9's: burn the CPU from the other worker while a spare calibrates. Shared,
such a calibration now judges the device's other judges too for its 60 s (the newest wins, so it also replaces their
clean ones); that is round 9's open hole (held by the burst check, off by default), wider, and not re-measured here.

The file takes ~2.5 min on 2 cores.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from device import DEVICE

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.problems import reference_as_candidate
from kb_gym.worker import device_payload, payload, runner_pool
from kb_gym.worker.loading import StageError
from kb_gym.worker.runner_client import RunnerProcess

CHECK = EvalConfig(trials=2, timing=False, integrity="off", load_timeout=60, correctness_timeout=60)


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


ADD_ONE = Problem(id=9191, name="9191_AddOneSmall", level=1, code='''import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x + 1.0

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
''')

KERNEL = '''import torch
import torch.nn as nn
import triton
import triton.language as tl
import sys

@triton.jit
def _add1(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m) + 1.0, mask=m)
'''
MODEL = '''
class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _add1[(triton.cdiv(x.numel(), 1024),)](x.reshape(-1), out.reshape(-1), x.numel(), BLOCK=1024)
        return out
'''
HONEST_KERNEL = KERNEL + MODEL


def _bloated_report(char: str, keys: int, length: int) -> str:
    """The honest Triton candidate, its every "done" with a dataflow report carrying ``keys`` extra counts whose names
    are ``length`` x ``char``, written raw (UTF-8, not escaped)."""
    return KERNEL + f'''
import json as _json
_proto = sys.modules["kb_gym.worker.protocol"]
_KEYS = {{{char!r} * {length} + str(i): 1 for i in range({keys})}}
def _bloated(message):
    if message.get("type") == "done" and isinstance(message.get("dataflow"), dict):
        message = {{**message, "dataflow": {{**message["dataflow"], **_KEYS}}}}
    return (_json.dumps(message, ensure_ascii=False) + "\\n").encode()
_proto.encode = _bloated
''' + MODEL


# --- 1-2. the dataflow report's counts, kept whole --------------------------------------------------------------------

def test_a_dataflow_report_cannot_bloat_the_result_or_the_store(tmp_path):
    store = tmp_path / "results.jsonl"
    with Evaluator(DEVICE, results_path=store, baseline_cache=False) as e:
        r = e.evaluate(ADD_ONE, _bloated_report("a", 50_000, 120), config=CHECK)
        assert r.status == "correct", (r.status, r.error)
        assert "dataflow" in r.correctness, r.correctness  # the attack met the traced call
        assert len(json.dumps(r.correctness)) < 100_000, len(json.dumps(r.correctness))
        assert store.stat().st_size < 1_000_000, store.stat().st_size


def test_a_dataflow_report_cannot_make_the_judges_result_oversized(ev):
    r = ev.evaluate(ADD_ONE, _bloated_report("\U0001F600", 55_000, 30), config=CHECK)
    after = ev.evaluate(ADD_ONE, HONEST_KERNEL, config=CHECK)
    assert after.status == "correct", (after.status, after.error)
    assert r.status == "correct" and after.worker["restarts"] == 0, (r.status, r.error, after.worker["restarts"])


# --- 3. the zygote and the descriptors it passes ---------------------------------------------------------------------

class _FakeDeviceBuffer:
    """The judge's device buffer on a CPU: only what RunnerProcess reads of it."""

    size = payload.PREMAP_MIN_BYTES

    def close(self) -> None:
        pass


# the candidate's module, at import: what its fd 4 is (the number the judge names for the device buffer's handle where
# the payload memfd is fd 3), as the load's error
WHAT_IS_FD_4 = '''import os
try:
    st = os.fstat(4)
    got = f"{st.st_ino}:{st.st_size}"
except OSError as exc:
    got = f"none:{exc.errno}"
raise RuntimeError("FD4=" + got)
'''


def test_the_zygote_hands_a_runner_every_descriptor_its_judge_passed(monkeypatch):
    handle = os.memfd_create("r19_device_handle", 0)
    os.write(handle, b"r19 handle")
    expected = f"{os.fstat(handle).st_ino}:{os.fstat(handle).st_size}"
    monkeypatch.setattr(device_payload, "wanted", lambda device, nbytes: nbytes > 0)
    monkeypatch.setattr(device_payload.DeviceBuffer, "create",
                        classmethod(lambda cls, dev, nbytes: (_FakeDeviceBuffer(), os.dup(handle))))
    root = Path(tempfile.mkdtemp(prefix="r19_zygote_"))
    zygote = runner_pool.Zygote("cpu", root)
    runner = None
    try:
        runner = RunnerProcess("cpu", root, zygote, payload_bytes=payload.PREMAP_MIN_BYTES)
        assert runner.payload is not None  # the memfd is fd 3, so the handle is named fd 4 (runner_client)
        runner.wait_ready(120)
        problem = ADD_ONE.code
        runner.prepare(problem, 0, "fp32", False, timeout=60)
        with pytest.raises(StageError) as raised:
            runner.load(WHAT_IS_FD_4, 0, timeout=60)
        said = [line for line in raised.value.message.splitlines() if "FD4=" in line]
        assert said and said[-1].split("FD4=")[-1].strip() == expected, (said, expected)
    finally:
        if runner is not None:
            runner.kill()
        zygote.close()
        os.close(handle)


# --- 4. a premapped memfd, attacked --------------------------------------------------------------------------------

# 4096 x 4096 float32: 64 MiB of outputs, the least the runner and the judge map before any candidate
# (payload.PREMAP_MIN_BYTES)
PREMAPPED = Problem(id=9192, name="9192_AddOnePremapped", level=1, code='''import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x + 1
def get_inputs():
    return [torch.randn(4096, 4096)]
def get_init_inputs():
    return []
''')
assert payload.premap_size(4096 * 4096 * 4) > 0

# the payload memfd, found by name (a forked runner has it at 3, a fresh interpreter at the judge's number)
_FIND_MEMFD = '''
import ctypes, fcntl, mmap, os, threading, time
def _memfds():
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if "kb_gym_payload" in os.readlink(f"/proc/self/fd/{name}"):
                found.append(int(name))
        except OSError:
            pass
    return found
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
'''

PREMAP_ATTACKS = {
    # holes punched through every page, over and over for 2 s from import on: the judge's background mapping (started
    # once the runner said "prepared") faults its pages in meanwhile
    "punch_holes_while_the_judge_maps": _FIND_MEMFD + '''
def _punch():
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        for fd in _memfds():
            _libc.fallocate(fd, 0x02 | 0x01, 0, os.fstat(fd).st_size)  # PUNCH_HOLE | KEEP_SIZE
_t = threading.Thread(target=_punch)
_t.start()
_t.join()
''',
    # grown as far as the runner's file-size limit lets it (1 TB refused: EFBIG at 1 GB), then sealed against growth,
    # shrinking and writes (the writes seal fails: both sides map it)
    "grow_and_seal": _FIND_MEMFD + '''
for fd in _memfds():
    try:
        os.ftruncate(fd, 1 << 40)
    except OSError:
        os.ftruncate(fd, (1 << 30) - (1 << 20))
    for seal in (fcntl.F_SEAL_GROW, fcntl.F_SEAL_WRITE, fcntl.F_SEAL_SEAL):
        try:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seal)
        except OSError:
            pass
''',
    # a child that keeps its own populated mapping of the memfd and rewrites its first page while the runner runs
    "a_child_keeps_it_mapped": _FIND_MEMFD + '''
if os.fork() == 0:
    fd = _memfds()[0]
    m = mmap.mmap(fd, 1 << 20)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        m[:4096] = b"r19!" * 1024
        time.sleep(0.01)
    os._exit(0)
''',
}


@pytest.mark.parametrize("name", sorted(PREMAP_ATTACKS))
def test_what_a_candidate_does_to_its_premapped_memfd_costs_no_judge_and_no_next_candidate(ev, name):
    honest = reference_as_candidate(PREMAPPED)
    first = ev.evaluate(PREMAPPED, honest, config=CHECK)  # the evaluator learns the output bytes (payload_hint)
    assert first.status == "correct", (first.status, first.error)
    attack = honest.replace("import torch\n", "import torch\n" + PREMAP_ATTACKS[name], 1)
    r = ev.evaluate(PREMAPPED, attack, config=CHECK)
    assert r.worker["payload_premap_s"] > 0, r.worker  # the attack met a premapped memfd
    if name == "a_child_keeps_it_mapped":  # its child's writes land on the outputs' first page after the commitment
        assert r.status in ("correct", "incorrect"), (r.status, r.error)
        assert r.status == "correct" or "tampering" in r.flags, (r.status, r.error, r.flags)
    else:
        assert r.status == "correct", (r.status, r.error)
    after = ev.evaluate(PREMAPPED, honest, config=CHECK)
    assert after.status == "correct" and after.worker["shm_payloads"] >= 1, (after.status, after.error)
    assert after.worker["payload_premap_s"] > 0 and after.worker["restarts"] == first.worker["restarts"], after.worker


def test_a_judges_result_too_large_to_send_is_a_crash_that_says_so_not_a_restart():
    """The backstop behind the report's bound: whatever part of a result grew past what a message may take (a runner's
    report the judge failed to bound), the judge sends a verdict, not a message the evaluator refuses."""
    from kb_gym.worker import job
    from kb_gym.worker.protocol import MAX_MESSAGE_BYTES, encode

    result = {"status": "correct", "correct": True, "flags": ["fallback"], "stage_seconds": {"load": 0.1},
              "correctness": {"dataflow": {f"k{i}": "\U0001F600" * 30 for i in range(25_000)}}, "speedup": 3.0}
    assert len(encode(result)) > MAX_MESSAGE_BYTES  # as round 19's report made it
    job._bounded(result)
    assert len(encode(result)) <= job.RESULT_BYTES
    assert result["status"] == "crash" and "correctness dropped" in result["error"], result["error"]
    assert result["flags"] == ["fallback"] and result["correctness"]["dropped_bytes"] > MAX_MESSAGE_BYTES
    small = {"status": "correct", "flags": [], "correctness": {"trials": 5}}
    job._bounded(small)
    assert small == {"status": "correct", "flags": [], "correctness": {"trials": 5}}
