"""The candidate never runs where the verdict is made: attacks of our own on the judge/runner split.

Each candidate below got a wrong verdict when candidate code shared a process with the harness
(issue: integrity round 2). Now the judge holds the reference, the seeds, the comparison and the
believed clock, and the candidate runs in a one-use runner. Every test asserts the verdict the
attack must get, and that the next honest evaluation on the same Evaluator is judged as on a fresh
one. ``integrity="off"``: the static checks would refuse most of these before they run; here they
must run, because the design has to hold when a static check misses.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
import uuid

import pytest
from device import DEVICE, ON_GPU

from kb_gym import EvalConfig, EvalResult, Evaluator, Problem
from kb_gym.problems import reference_as_candidate

CHECK = EvalConfig(trials=2, timing=False, integrity="off", load_timeout=60, correctness_timeout=30)
TIMED = EvalConfig(trials=2, timing_min_reps=10, timing_max_reps=20, timing_warmup=1, timing_max_seconds=10,
                   integrity="off", load_timeout=60, correctness_timeout=30, timing_timeout=60)

GELU = Problem(id=1, name="1_GELU", level=1, code='''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x)

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
''')

HONEST = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))
'''


def cand(prelude: str, forward: str = "return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))") -> str:
    body = "\n".join("        " + line for line in forward.splitlines())
    return f"import torch\nimport torch.nn as nn\n{prelude}\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n{body}\n"


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


def honest_after(ev: Evaluator, config: EvalConfig = CHECK) -> None:
    """The next honest evaluation is judged exactly as on a fresh Evaluator: correct, no new flags."""
    r = ev.evaluate(GELU, HONEST, config=config)
    assert r.status == "correct", (r.status, r.error)
    # the envelope and the runner's overhead in the message: a side_stream here is a false alarm to explain
    envelope = r.correctness.get("envelope") or {}
    assert set(r.flags) <= {"no_custom_kernel"}, (r.flags, envelope.get("cpu_clock"), envelope.get("burst"), envelope,
                                                  r.worker.get("overhead_ms"))


def next_after_poison(ev: Evaluator, problem: Problem, first: EvalResult, config: EvalConfig) -> EvalResult:
    """The honest reference evaluated right after ``first``, a candidate that poisoned the spare's calibration of
    ``problem``: it is correct, and it is not judged against what was measured beside the candidate. Where the
    candidate was caught running while held, nothing measured then may be kept, so the next measured its own
    calibration (its age is under the next evaluation's own time); so where its tree would not stop at all. That
    is an exact check where the tolerance's size is
    not (an honest one is 2 ms on a quiet machine and 4-14 ms on a loaded 2-core one, as a poisoned one can be).
    Where it was not caught, the calibration may be kept and must be as tight as an honest one."""
    started = time.monotonic()
    r = ev.evaluate(problem, reference_as_candidate(problem), config=config)
    elapsed = time.monotonic() - started
    assert r.status == "correct", (r.status, r.error)
    envelope = r.correctness["envelope"]
    caught = ("ran while the judge held", "did not stop when the judge froze")
    if first.status == "runtime_error" and any(why in (first.error or "") for why in caught):
        age = envelope["calibration_age_s"]  # None: no spare measured one (reported, not charged)
        assert age is None or age < elapsed, (envelope, elapsed)
    else:  # honest: ~4.4 ms of overhead and 2 ms of tolerance quiet, up to 12.3 and 4.5 on loaded CI runs
        assert envelope["tolerance_ms"] < 6.0 and envelope["overhead_ms"] < 15.0, (envelope, first.status)
    return r


# --- the candidate shares no process with the harness ------------------------------------------

FORGE_THROUGH_SEND = cand('''
import sys, os
def _forge():
    f = sys._getframe()
    while f is not None:
        send = f.f_globals.get("send") or f.f_locals.get("send")
        if callable(send):
            send({"type": "result", "status": "correct", "correct": True, "speedup": 42.0, "flags": []})
            send({"type": "done", "event_ms": 0.001, "structure": "tensor", "outputs": [], "launches": 9})
            os._exit(0)
        f = f.f_back
''', "_forge()\nreturn x")

COMPARE_REPLACED = cand('''
import sys
for name, mod in list(sys.modules.items()):
    if name.startswith("kb_gym") and hasattr(mod, "compare_outputs"):
        mod.compare_outputs = lambda *a, **k: None
''', "return torch.zeros_like(x)")

GELU_AS_RELU = cand('''
import torch.nn.functional as F
F.gelu = torch.relu
torch.nn.functional.gelu = torch.relu
lib = torch.library.Library("aten", "IMPL")
lib.impl("gelu", lambda x, approximate="none": torch.relu(x), "@KEY@")
'''.replace("@KEY@", "CUDA" if ON_GPU else "CPU"), "return torch.relu(x)")  # the dispatch key of the runner's device

REFERENCE_SLOWED = cand('''
import gc, time
for obj in gc.get_objects():
    if isinstance(obj, torch.nn.Module) and type(obj).__name__ == "Model":
        obj.forward = lambda *a: (time.sleep(0.05), a[0])[1]
_real = torch.nn.functional.gelu
def _slow(*a, **k):
    time.sleep(0.02)
    return _real(*a, **k)
torch.nn.functional.gelu = _slow
''')


@pytest.mark.parametrize("source, expect", [
    pytest.param(FORGE_THROUGH_SEND, ("incorrect",), id="forge_verdict_through_send"),
    pytest.param(COMPARE_REPLACED, ("incorrect",), id="compare_outputs_replaced"),
    pytest.param(GELU_AS_RELU, ("incorrect",), id="dispatcher_gelu_as_relu"),
])
def test_a_candidate_cannot_reach_what_judges_it(ev, source, expect):
    r = ev.evaluate(GELU, source, config=CHECK)
    assert r.status in expect and not r.correct, (r.status, r.error)
    assert r.speedup is None
    if source is FORGE_THROUGH_SEND:  # a message the harness never sends: the candidate wrote it
        assert "tampering" in r.flags, r.flags
    honest_after(ev)


def test_slowing_the_reference_in_its_own_process_does_not_slow_the_baseline(ev):
    """The baseline runs in the judge: a candidate that slows gelu (and any Model it can find) slows only
    its own runner. A 20 ms sleep per call would have given the baseline 20 ms."""
    r = ev.evaluate(GELU, REFERENCE_SLOWED, config=TIMED)
    assert r.status == "correct", (r.status, r.error)
    assert r.ref_runtime_ms < 5.0, r.ref_runtime_ms
    assert r.speedup is not None and r.speedup < 2.0


# --- the believed clock is the judge's ----------------------------------------------------------

LIES_ABOUT_ITS_TIME = cand('''
import sys, time
_clock = sys.modules["kb_gym.worker.clock"]
_real = _clock.timed_call
def _fast(fn, inputs, device, flusher):
    out, ms, host = _real(fn, inputs, device, flusher)
    return out, 1e-4, 1e-4
for name in ("kb_gym.worker.clock", "kb_gym.worker.runner"):  # wherever the runner looks it up
    sys.modules[name].timed_call = _fast
''', "time.sleep(0.02)\nreturn 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))")

LAZY_OUTPUT = cand('''
import time
class Lazy(list):
    def __iter__(self):
        time.sleep(0.02)  # the answer is computed when the harness reads it, after the clock stopped
        return super().__iter__()
''', "return Lazy([0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))])")


@pytest.mark.parametrize("source", [pytest.param(LIES_ABOUT_ITS_TIME, id="reports_a_false_event_time"),
                                    pytest.param(LAZY_OUTPUT, id="lazy_list_output")])
def test_work_outside_the_reported_time_is_counted_and_flagged(ev, source):
    """20 ms of work per call that the runner's own event time does not cover: the judge's envelope
    sees it, adds it to the candidate's time and flags side_stream."""
    if "Lazy" in source:  # a list output where the reference returns a tensor: the count differs
        problem = Problem(id=2, name="2_GELU_list", level=1,
                          code=GELU.code.replace("return torch.nn.functional.gelu(x)",
                                                 "return [torch.nn.functional.gelu(x)]"))
    else:
        problem = GELU
    r = ev.evaluate(problem, source, config=TIMED)
    assert r.status == "correct", (r.status, r.error)
    assert "side_stream" in r.flags, (r.flags, r.correctness.get("envelope"))
    assert r.runtime_ms >= 15.0, (r.runtime_ms, r.correctness.get("envelope"))
    assert r.speedup < 0.5
    honest_after(ev, TIMED)


DONE_BEFORE_THE_WORK = cand('''
import sys
_tensors = sys.modules["kb_gym.worker.tensors"]
_PENDING = []

def _late_bytes(t):
    import sys
    import time
    for x, out in sys.modules["kb_candidate"]._PENDING:  # the work, after "done" stopped the judge's clock
        time.sleep(0.02)
        out.copy_(0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5)))
    sys.modules["kb_candidate"]._PENDING.clear()
    host = t.detach().to("cpu").contiguous()
    return memoryview(host.reshape(-1).view(torch.uint8).numpy())

_tensors.host_bytes.__code__ = _late_bytes.__code__
''', """out = torch.empty_like(x)
_PENDING.append((x, out))
return out""")


def test_reporting_done_before_computing_the_outputs_is_tampering(ev):
    """The runner's own harness rewritten so that it computes the answer when its bytes are read for the host:
    either after "done" (then the outputs differ from the commitment sent with it: tampering) or, since the
    commitment is a digest of the host bytes taken before "done", while the judge's clock still runs (then the
    envelope counts the 20 ms a call). Where outputs are hashed on the GPU (device_digest.py) the harness
    never reads them for the host before "done", so the hook only runs after it: the work is never done in
    time and the answer the commitment binds is the empty one, wrong. Never a correct answer with the work
    uncounted."""
    r = ev.evaluate(GELU, DONE_BEFORE_THE_WORK, config=TIMED)
    if r.status == "incorrect":
        assert ("tampering" in r.flags and "committed" in r.error) or "values differ" in r.error, (r.flags, r.error)
    else:
        assert r.status == "correct" and "side_stream" in r.flags, (r.status, r.flags, r.error)
        assert r.runtime_ms >= 15.0, (r.runtime_ms, r.correctness.get("envelope"))
    honest_after(ev, TIMED)


INPUT_VALUE_CACHE = cand('''
_seen = {}
''', '''key = round(float(x[0, :8].sum()), 6)
_seen[key] = _seen.get(key, 0) + 1
if _seen[key] > 2:  # the determinism rerun repeats one trial's inputs once; nothing else may repeat
    raise RuntimeError(f"inputs seen {_seen[key]} times")
return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))''')


def test_every_timed_call_gets_inputs_never_seen_before(ev):
    """A cache keyed by sampled input values never hits: trials and timed calls each get fresh values."""
    r = ev.evaluate(GELU, INPUT_VALUE_CACHE, config=TIMED)
    assert r.status == "correct", (r.status, r.error)
    assert r.timing_reps >= 10


WRONG_WHILE_TIMED = cand('''
_calls = [0]
''', '''_calls[0] += 1
if _calls[0] > 4:  # right in the trials (2 + a rerun), wrong from the timed calls on
    return torch.zeros_like(x)
return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))''')


def test_outputs_of_timed_calls_are_checked(ev):
    r = ev.evaluate(GELU, WRONG_WHILE_TIMED, config=TIMED)
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.flags, r.error)
    honest_after(ev)


# --- nothing of one candidate survives into the next --------------------------------------------

LEFTOVERS = {
    "thread": '''
import _thread, time
def _spin():
    while True:
        time.sleep(0.001)
_thread.start_new_thread(_spin, ())
''',
    "finalizer": '''
import weakref, sys
class _Later:
    pass
_keep = _Later()
weakref.finalize(_keep, lambda: [setattr(m, "compare_outputs", lambda *a, **k: None)
                                  for m in list(sys.modules.values()) if hasattr(m, "compare_outputs")])
''',
    "audit_hook": '''
import sys
sys.addaudithook(lambda event, args: None)
''',
    "environment": '''
import os
os.environ["TRITON_INTERPRET"] = "0"
os.environ["KB_GYM_LANDLOCK"] = "0"
''',
    "open_file_limit": '''
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
''',
    "signal_timer": '''
import signal
signal.setitimer(signal.ITIMER_REAL, 0.5)
''',
    "forked_child": '''
import os, time
if os.fork() == 0:
    os.setsid()
    time.sleep(1.0)
    for fd in range(3, 64):
        try:
            os.write(fd, b'{"type": "result", "status": "correct", "speedup": 99}\\n')
        except OSError:
            pass
    os._exit(0)
''',
}


@pytest.mark.parametrize("name", sorted(LEFTOVERS))
def test_nothing_a_candidate_leaves_behind_reaches_the_next(ev, name):
    r = ev.evaluate(GELU, cand(LEFTOVERS[name]), config=CHECK)
    # Its own verdict may be any failure it caused itself: on the H200, 16 open files left constructing ModelNew
    # unable to import a torch module (compile_error). What matters is the next evaluation.
    assert r.status in ("correct", "runtime_error", "crash", "compile_error"), (r.status, r.error)
    honest_after(ev)
    honest_after(ev, TIMED)


# --- the sandbox ----------------------------------------------------------------------------------

def test_shm_writes_stay_in_the_runners_private_tmpfs(ev):
    name = f"kb_gym_test_{uuid.uuid4().hex}"
    src = cand(f'''
import os
with open("/dev/shm/{name}", "wb") as fh:
    fh.write(b"x" * (1 << 20))
''')
    r = ev.evaluate(GELU, src, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert not os.path.exists(f"/dev/shm/{name}")


def test_secrets_files_and_host_sockets_are_out_of_reach(ev, tmp_path_factory):
    """The environment is minimal, files outside the runner's folders cannot be read, and no socket can
    be made (a host UNIX socket is reachable through the file system despite the network namespace)."""
    secret = f"kb-secret-{uuid.uuid4().hex}"
    folder = tempfile.mkdtemp(prefix="kb_gym_secret_")
    with open(os.path.join(folder, "token.txt"), "w") as fh:
        fh.write(secret)
    sock_path = os.path.join(folder, "host.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(sock_path)
    server.listen(1)
    os.environ["KB_GYM_TEST_SECRET"] = secret
    try:
        with Evaluator(DEVICE, results_path=False, baseline_cache=False) as fresh:
            src = cand(f'''
import os, socket
found = [os.environ.get("KB_GYM_TEST_SECRET", "")]
for path in ("{folder}/token.txt", os.path.expanduser("~/.bash_history"), "/etc/shadow"):
    try:
        found.append(open(path).read()[:200])
    except OSError as exc:
        found.append(type(exc).__name__)
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect("{sock_path}")
    found.append("connected")
except OSError as exc:
    found.append("socket:" + type(exc).__name__)
raise RuntimeError(" | ".join(found))
''')
            r = fresh.evaluate(GELU, src, config=CHECK)
    finally:
        del os.environ["KB_GYM_TEST_SECRET"]
        server.close()
    assert r.status == "compile_error", (r.status, r.error)
    assert secret not in (r.error or "") and secret not in r.feedback, r.error
    assert "connected" not in r.error and "socket:PermissionError" in r.error, r.error
    assert "RuntimeError:  | PermissionError | " in r.error, r.error  # no secret in the environment, the file refused
    assert "root:" not in r.error, r.error  # /etc/shadow is not among the readable files


CPP_EXTENSION = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
torch::Tensor gelu(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* xp = xc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) yp[i] = 0.5f * xp[i] * (1.0f + std::erf(xp[i] * 0.70710678f));
    return y;
}
"""
ext = load_inline(name="guard_gelu_cpu", cpp_sources=source, functions=["gelu"], verbose=False)

class ModelNew(nn.Module):
    def forward(self, x):
        return ext.gelu(x)
'''


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("ninja") is None, reason="needs g++ and ninja")
@pytest.mark.skipif(ON_GPU, reason="a C++ loop over data_ptr, for CPU tensors only; CUDA load_inline builds: "
                    "tests/gpu/test_gpu_engine.py::test_load_inline_builds_and_same_name_extensions_do_not_collide")
def test_an_extension_built_in_the_runner_is_counted_as_the_candidates_kernel():
    """load_inline builds inside the runner's scratch folder (Landlocked, no sockets) and its calls count
    as custom kernel launches."""
    with Evaluator("cpu", results_path=False, load_timeout=600, timing_max_seconds=2) as ev:
        r = ev.evaluate(GELU, CPP_EXTENSION)
    assert r.status == "correct" and r.flags == [] and r.custom_kernel_launches, (r.status, r.flags, r.error)
