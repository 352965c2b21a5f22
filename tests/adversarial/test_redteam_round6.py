"""Red team, round 6: the held-stopped check, host resources nothing bounds, the runners' mount point.

Each test asserts the verdict a sound judge gives the attack (and, where it matters, that the next honest
evaluation on the same Evaluator is judged as on a fresh one). The attack below got through when this pass was
made (session 13, 1 of 2 tries: a race) and is stopped since.
"""

from __future__ import annotations

import pytest
from device import DEVICE
from test_judge_isolation import CHECK, GELU, TIMED, cand, honest_after, next_after_poison
from test_redteam_round4 import FIND_RUNNER
from test_redteam_round5 import UNFREEZABLE, _fresh_gelu

from kb_gym import Evaluator


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


# --- 1. CPU time that vanishes from the reading: a banked process that exits, reaped by nobody -------------
#
# sandbox.tree_usage sums the schedstat of the tree's LIVE threads and the ticks of its LIVE processes
# (utime + stime + cutime + cstime). A process that exits during the hold takes all its CPU time with it: its
# schedstat and stat are gone, and its parent's cutime grows only when the parent wait()s for it. A parent that
# ignores SIGCHLD never does: the kernel reaps the child at once and its time is added to nobody. And
# ran_between flags only pids that are NEW at the end, not ones that are gone. So: at import, two "bank"
# children each burn ~2 s of CPU (seconds of the load stage, which nobody bounds but its timeout), the runner
# sets SIGCHLD to SIG_IGN, and the round-5 burners (a SIGCONT timer each) burn while the spare calibrates.
# 40 ms into the hold the banks exit: the tree's CPU reading falls by 4 s, the burners' 2 cores x hold add
# less than that, the delta is negative, nothing is flagged, and the poisoned calibration is used and kept.
# The burners then disarm their timers and sleep (later holds, around baseline calls, see nothing). Measured: the
# spare calibrated 22 ms of overhead and an 11.3 ms tolerance (honest 4.2 / 2), no flag; the banks kept: caught.
# Also seen: the build cache's hold after the load (frozen(refuse=False, asleep_is_stopped=False)) never sees the
# timer's tree still, so it waits its 2 s and checks nothing: harmless (nothing copied) but 2 s of judge a try.
# Stopped since: ran_between counts a process that was alive in the tree when the hold began and is gone at its
# end as the tree having run (a stopped process cannot exit), and SysV message queues and semaphore sets, kernel
# memory no RSS shows, are capped in the runner's IPC namespace beside shared memory (process.limit_sysv_ipc).

BANKED = UNFREEZABLE + '''

def _await_hold(nth=2):
    """The nth time the runner is held stopped: the first is the build cache's copy after the load (which the
    timer dodges: the judge never sees the tree still and copies nothing), the second the spare's calibration.
    A hold under way at the first look counts (a bank that signalled "done" can be scheduled again only once the
    copy's 2 s hold began: on a loaded machine, skipping it made the calibration the first, and the attack missed)."""
    for k in range(nth):
        if k:
            while _runner_stopped():
                time.sleep(0.001)
        while not _runner_stopped():
            time.sleep(0.001)


def _bank(seconds, done_fd):
    _unfreezable()
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    os.write(done_fd, b"x")
    _await_hold()
    time.sleep(0.04)  # the judge's first reading is taken by now
    if not EXIT_BANKS:  # the control: the same tree, its banks kept
        signal.signal(signal.SIGCONT, signal.SIG_DFL)
        while True:
            time.sleep(3600)
    os._exit(0)  # with SIGCHLD ignored above: reaped at once, its CPU time added to nobody


def _burner():
    _unfreezable()
    _await_hold()
    time.sleep(0.03)  # asleep while the judge checks that the tree stopped
    while _runner_stopped():
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
    _stop = _ITimerspec(_Timespec(0, 0), _Timespec(0, 0))
    _libc.timer_settime(ctypes.c_void_p(0), 0, ctypes.byref(_stop), None)
    signal.signal(signal.SIGCONT, signal.SIG_DFL)
    while True:
        time.sleep(3600)


if os.getpid() == 1:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped by the kernel: no cutime
    _r, _w = os.pipe()
    for _ in range(2):
        if os.fork() == 0:
            try:
                _bank(3.0, _w)
            finally:
                os._exit(0)
    for _ in range(10):
        if os.fork() == 0:
            os.setsid()  # a scheduler group of its own, as round 5's burners
            try:
                _burner()
            finally:
                os._exit(0)
    for _ in range(2):
        os.read(_r, 1)
'''

BANKED_ONLY = cand(FIND_RUNNER + "EXIT_BANKS = True\n" + BANKED)


def _unpoisoned(r) -> bool:
    """A try the race missed: nothing ran during the hold, so the calibration that judged it is an honest one
    (poisoned: 22 ms of overhead and 11 of tolerance; honest: up to 12.3 and 4.5 on a loaded 2-core CI machine)."""
    envelope = r.correctness.get("envelope") or {}
    return r.status == "correct" and envelope.get("tolerance_ms", 99) < 6.0 and envelope.get("overhead_ms", 99) < 15.0


def test_a_tree_that_ran_while_held_is_caught_even_when_some_of_it_exits(ev):
    # the attack races the judge's holds (it waits for the second one); on a loaded 2-core machine it misses at
    # times (CI once: correct, 6.8 ms of overhead, 4.4 of tolerance: an honest calibration). Every try must be
    # judged soundly, and the attack must fire, and be caught, in one of three
    results = []
    for k in range(3):
        r = ev.evaluate(_fresh_gelu(f"banked{k}", 512), BANKED_ONLY, config=TIMED)
        honest_after(ev, TIMED)
        caught = r.status == "runtime_error" and "ran while the judge held" in (r.error or "")
        assert caught or _unpoisoned(r), (k, r.status, r.error, r.correctness.get("envelope"))
        results.append((r.status, r.error, r.correctness.get("envelope")))
        if caught:
            return
    pytest.fail(f"the attack never fired in 3 tries, so nothing was tested: {results}")


def test_a_calibration_poisoned_under_banked_cpu_does_not_judge_the_next(ev):
    # poisoned: 22 ms of overhead and 11 of tolerance, against an honest 4.2 and 2 on a quiet machine (and up to
    # 14 of tolerance on a loaded 2-core one, as CI's: next_after_poison checks which calibration judged it)
    problem = _fresh_gelu("banked_next", 512)
    first = ev.evaluate(problem, BANKED_ONLY, config=TIMED)
    if first.status == "correct":
        # the race missed (see above): nothing was poisoned, and the calibration that judged it must show it
        assert _unpoisoned(first), first.correctness.get("envelope")
    else:
        assert first.status == "runtime_error", (first.status, first.error)
    next_after_poison(ev, problem, first, TIMED)


# --- 2. a tree that never stands still during the build cache's hold: 2 s of the judge a try ---------------------
#
# After a load that built something, the judge holds the runner's tree stopped to copy its build folder into the
# cache; the hold is lenient (a GPU driver's thread in uninterruptible sleep is no verdict), so a tree that never
# stood still made the judge wait out the hold's 2 s settle time and then copy nothing: 2 s of the judge per try,
# for any source that names the extension builder and starts a child with a SIGCONT timer. Now the build is kept
# once the runner's whole tree is gone instead (nothing of the candidate can change the folder then), before its
# scratch folder is removed. The 2 s wait stays (job.KEEP_SETTLE_SECONDS: 0.25 s let round 2's calibration poison
# through in 2 of 3 local runs, cause not found).

UNSTILL_BUILDER = cand(UNFREEZABLE + '''
import os, time
from torch.utils.cpp_extension import load_inline  # named: the source may build, so its build folder is kept
_ext = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "unstill_ext")
if os.path.isdir(_ext):
    raise RuntimeError("restored: " + open(os.path.join(_ext, "built.so")).read())
os.makedirs(_ext)
with open(os.path.join(_ext, "built.so"), "w") as _fh:  # a library: what a build folder is kept for
    _fh.write("built in the first runner")
if os.getpid() == 1 and os.fork() == 0:
    try:
        _unfreezable()
        while True:
            time.sleep(0.001)
    finally:
        os._exit(0)
''')


def test_a_build_whose_tree_never_stands_still_is_kept_when_the_runner_is_gone(monkeypatch, tmp_path):
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as fresh:
        first = fresh.evaluate(GELU, UNSTILL_BUILDER, config=CHECK)
        second = fresh.evaluate(GELU, UNSTILL_BUILDER, config=CHECK)
        honest_after(fresh)
    # "at_exit" where the hold never saw the tree still; with the 2 s wait it often does ("at_load")
    assert first.status == "correct" and first.worker["build_kept"] in ("at_load", "at_exit"), (
        first.status, first.error, first.worker.get("build_kept"))
    assert second.worker["build_cached"] and second.status == "compile_error", (second.status, second.worker)
    assert "restored: built in the first runner" in second.error
