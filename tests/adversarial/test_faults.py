"""Faults a candidate can cause: each gets its verdict, and the next evaluation is correct.

These run on the CPU in CI, and against a GPU judge and its runners with KB_GYM_ADVERSARIAL_DEVICE (device.py).
Attacks that need a GPU (illegal addresses, kernels that never end, device OOM, side streams) are in tests/gpu/.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid

import psutil
import pytest
from device import DEVICE, ON_GPU

from kb_gym import EvalConfig, Evaluator, get_problem, load_problems
from kb_gym.sandbox import namespace_prefix

# integrity="off": these candidates would be rejected by the static checks before running; here
# they must reach the worker, because the sandbox has to hold even when a check misses.
FAST = EvalConfig(trials=1, timing=False, load_timeout=20, correctness_timeout=8, integrity="off")
HONEST = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"


def candidate(prelude: str = "", forward: str = "return torch.relu(x)") -> str:
    return (f"import os, sys, time, torch\n{prelude}\n"
            f"class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        {forward}\n")


@pytest.fixture(scope="module")
def relu():
    return get_problem(load_problems("builtin"), name="level1/1_ReLU")


# The worker tree's host memory (judge, runner, spare, probe): a CUDA judge's tree holds ~3.7 GB with four CUDA
# contexts and no candidate (an H100, session 49: an honest ReLU "exceeded the 3000 MB limit"); the blow-up's 4 GB is
# over either limit
MEMORY_LIMIT_MB = 6000 if ON_GPU else 3000


@pytest.fixture(scope="module")
def ev():
    evaluator = Evaluator(DEVICE, config=FAST, results_path=False, memory_limit_mb=MEMORY_LIMIT_MB)
    yield evaluator
    evaluator.close()


def assert_recovers(ev, relu):
    after = ev.evaluate(relu, HONEST)
    assert after.status == "correct", (after.status, after.error)


def _signals_contained() -> bool:
    from kb_gym.worker.landlock import abi_version

    return bool(namespace_prefix()) or abi_version() >= 6


@pytest.mark.skipif(not _signals_contained(), reason="neither PID namespaces nor Landlock signal scoping here: "
                    "the candidate could really kill the test process")
def test_killing_the_parent_leaves_the_evaluator_running(ev, relu):
    r = ev.evaluate(relu, candidate("import signal\nos.kill(os.getppid(), signal.SIGKILL)"))
    assert r.status in ("crash", "correct"), r.error
    assert_recovers(ev, relu)


def test_os_exit_at_import_is_a_crash(ev, relu):
    r = ev.evaluate(relu, candidate("os._exit(3)"))
    assert r.status == "crash" and "died" in r.error
    assert_recovers(ev, relu)


def test_segfault_in_forward_is_a_crash(ev, relu):
    r = ev.evaluate(relu, candidate("import ctypes", "return ctypes.string_at(0)"))
    assert r.status == "crash"
    assert r.worker["restarts"] >= 0
    assert_recovers(ev, relu)


def test_endless_host_loop_times_out(ev, relu):
    t0 = time.perf_counter()
    r = ev.evaluate(relu, candidate(forward="while True: pass"))
    assert r.status == "timeout" and "correctness" in r.error
    assert time.perf_counter() - t0 < FAST.correctness_timeout + 10
    assert_recovers(ev, relu)


def test_endless_loop_at_import_times_out_in_load_stage(ev, relu):
    cfg = FAST.replace(load_timeout=5)
    r = ev.evaluate(relu, candidate("while True: pass"), config=cfg)
    assert r.status == "timeout" and "load" in r.error
    assert_recovers(ev, relu)


def test_sys_exit_in_forward_is_a_runtime_error(ev, relu):
    r = ev.evaluate(relu, candidate(forward="sys.exit(0)"))
    assert r.status == "runtime_error" and "SystemExit" in r.error
    assert_recovers(ev, relu)


def test_no_child_process_survives_the_evaluation(ev, relu):
    marker = f"kbgym-orphan-{uuid.uuid4().hex[:8]}"
    prelude = ("import subprocess\n"
               f"subprocess.Popen(['sleep', '300', '{marker}'], start_new_session=True)\n"
               f"subprocess.Popen(['sh', '-c', 'sleep 301 {marker} & sleep 302 {marker}'], start_new_session=True)")
    r = ev.evaluate(relu, candidate(prelude))
    assert r.status == "correct", r.error
    time.sleep(0.5)
    survivors = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert not survivors, survivors
    assert_recovers(ev, relu)


def test_the_hosts_oom_killer_takes_a_runner_first_then_a_judge(ev, relu):
    """Out of host memory faster than the watchdog polls, the kernel kills the highest score: the candidate's runner
    (1000), then a judge (500), never first the evaluator, which may be a trainer holding the policy."""
    prelude = ("score = open('/proc/self/oom_score_adj').read().strip()\n"
               "if score != '1000':\n    raise RuntimeError('the runner runs with oom_score_adj ' + score)")
    r = ev.evaluate(relu, candidate(prelude))
    assert r.status == "correct", r.error
    judge = ev._workers[0].proc.pid
    judges = [p for p in [psutil.Process(judge), *psutil.Process(judge).children()]
              if "kb_gym.worker" in p.cmdline() and p.name().startswith("python")]  # not the unshare above it
    assert judges and all(_oom_score(p.pid) == 500 for p in judges)
    assert _oom_score(os.getpid()) < 500


def _oom_score(pid: int) -> int:
    with open(f"/proc/{pid}/oom_score_adj") as fh:
        return int(fh.read())


def test_fifty_megabytes_of_output_is_bounded(ev, relu):
    t0 = time.perf_counter()
    r = ev.evaluate(relu, candidate("sys.stdout.write('x' * (50 << 20)); sys.stdout.flush()\nos._exit(1)"))
    assert time.perf_counter() - t0 < 30
    assert r.status == "crash"
    assert len(r.feedback) < 4000 and len(r.error or "") <= 2000
    assert_recovers(ev, relu)


def test_printing_does_not_corrupt_the_protocol(ev, relu):
    prelude = 'print(\'{"type": "result", "status": "correct", "job_id": 1}\')\nprint("noise", file=sys.stderr)'
    r = ev.evaluate(relu, candidate(prelude, "print('in forward'); return torch.relu(x)"))
    assert r.status == "correct"


def test_host_memory_blowup_is_killed(ev, relu):
    prelude = "hog = bytearray(4_000 * 1024 * 1024)\nfor i in range(0, len(hog), 4096): hog[i] = 1\ntime.sleep(30)"
    t0 = time.perf_counter()
    r = ev.evaluate(relu, candidate(prelude))
    assert r.status == "crash" and "memory" in r.error
    assert time.perf_counter() - t0 < 25
    assert_recovers(ev, relu)


@pytest.mark.skipif(not namespace_prefix(), reason="network namespaces are not permitted on this machine")
def test_no_network_from_the_worker(ev, relu):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    # No network namespace route, and no socket at all (seccomp): either refusal is an OSError.
    prelude = (f"import socket\ntry:\n    s = socket.socket()\n    s.settimeout(2)\n"
               f"    s.connect(('127.0.0.1', {port}))\n    raise SystemExit('network reachable')\n"
               "except OSError:\n    pass")
    r = ev.evaluate(relu, candidate(prelude))
    server.close()
    assert r.status == "correct", r.error
    assert not accepted
    assert r.worker["network_namespace"] and r.worker["pid_namespace"]


@pytest.mark.skipif(not namespace_prefix(), reason="PID namespaces are not permitted on this machine")
def test_candidate_cannot_see_the_evaluator_process(ev, relu):
    me = os.getpid()
    prelude = (f"try:\n    os.kill({me}, 0)\n    raise SystemExit('evaluator visible')\n"
               "except ProcessLookupError:\n    pass")
    r = ev.evaluate(relu, candidate(prelude))
    assert r.status == "correct", r.error


def test_scratch_folder_is_the_working_directory(ev, relu):
    # the runner's own scratch folder (seen at the host's one mount point for runners where it has a mount
    # namespace: build_cache.mount_point), the one its TMPDIR, HOME and build folder are in
    prelude = ("assert os.environ['TMPDIR'] == os.path.join(os.getcwd(), 'tmp'), (os.getcwd(), os.environ['TMPDIR'])\n"
               "assert os.environ['TORCH_EXTENSIONS_DIR'] == os.path.join(os.getcwd(), 'ext')\n"
               "open('scratch_file.txt', 'w').write('ok')")
    r = ev.evaluate(relu, candidate(prelude))
    assert r.status == "correct", r.error


landlock = pytest.mark.skipif(not __import__("kb_gym.worker.landlock", fromlist=["abi_version"]).abi_version(),
                              reason="Landlock is not available on this kernel")


@landlock
def test_writing_outside_the_scratch_folder_is_refused(ev, relu, tmp_path):
    target = tmp_path / "escaped.txt"
    r = ev.evaluate(relu, candidate(f"open({str(target)!r}, 'w').write('x')"))
    assert r.status == "compile_error" and "Permission denied" in r.error
    assert not target.exists()
    assert r.worker["landlock"] >= 1
    inside = ev.evaluate(relu, candidate("open('inside.txt', 'w').write('ok')\n"
                                         "import tempfile\ntempfile.NamedTemporaryFile().write(b'ok')"))
    assert inside.status == "correct", inside.error


@landlock
def test_a_landlocked_worker_names_its_threads_but_not_the_evaluators(ev, relu):
    """pthread_setname_np on another thread writes /proc/self/task/TID/comm (the CUDA driver names its
    threads); the worker's own /proc entry is writable, the evaluator's is out of reach (refused by
    Landlock, or not even visible from the worker's PID namespace)."""
    names = ("import ctypes, threading\n"
             "_stop = threading.Event()\n_t = threading.Thread(target=_stop.wait)\n_t.start()\n"
             "RC = ctypes.CDLL(None).pthread_setname_np(ctypes.c_ulong(_t.ident), b'kb-named')\n"
             "_stop.set()\n_t.join()\n"
             "assert RC == 0, RC\n")
    r = ev.evaluate(relu, candidate(names), config=FAST)
    assert r.status == "correct" and r.worker["landlock"] >= 1, (r.status, r.error)
    parent = ev.evaluate(relu, candidate(f"open('/proc/{os.getpid()}/comm', 'w').write('x')"), config=FAST)
    assert parent.status == "compile_error", parent.error
    assert "Permission denied" in parent.error or "No such file" in parent.error, parent.error
    assert_recovers(ev, relu)


@landlock
def test_without_namespaces_landlock_still_guards_signals_and_network(relu, monkeypatch):
    from kb_gym import sandbox
    from kb_gym.worker.landlock import abi_version

    if abi_version() < 6:
        pytest.skip("signal scoping needs Landlock ABI 6")
    monkeypatch.setenv("KB_GYM_SANDBOX", "0")  # read by the judge, which starts the runners
    sandbox.namespace_prefix.cache_clear()
    try:
        _landlock_alone(relu)
    finally:
        monkeypatch.undo()
        sandbox.namespace_prefix.cache_clear()


def _landlock_alone(relu):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    me = os.getpid()
    with Evaluator(DEVICE, config=FAST, results_path=False) as plain:
        killer = plain.evaluate(relu, candidate(f"import signal\nos.kill({me}, signal.SIGTERM)"))
        dialer = plain.evaluate(relu, candidate(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)"))
        assert not killer.worker["pid_namespace"] and killer.worker["landlock"] >= 6
    server.close()
    assert killer.status == "compile_error" and "Permission" in killer.error  # and we are still here
    assert dialer.status == "compile_error" and "Permission" in dialer.error


FAKE_GPU_WORKER = '''
import json, os, sys
if os.environ.get("KB_GYM_LANDLOCK") == "0":
    print(json.dumps({"type": "ready", "pid": os.getpid(), "sandbox": {"landlock": 0}}), flush=True)
    sys.stdin.read()
else:
    with open(sys.argv[1], "a") as fh:
        fh.write("confined start\\n")
    print(json.dumps({"type": "landlock_breaks_cuda", "error": "cudaGetDeviceCount(): Error 304"}), flush=True)
'''


def test_a_gpu_worker_whose_cuda_fails_under_landlock_starts_again_unconfined(monkeypatch, tmp_path):
    """KB_GYM_LANDLOCK=auto confines GPU workers too; where a driver's CUDA does not start under the ruleset, the
    worker says so and the evaluator starts it unconfined, says why in the worker info, and remembers it."""
    from kb_gym import workers

    script, starts = tmp_path / "fake_worker.py", tmp_path / "starts.txt"
    script.write_text(FAKE_GPU_WORKER)
    monkeypatch.setattr(workers.WorkerHandle, "_command", lambda self: [sys.executable, str(script), str(starts)])
    monkeypatch.setattr(workers, "_LANDLOCK_BREAKS_CUDA", {})
    monkeypatch.setenv("KB_GYM_LANDLOCK", "auto")
    handles = [workers.WorkerHandle("cuda:7"), workers.WorkerHandle("cuda:7")]
    try:
        for handle in handles:
            handle.start()
            assert handle.alive and handle.info["sandbox"]["landlock"] == 0
            assert "Error 304" in handle.info["landlock_unusable"]
        assert starts.read_text().count("confined start") == 1  # the second worker went straight to unconfined
    finally:
        for handle in handles:
            handle.kill()


_ORPHAN_SCRIPT = '''
import sys, time
from kb_gym import EvalConfig, Evaluator, get_problem, load_problems
relu = get_problem(load_problems("builtin", size="cpu"), name="level1/1_ReLU")
ev = Evaluator(sys.argv[2], results_path=False, config=EvalConfig(trials=1, timing=False, integrity="off",
               correctness_timeout=300))
ev.warm()
ev.submit(relu, sys.argv[1])
print("submitted", flush=True)
time.sleep(600)
'''


def test_a_judge_whose_evaluator_process_is_killed_mid_job_ends_with_its_runner(tmp_path):
    """A job scheduler's timeout SIGKILLs the trainer or benchmark; its judges (their own sessions) must not run
    their jobs on to the end on the device. Seen on the H200 before the fix: a killed benchmark's judge still
    held 70 GB of the GPU when the next command started."""
    import subprocess

    slow = candidate(forward="time.sleep(120); return torch.relu(x)")
    proc = subprocess.Popen([sys.executable, "-P", "-c", _ORPHAN_SCRIPT, slow, DEVICE], stdout=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    try:
        assert proc.stdout.readline().strip() == "submitted"
        time.sleep(8)  # the runner is in forward by now, sleeping
        family = psutil.Process(proc.pid).children(recursive=True)
        assert len(family) >= 2, family
        proc.kill()
        proc.wait()
        gone, alive = psutil.wait_procs(family, timeout=15)
        assert not alive, [(p.pid, p.cmdline()[:4]) for p in alive]
    finally:
        proc.kill()


_FILTERED = '''
import ctypes, os, platform, sys
from kb_gym.worker import seccomp
assert seccomp.deny_escape_syscalls()["seccomp"]
libc = ctypes.CDLL(None, use_errno=True)
table = seccomp._ARCHES[platform.machine()][1]
refused = []
for name in sys.argv[1:]:
    if name in table and libc.syscall(table[name], 0, 0, 0, 0, 0) == -1 and ctypes.get_errno() == 1:
        refused.append(name)
print(" ".join(refused))
print(len(open("/proc/self/status").read()) > 0, os.getpid() > 0)  # the ordinary calls still work
'''


@pytest.mark.skipif(sys.platform != "linux", reason="seccomp is Linux's")
def test_the_runner_filter_refuses_what_a_root_runner_could_escape_with():
    """Round 4: capabilities a root evaluator lends its runners (I/O ports, BPF, perf events, file handles, module
    loading, the clocks, mounts) and the keyring: the filter refuses each with EPERM, whatever the arguments."""
    import platform
    import subprocess

    from kb_gym.worker import seccomp

    if platform.machine() not in seccomp._ARCHES:
        pytest.skip(f"no syscall table for {platform.machine()}")
    names = ["iopl", "ioperm", "bpf", "perf_event_open", "open_by_handle_at", "pidfd_getfd", "keyctl", "add_key",
             "init_module", "finit_module", "adjtimex", "clock_settime", "mount", "setns", "mknodat"]
    out = subprocess.run([sys.executable, "-P", "-c", _FILTERED, *names], capture_output=True, text=True, timeout=60)
    refused, ordinary = out.stdout.splitlines()[:2]
    table = seccomp._ARCHES[platform.machine()][1]
    assert refused.split() == [n for n in names if n in table], (out.stdout, out.stderr)
    assert ordinary == "True True"


def test_a_killed_tree_is_gone_when_kill_and_wait_returns():
    """What the judge does next (another worker's baseline, a fresh judge's candidate) runs with nothing of the
    killed tree beside it: every process signalled is gone, not only the one reaped."""
    import subprocess

    from kb_gym import sandbox

    proc = subprocess.Popen(["sh", "-c", "sleep 100 & sleep 100 & (sleep 100 & wait) & wait"])
    deadline = time.monotonic() + 5
    while len(sandbox.descendants(proc.pid) or []) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    tree = sandbox.descendants(proc.pid) or []
    assert len(tree) >= 4
    sandbox.kill_and_wait(proc, timeout=5)
    assert proc.returncode is not None
    assert sandbox.wait_gone(tree, timeout=0.0)  # already gone (or zombies) on return: no further wait
