"""Red team, round 2: attacks on the judge/runner split by a candidate that has read the source.

Every candidate here rewrites its own runner (found through ``gc``): the design says nothing in the
runner is trusted, so each attack below is one the runner's harness could be made to carry out. Tests
that the design stops assert the verdict and that the next honest evaluation on the same Evaluator is
clean. Two attacks got through when this pass was made and were fixed since (the runner is frozen
while the spare calibrates and while the baseline runs; the build cache copies only with the runner
stopped, regular files only, without following links); their tests are plain tests now.
``integrity="off"`` throughout: the runtime design must hold when the static checks miss.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import pytest
from device import DEVICE
from test_judge_isolation import CHECK, GELU, HONEST, TIMED, cand, honest_after

from kb_gym import EvalConfig, Evaluator

# The runner's own harness object: every attack below starts from it.
FIND_RUNNER = '''
import gc, os, sys, time
_R = next(o for o in gc.get_objects()
          if type(o).__name__ == "Runner" and type(o).__module__ == "kb_gym.worker.runner")
'''

GELU_FORWARD = "return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))"


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


# --- the protocol: lies the runner's harness could tell -------------------------------------------

# "done" (with the outputs' description) before the outputs exist; they are computed while the bytes are
# written, after the judge's clock stopped. The honest forward takes 20 ms; it claims 0.5 us.
DONE_BEFORE_COMPUTE = cand(FIND_RUNNER + '''
_orig = _R._call
def _call(msg, timed):
    if not timed:
        return _orig(msg, timed)
    from kb_gym.worker.inputs import make_inputs
    x = make_inputs(_R.ref_mod, int(msg["seed"]), _R.device, _R.dtype)[0]
    meta = [{"dtype": "float32", "shape": list(x.shape), "device": _R.device.type, "nbytes": x.numel() * 4}]
    def later():
        yield _R.model(x)
    _R.send_tensors({"type": "done", "event_ms": 0.0005, "structure": "tensor", "outputs": meta, "launches": 1,
                     "backends": ["triton"], "mutated": False, "numerics_changed": False}, later())
_R._call = _call
''', "time.sleep(0.02)\n" + GELU_FORWARD)


def test_done_before_the_outputs_exist_is_tampering(ev):
    r = ev.evaluate(GELU, DONE_BEFORE_COMPUTE, config=TIMED)
    assert r.status == "incorrect" and "tampering" in r.flags, (r.status, r.flags, r.error)
    assert r.speedup is None
    honest_after(ev, TIMED)


def _event_time_lie(value: str) -> str:
    """The runner's timed_call reports ``value`` as its event time; the forward really takes 20 ms."""
    return cand(FIND_RUNNER + f'''
_clock = sys.modules["kb_gym.worker.clock"]
_real = _clock.timed_call
def _lie(fn, inputs, device, flusher, *a, **k):
    res = _real(fn, inputs, device, flusher, *a, **k)  # every time it reports (device, host) is the lie
    return res._replace(**{{f: {value} for f in res._fields if f != "out"}}) if hasattr(res, "_fields") \
        else (res[0], {value})
_clock.timed_call = _lie
sys.modules["kb_gym.worker.runner"].timed_call = _lie  # the name the runner calls (bound at its import)
''', "time.sleep(0.02)\n" + GELU_FORWARD)


@pytest.mark.parametrize("value", [
    pytest.param('float("nan")', id="nan"),
    pytest.param("-1e9", id="negative"),
    pytest.param('float("inf")', id="infinite"),
    pytest.param("1e-300", id="denormal_tiny"),
])
def test_event_times_that_are_not_plausible_do_not_buy_speed(ev, value):
    """NaN (JSON's NaN reaches the judge as a float), negative, infinite or vanishing event times: the
    judge's envelope bounds the candidate's time either way. A 20 ms forward against a ~0.1 ms baseline."""
    r = ev.evaluate(GELU, _event_time_lie(value), config=TIMED)
    assert r.status in ("correct", "incorrect"), (r.status, r.error)
    assert r.speedup is None or r.speedup < 0.5, (r.speedup, r.runtime_ms, r.flags, r.correctness.get("envelope"))
    honest_after(ev, TIMED)


def _rewrite_done(rewrite: str) -> str:
    """The runner's protocol encoder rewritten: ``rewrite`` turns the "done" message's bytes into others."""
    return cand(FIND_RUNNER + f'''
_proto = sys.modules["kb_gym.worker.protocol"]
_encode = _proto.encode
def _forged(message):
    data = _encode(message)
    if message.get("type") == "done" and message.get("event_ms") is None:
        data = {rewrite}
    return data
_proto.encode = _forged
''')


@pytest.mark.parametrize("rewrite, expect", [
    # outputs described far larger than the reference's: the judge must not allocate them
    pytest.param('data.replace(b\'"shape": [64, 256]\', b\'"shape": [64, 256, 1099511627]\')',
                 ("incorrect",), id="huge_announced_payload"),
    # a forged "done" with no outputs in front of the real one (which then answers the next command)
    pytest.param('b\'{"type": "done", "event_ms": null, "structure": "sequence", "outputs": [], "payload_bytes": 0, '
                 '"commitment": 0}\\n\' + data', ("incorrect",), id="extra_done_before_the_reply"),
    # the encoder passed through unchanged: the rewrite itself costs nothing
    pytest.param("data", ("correct",), id="unchanged_control"),
    # launch counts that are not numbers: int() of them in the judge
    pytest.param('data.replace(b\'"launches": 0\', b\'"launches": "many"\')',
                 ("incorrect", "crash", "runtime_error"), id="launches_not_a_number"),
    # an integer JSON can carry and Python will not parse (more than 4300 digits)
    pytest.param('data.replace(b\'"launches": 0\', b\'"launches": 1\' + b"0" * 5000)',
                 ("incorrect", "crash", "runtime_error"), id="launches_a_5000_digit_integer"),
    # a bare JSON value instead of an object
    pytest.param('b"[1, 2, 3]\\n"', ("incorrect", "crash", "runtime_error"), id="not_an_object"),
])
def test_malformed_replies_cost_only_the_candidate(ev, rewrite, expect):
    r = ev.evaluate(GELU, _rewrite_done(rewrite), config=CHECK)
    assert r.status in expect, (r.status, r.error)
    if r.status != "correct":
        assert not r.correct and r.speedup is None
    honest_after(ev)
    honest_after(ev, TIMED)


SPLIT_WRITES = cand(FIND_RUNNER + '''
class _OneByte(type(sys)):  # os, but every write takes one byte: messages and payload arrive in pieces
    def __getattr__(self, name):
        return getattr(os, name)
    @staticmethod
    def write(fd, data):
        return os.write(fd, bytes(memoryview(data)[:1]))
for _name in ("kb_gym.worker.protocol", "kb_gym.worker.runner"):
    sys.modules[_name].os = _OneByte("os")
''')


def test_replies_split_across_many_writes_are_read_whole(ev):
    r = ev.evaluate(GELU, SPLIT_WRITES, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    honest_after(ev)


# --- the envelope's calibration, measured on the spare beside the candidate's idle runner -------------

# While the judge calibrates the runner's per-call overhead on the pristine spare (before the first timed
# call), the candidate's runner is idle from the judge's point of view but still runs: twelve busy children,
# each in its own session (its own scheduler autogroup), take the CPU from the spare. The spare's overhead
# and its spread come out several milliseconds wide, and so does the tolerance. The children are stopped at
# the first timed call: from then on 3 ms of work per call that the (falsely reported) event time does not
# cover hides inside the inflated overhead. True speedup ~0.02x; reported ~80x, no side_stream.
CALIBRATION_POISON = cand(FIND_RUNNER + '''
import signal
_clock = sys.modules["kb_gym.worker.clock"]
_real = _clock.timed_call
def _fast(fn, inputs, device, flusher, *a, **k):
    res = _real(fn, inputs, device, flusher, *a, **k)  # every time it reports (device, host): 1 us
    return res._replace(**{f: 1e-3 for f in res._fields if f != "out"}) if hasattr(res, "_fields") \
        else (res[0], 1e-3)
_clock.timed_call = _fast
sys.modules["kb_gym.worker.runner"].timed_call = _fast  # the name the runner calls (bound at its import)
_kids = []
for _ in range(12):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        while True:
            pass
    _kids.append(pid)
_orig = _R.handle
def _handle(msg):
    if msg.get("type") == "timed":  # the spare's calibration is over: quiet from now on
        for p in _kids:
            os.kill(p, signal.SIGSTOP)
    _orig(msg)
_R.handle = _handle
''', "time.sleep(0.003)\n" + GELU_FORWARD)


def test_contention_during_the_spares_calibration_does_not_widen_the_envelope(ev):
    """Busy children left running while the spare calibrates inflated the tolerance 5-fold and hid 3 ms a
    call (56-86x fake): the candidate's runner is frozen (SIGSTOP, whole tree) during the calibration."""
    r = ev.evaluate(GELU, CALIBRATION_POISON, config=TIMED)
    if r.status != "correct":  # not the attack's demonstration: fail outright (not an expected failure)
        pytest.fail(f"the attack itself broke: {r.status} {r.error}")
    assert "side_stream" in r.flags or r.speedup < 1.0, (r.speedup, r.flags, r.correctness.get("envelope"))


def test_after_the_calibration_attack_the_next_evaluation_is_clean(ev):
    ev.evaluate(GELU, CALIBRATION_POISON, config=TIMED)
    honest_after(ev, TIMED)
    r = ev.evaluate(GELU, HONEST, config=TIMED)
    envelope = r.correctness["envelope"]
    assert envelope["tolerance_ms"] < 5.0 and not envelope["counted"], envelope


# --- the extension build cache: the judge copies the runner's build folder ---------------------------

def _cache_swap(secret_path: str) -> str:
    """Two hundred plain files in the runner's build folder while the judge lists them; each is replaced by a
    symlink to ``secret_path`` (atomically, with rename) while the judge copies the folder. ``keep`` skips
    the links it saw when it listed, then copies each entry by name, following what is there by then. On
    the next evaluation of the same source the judge restores "the build", the secret included."""
    return cand(FIND_RUNNER + f'''
import threading
from torch.utils.cpp_extension import load_inline  # named: a source whose build folder is kept
_ext = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "swapped")  # an extension's folder: ext/NAME
_names = sorted(os.listdir(_ext)) if os.path.isdir(_ext) else []
if _names:
    _got = [open(os.path.join(_ext, n), "rb").read(64) for n in _names]
    raise RuntimeError("restored: " + "|".join(g.decode("latin-1") for g in _got if not g.startswith(b"\\0")))
os.makedirs(_ext, exist_ok=True)
_tmp = os.environ["TMPDIR"]
for i in range(200):
    with open(os.path.join(_ext, "f%03d.so" % i), "wb") as fh:
        fh.write(b"\\0" * (1 << 18))
    os.symlink("{secret_path}", os.path.join(_tmp, "l%03d" % i))
def _swap():
    while _R.model is None:  # set right before the "loaded" reply, after which the judge copies
        time.sleep(0.0001)
    for i in range(200):
        time.sleep(0.0002)
        os.rename(os.path.join(_tmp, "l%03d" % i), os.path.join(_ext, "f%03d.so" % i))
threading.Thread(target=_swap, daemon=True).start()
''')


@pytest.fixture
def secret_file():
    folder = Path(tempfile.mkdtemp(prefix="kb_gym_redteam_secret_"))
    secret = f"kb-secret-{uuid.uuid4().hex}"
    (folder / "token.txt").write_text(secret)
    yield folder / "token.txt", secret
    (folder / "token.txt").unlink()
    folder.rmdir()


def test_the_build_cache_copies_no_file_from_outside_the_runner(monkeypatch, tmp_path, secret_file):
    """Files swapped for links to a secret after the judge's listing were followed by the judge's copy:
    the build is now kept with the runner and all its threads stopped, regular files only, opened without
    following links."""
    path, secret = secret_file
    cache = tmp_path / "extensions"
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(cache))
    source = _cache_swap(str(path))
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as fresh:
        first = fresh.evaluate(GELU, source, config=CHECK)
        if first.status != "correct":
            pytest.fail(f"the attack itself broke: {first.status} {first.error}")
        cached = b"".join(p.read_bytes()[:64] for p in cache.rglob("*") if p.is_file())
        second = fresh.evaluate(GELU, source, config=CHECK)
        honest_after(fresh)
    assert secret.encode() not in cached, "the judge copied a file from outside the runner into the cache"
    assert secret not in (second.error or ""), second.error


def test_a_symlink_already_in_the_build_folder_is_not_followed(monkeypatch, tmp_path, secret_file):
    """The static case (no race): a link planted in the build folder before the judge lists it is skipped."""
    path, secret = secret_file
    cache = tmp_path / "extensions"
    monkeypatch.setenv("KB_GYM_EXTENSIONS_DIR", str(cache))
    source = cand(f'''
import os
from torch.utils.cpp_extension import load_inline  # named: a source whose build folder is kept
_ext = os.environ["TORCH_EXTENSIONS_DIR"]
_names = sorted(os.listdir(_ext)) if os.path.isdir(_ext) else []
if _names:
    raise RuntimeError("restored: " + "|".join(open(os.path.join(d, n)).read(64)
                                               for d, _, files in os.walk(_ext) for n in files))
os.makedirs(os.path.join(_ext, "sub"), exist_ok=True)
open(os.path.join(_ext, "sub", "plain.so"), "w").write("plain")  # a library: what a build folder is kept for
os.symlink("{path}", os.path.join(_ext, "link.txt"))
os.symlink("{path.parent}", os.path.join(_ext, "sub", "dirlink"))
''')
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as fresh:
        first = fresh.evaluate(GELU, source, config=CHECK)
        second = fresh.evaluate(GELU, source, config=CHECK)
        honest_after(fresh)
    assert first.status == "correct", (first.status, first.error)
    assert second.status == "compile_error" and "plain" in second.error, (second.status, second.error)
    assert secret not in (second.error or "")
    assert not any(secret.encode() in p.read_bytes() for p in cache.rglob("*") if p.is_file())


# --- the sandbox -------------------------------------------------------------------------------------

SANDBOX_PROBE = cand('''
import os, glob
found = []
# the judge's scratch folder, its job folder and the spare's scratch (siblings of this runner's)
root = os.environ["TMPDIR"].rsplit("/", 2)[0]
for path in [root, *glob.glob(root + "/*")]:
    try:
        found.append(path + "=" + ",".join(sorted(os.listdir(path))[:5]))
    except OSError as exc:
        found.append(path + ":" + type(exc).__name__)
# other processes: only this PID namespace should be visible
found.append("pids=" + ",".join(sorted(p for p in os.listdir("/proc") if p.isdigit())))
for pid in ("1", "2"):
    try:
        found.append("env" + pid + "=" + open(f"/proc/{pid}/environ").read()[:80])
    except OSError as exc:
        found.append("env" + pid + ":" + type(exc).__name__)
# the repository and the user's home
for path in ("@REPO@/README.md", "@REPO@/.git/config", os.path.expanduser("~root/.bashrc"), "/root"):
    try:
        found.append(path + "=" + (",".join(os.listdir(path)[:3]) if os.path.isdir(path) else open(path).read(20)))
    except OSError as exc:
        found.append(path + ":" + type(exc).__name__)
# writing beside the scratch folder, and remounting to get out of Landlock
for path in (root + "/planted", "/tmp/kb_gym_planted_by_candidate"):
    try:
        open(path, "w").write("x")
        found.append(path + " written")
    except OSError as exc:
        found.append(path + ":" + type(exc).__name__)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
found.append("umount_proc=%d" % libc.umount2(b"/proc", 2))
raise RuntimeError(" | ".join(found))
'''.replace("@REPO@", str(Path(__file__).resolve().parents[2])))


def test_a_runner_sees_no_judge_spare_or_home_folder(ev):
    r = ev.evaluate(GELU, SANDBOX_PROBE, config=CHECK)
    assert r.status == "compile_error", (r.status, r.error)
    error = r.error or ""
    assert " written" not in error and "planted:PermissionError" in error, error
    assert "job_" not in error and "runner_" not in error, error  # no other folder listed
    assert ":PermissionError | pids=1 |" in error, error  # the judge's scratch root: refused; one process
    assert "README.md:PermissionError" in error and ".git/config:PermissionError" in error, error
    assert "/root:PermissionError" in error, error
    assert "umount_proc=-1" in error, error  # Landlock forbids changing the mount topology
    assert not os.path.exists("/tmp/kb_gym_planted_by_candidate")
    honest_after(ev)


def test_judge_memory_is_bounded_by_the_announced_size(ev):
    """Outputs announced within the byte limit but a payload that never ends: the judge reads exactly what
    it announced, and a stalled payload is the candidate's failure."""
    src = cand(FIND_RUNNER + '''
_proto = sys.modules["kb_gym.worker.protocol"]
_encode = _proto.encode
def _forged(message):
    data = _encode(message)
    if message.get("type") == "done" and message.get("event_ms") is None:
        data = data.replace(b'"payload_bytes": 65536', b'"payload_bytes": 6553600')
    return data
_proto.encode = _forged
''')
    r = ev.evaluate(GELU, src, config=EvalConfig(trials=2, timing=False, integrity="off", load_timeout=60,
                                                 correctness_timeout=20))
    assert r.status in ("incorrect", "crash", "timeout"), (r.status, r.error)
    honest_after(ev)
