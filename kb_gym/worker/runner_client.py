"""The judge's side of one runner: start it, hand it a candidate, read what it sends, kill it.

A runner is used for one candidate and then killed with everything it started (its PID namespace
goes with it); runner_pool.py keeps the next one ready. Every wait on a runner has a deadline: a hung
or dead runner becomes a verdict, never a hung judge.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from kb_gym import sandbox
from kb_gym.file_tree import remove_tree
from kb_gym.worker import (
    build_cache,
    cpu_clock,
    device_digest,
    device_payload,
    header_diet,
    launch_shim,
    load_forward,
    payload,
    triton_launchers,
)
from kb_gym.worker.clock import median_ci
from kb_gym.worker.loading import StageError
from kb_gym.worker.protocol import (
    LANDLOCK_BREAKS_CUDA,
    PAYLOAD_NOTES,
    PAYLOAD_PARTS,
    MessageReader,
    ProtocolError,
    write_message,
)
from kb_gym.worker.runner_replies import (
    BACKENDS,
    LOAD_STATUSES,
    BurstReply,
    CallReply,
    dataflow_report,
    finite_ms,
    launch_count,
    pch_record,
)
from kb_gym.worker.runner_start import READS_BREAK_CUDA, runner_env, widen_pipe
from kb_gym.worker.spot_check import DrawnChunks, SampledOutputs, check_hash_lists, chunk_hash, pick_chunks
from kb_gym.worker.tensors import (
    FORM_MAX_CHARS,
    PINNED_RECEIVE_BYTES,
    WIRE_DTYPES,
    WireError,
    commitment,
    decode,
    expected_nbytes,
    receive_buffer,
)

STARTUP_TIMEOUT = 300.0
# What a runner owes after "done" (drawn chunks, the payload's bytes) is the judge's protocol, not the
# candidate's time, so it may take longer than the stage has left; but only as long as moving the bytes can
# take at a pessimistic rate: a runner that stalls there holds its judge seconds, not a minute per call.
TRANSFER_FLOOR_S = 5.0
TRANSFER_MIN_BYTES_PER_S = 100e6


def transfer_wait(nbytes: int, timeout: float) -> float:
    """Seconds to wait for ``nbytes`` owed after "done": the stage's ``timeout`` left, or where that is less,
    what the bytes need at TRANSFER_MIN_BYTES_PER_S plus TRANSFER_FLOOR_S."""
    return max(timeout, TRANSFER_FLOOR_S + max(0, nbytes) / TRANSFER_MIN_BYTES_PER_S)


RAN_WHILE_STOPPED = ("the candidate's processes ran while the judge held them stopped to measure beside them (one "
                     "resumed itself, e.g. with a timer that sends SIGCONT): nothing measured then counts")
NOT_STOPPED = ("the candidate's processes did not stop when the judge froze them to measure beside them (a thread "
               "stayed inside one system call for seconds)")


class RunnerProcess:
    """One runner: started pristine, given at most one candidate, then killed."""

    def __init__(self, device: str, scratch_root: Path, zygote: Any = None, payload_bytes: int = 0) -> None:
        self.device = device
        self.scratch = Path(tempfile.mkdtemp(prefix="runner_", dir=scratch_root))
        self.torch_device = torch.device(device)
        self.info: dict[str, Any] = {}
        self.rtt_ms = 0.0
        # timed calls on the CPU read the tree's CPU time from the kernel where KB_GYM_CPU_CLOCK=1 (cpu_clock.py;
        # off by default: honest candidates were charged, docs/integrity.md round 25)
        self.cpu_clock = self.torch_device.type == "cpu" and cpu_clock.enabled()
        self.stage = "load"
        # Two parties stop the tree: the judge (``frozen``) and, while the job waits for its device, the pause for a
        # neighbour's measurement (neighbours.py). Counted, so that the one done first never resumes it under the other.
        self._stops = 0
        self._stopped: set[int] = set()
        self._stop_lock = threading.Lock()
        # while its job waits for the device: the seconds it has been paused for others so far (neighbours.py); a
        # wait for its reply leaves them out of its time
        self.paused: Callable[[], float] | None = None
        self.kill_seconds: dict[str, float] = {}
        self.started = time.monotonic()
        self.started_wall = time.time()  # the runner's "ready" carries its own wall clock (one host)
        from kb_gym.workers import LogDrain  # the same bounded drain the evaluator uses for judges

        env = runner_env(device, self.scratch)
        self.launch_shim = launch_shim.preloaded_in(env)  # a forked runner's zygote got the same env
        if device_digest.trusted(self.torch_device):  # outputs hashed on the GPU (device_digest.py)
            device_digest.seed(self.scratch / "triton")
            env[device_digest.ENV_WARM] = "1"
            env[device_digest.ENV_SWITCH] = os.environ.get(device_digest.ENV_SWITCH, "1")
        self.device_digest = False  # until the runner says it loaded the kernel
        self.digest_note = ""
        namespaces = bool(sandbox.namespace_prefix())
        self.proc: subprocess.Popen | None = None
        self.forked = zygote is not None
        payload_fd = payload.create()  # large outputs come back through it (payload.py)
        self.payload = (payload.PayloadReader(payload_fd, pin=payload.pin_wanted(device))
                        if payload_fd is not None else None)
        # outputs of this size expected (RunnerPool.payload_hint): through GPU memory the judge owns where asked for
        # (device_payload.py), else the runner maps its memfd for them at start-up and the judge once it is ready
        expected = payload.premap_size(payload_bytes)
        self.device_payload: device_payload.DeviceBuffer | None = None
        device_fd = None
        if device_payload.wanted(device, expected):
            try:
                self.device_payload, device_fd = device_payload.DeviceBuffer.create(self.torch_device, expected)
            except (device_payload.DriverError, RuntimeError):
                self.device_payload, device_fd = None, None
        self.premap_bytes = expected if self.payload is not None and self.device_payload is None else 0
        if self.premap_bytes:
            self.payload.reserve(self.premap_bytes)
        self.premap_seconds = 0.0  # the runner's mapping of its memfd when the job prepared it (prepare)
        self.device_payloads = 0  # calls whose outputs came through it
        self.shm_payloads = 0  # calls whose outputs came through the memfd
        # where each memfd payload's time goes (protocol.PAYLOAD_PARTS; the runner's copy in holds its mapping and
        # page-locking on its first call)
        self.payload_seconds: dict[str, list[float]] = {part: [] for part in PAYLOAD_PARTS}
        self.pch: dict[str, list[str]] = {"used": [], "wanted": []}
        self.headers: list[str] = []  # what header_diet did to each CUDA build, as the runner says
        self.load_forward: dict[str, Any] | None = None  # the forward after the load, as the runner says
        # Triton launchers its calls asked for, with whether each was in its cache (triton_launchers.py), as it says
        self.launchers: dict[tuple[str, ...], bool] = {}
        if zygote is not None:  # forked from a pristine process that has imported torch: milliseconds
            ends = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr
            extra = [fd for fd in (payload_fd, device_fd) if fd is not None]
            if payload_fd is not None:
                env[payload.ENV_FD] = "3"
            if device_fd is not None:  # numbered after the standard three and the memfd, in the child
                env[device_payload.ENV_FD] = str(3 + extra.index(device_fd))
                env[device_payload.ENV_BYTES] = str(self.device_payload.size)
            try:
                self.pid = zygote.spawn(device, str(self.scratch), env, namespaces,
                                        [ends[0][0], ends[1][1], ends[2][1], *extra])
            except BaseException:
                self._drop_payload()
                self._drop_device_payload()
                raise
            finally:
                for fd in (ends[0][0], ends[1][1], ends[2][1]):
                    os.close(fd)
                if device_fd is not None:  # the runner holds its own now
                    os.close(device_fd)
            self.stdin_fd, stdout_fd = ends[0][1], ends[1][0]
            stderr = os.fdopen(ends[2][0], "rb", buffering=0)
        else:  # a fresh interpreter in fresh namespaces: seconds
            isolation = []
            if namespaces:  # bound at the host's one mount point there, as a forked runner is (build_cache.py)
                point = build_cache.mount_point(self.scratch)
                point.mkdir(parents=True, exist_ok=True)
                isolation = ["--namespaces", "--mount-point", str(point)]
            cmd = [*sandbox.runner_namespace_prefix(), sys.executable, "-P", "-m", "kb_gym.worker.runner",
                   "--device", device, "--scratch", str(self.scratch), *isolation]
            if payload_fd is not None:
                env[payload.ENV_FD] = str(payload_fd)
            if device_fd is not None:
                env[device_payload.ENV_FD] = str(device_fd)
                env[device_payload.ENV_BYTES] = str(self.device_payload.size)
            try:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, env=env, start_new_session=True, close_fds=True,
                                             cwd=str(self.scratch),
                                             pass_fds=tuple(fd for fd in (payload_fd, device_fd) if fd is not None))
            except BaseException:
                self._drop_payload()
                self._drop_device_payload()
                raise
            finally:
                if device_fd is not None:
                    os.close(device_fd)
            self.pid = self.proc.pid
            self.stdin_fd, stdout_fd, stderr = self.proc.stdin.fileno(), self.proc.stdout.fileno(), self.proc.stderr
        widen_pipe(stdout_fd)
        self.reader = MessageReader(stdout_fd)
        self.drain = LogDrain(stderr)
        self.drain.start()
        self._fds = [] if self.proc is not None else [self.stdin_fd, stdout_fd]
        self._stderr = stderr
        self._large_buffer: tuple[torch.Tensor, memoryview] | None = None
        self.ready = False

    @property
    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return _running(self.pid)

    def log_tail(self) -> str:
        return self.drain.text_since(0)

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        """Block until the runner is up, then time a few round trips while it is still pristine:
        that latency is the part of the judge's clock that is the pipe's, not the candidate's."""
        if self.ready:
            return
        deadline = self.started + timeout
        try:
            msg = self.reader.read(max(0.0, deadline - time.monotonic()))
        except ProtocolError:
            msg = None
        if msg is None or msg.get("type") != "ready":
            said = ""
            if msg is not None and msg.get("type") == LANDLOCK_BREAKS_CUDA:
                said = str(msg.get("error", ""))
                if not self.forked:  # a forked runner's CUDA failure is the zygote's to answer for
                    READS_BREAK_CUDA[self.device] = said
            log = self.log_tail()
            self.kill()
            raise StageError("crash", f"a {'forked ' if self.forked else ''}runner for {self.device} failed to "
                                      f"start: {said} {log[-1500:]}".strip())
        self.info = msg
        # from the judge's request to "ready" (not to when the judge read it): the fork or the interpreter's start,
        # then the runner's own phases
        ready_at = msg.get("ready_at")
        until = ready_at - self.started_wall if isinstance(ready_at, float) else time.monotonic() - self.started
        self.info["startup_phases"] = {"until_ready": round(until, 4),
                                       **(msg.get("startup_phases") or {})}
        self.device_digest = bool(msg.get("device_digest")) and device_digest.trusted(self.torch_device)
        # why outputs on a GPU are hashed on the host after all: the judge's self-check, or the runner's load
        self.digest_note = "" if self.device_digest else (device_digest.why_not(self.torch_device) or str(
            msg.get("device_digest_error") or ""))[:600]
        rtts = []
        for _ in range(7):
            t0 = time.perf_counter()
            self._send({"type": "ping"})
            self._expect("pong", 30.0)
            rtts.append((time.perf_counter() - t0) * 1e3)
        self.rtt_ms = median_ci(rtts)[0]
        self.ready = True
        if self.premap_bytes and self.payload is not None and "payload" in self.info["startup_phases"]:
            self.payload.premap(self.premap_bytes, self.torch_device)

    def _send(self, msg: dict[str, Any]) -> None:
        try:
            write_message(self.stdin_fd, msg)
        except OSError as exc:
            raise self._died(f"could not reach the runner ({exc})") from None

    def _read(self, timeout: float) -> dict[str, Any]:
        if self.paused is not None:
            return self._read_unpaused(timeout, self.paused)
        try:
            msg = self.reader.read(max(0.0, timeout))
        except ProtocolError as exc:
            raise self._died(str(exc)) from None
        if msg is None:
            self.kill()
            raise StageError("timeout", f"the {self.stage} stage exceeded its time limit (the candidate ran on "
                                        f"for the {timeout:.0f} s left of it)")
        return msg

    def _read_unpaused(self, timeout: float, paused: Callable[[], float]) -> dict[str, Any]:
        """``_read``, with ``timeout`` counted in the time the runner was not paused."""
        deadline, first = time.monotonic() + timeout, paused()
        seen = first
        while True:
            try:
                msg = self.reader.read(max(0.0, deadline - time.monotonic()))
            except ProtocolError as exc:
                raise self._died(str(exc)) from None
            if msg is not None:
                return msg
            now_paused = paused()
            if now_paused <= seen:
                self.kill()
                raise StageError("timeout", f"the {self.stage} stage exceeded its time limit (the candidate ran on "
                                            f"for the {timeout:.0f} s left of it, besides {seen - first:.1f} s "
                                            "stopped for other candidates' measurements)")
            deadline, seen = deadline + now_paused - seen, now_paused

    def _expect(self, kind: str, timeout: float) -> dict[str, Any]:
        msg = self._read(timeout)
        if msg.get("type") != kind:
            raise self._unexpected(msg, kind)
        return msg

    def _unexpected(self, msg: dict[str, Any], wanted: str) -> StageError:
        """A message the runner's harness never sends in reply to this command: the candidate wrote to its
        channel (a forged verdict, a stray line from a child), or rewrote the harness."""
        self.kill()
        return StageError("incorrect", f"the candidate's process answered {str(msg.get('type'))[:40]!r} where "
                          f"{wanted!r} was due: it wrote to the runner's channel itself", flags=("tampering",))

    def _died(self, why: str) -> StageError:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        tail = self.log_tail().strip()[-600:]
        self.kill()
        detail = f" (exit code {code})" if code is not None else ""
        return StageError("crash", f"the candidate's process died{detail}: {why}" + (f"\n{tail}" if tail else ""))

    def prepare(self, problem_code: str, init_seed: int, precision: str, tf32: bool, timeout: float,
                reference_model: bool = False, payload_bytes: int = 0) -> None:
        """Load the problem while the runner is pristine; with ``reference_model`` the reference model too,
        for timing.calibrate_overhead to time it there before any candidate code runs. ``payload_bytes``: outputs
        of this size are expected (the problem's earlier evaluations): both sides map the memfd for them now,
        outside the device lock (payload.PREMAP_MIN_BYTES), where the runner's start-up did not already."""
        premap = payload.premap_size(payload_bytes) if self.payload is not None else 0
        if self.device_payload is not None and self.device_payload.size >= payload_bytes:
            premap = 0  # they come through the device buffer
        if premap:
            self.payload.reserve(premap)
        self._send({"type": "prepare", "problem_code": problem_code, "init_seed": init_seed, "precision": precision,
                    "tf32": tf32, "reference_model": reference_model, "payload_bytes": premap})
        reply = self._read(timeout)
        if reply.get("type") != "prepared":
            raise self._unexpected(reply, "prepared")
        if reply.get("status") != "ok":
            raise StageError("runtime_error", str(reply.get("error", "the runner could not load the problem")))
        if premap and isinstance(reply.get("payload_premap_s"), float) and reply["payload_premap_s"] > 0:
            self.premap_seconds = reply["payload_premap_s"]
            self.payload.premap(premap, self.torch_device)

    def forget_calls(self) -> None:
        """Count payloads from here on only: the calls before the candidate loads (timing.harness_cpu) are the
        judge's, and a result's payload counts say what the candidate's calls did."""
        self.device_payloads = self.shm_payloads = 0
        self.payload_seconds = {part: [] for part in PAYLOAD_PARTS}

    def load(self, source: str, init_seed: int, timeout: float, forward: dict[str, Any] | None = None,
             during_forward: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
             ) -> dict[str, list[str]]:
        """Import the candidate and build ModelNew; a failure is the candidate's verdict. Returns what its
        builds used of the precompiled headers and what they wanted (pch.py), as the runner says: names only,
        checked against pch.VARIANTS wherever they are acted on. ``forward``: one forward after the load
        (load_forward.py), a request of its own made inside ``during_forward()`` (the pause watcher's: measurements
        wait for it), whose account is kept in ``load_forward``."""
        paused_s = self.paused if self.paused is not None else (lambda: 0.0)
        began, paused_before = time.monotonic(), paused_s()
        self._send({"type": "load", "source": source, "init_seed": init_seed})
        reply = self._read(timeout)
        if reply.get("type") != "loaded":
            raise self._unexpected(reply, "loaded")
        self.pch = pch_record(reply.get("pch"))
        self.headers = header_diet.record_of(reply.get("headers"))
        if reply.get("status") != "ok":  # the runner names its failure, among those a load can have
            status = reply.get("status") if reply.get("status") in LOAD_STATUSES else "compile_error"
            raise StageError(status, str(reply.get("error", ""))[:20000])
        self.load_forward = None
        if forward:
            with during_forward() if during_forward is not None else contextlib.nullcontext():
                self._send({"type": "load_forward", "spec": forward})
                ran = time.monotonic() - began - (paused_s() - paused_before)  # the time stopped is not the load's
                reply = self._read(timeout - ran)
            if reply.get("type") != "load_forward":
                raise self._unexpected(reply, "load_forward")
            self.load_forward = load_forward.record(reply)
        return self.pch

    def call(self, seed: int, *, timeout: float, byte_limit: int, timed: bool = False, widen: bool = False,
             check_mutation: bool = False, target: str = "candidate", chunk_bytes: int = 0,
             knockout: bool = False, dataflow: dict[str, Any] | None = None,
             marks: Callable[[], int | None] | None = None, window_at_done: bool = False) -> CallReply:
        """One forward on the problem's inputs for ``seed``; the outputs come back as plain tensors, or with
        ``chunk_bytes`` (timed calls) as SampledOutputs: chunks drawn after "done" (spot_check.py). ``knockout``:
        the candidate's own kernels do nothing in this forward (launches.py); ``dataflow`` (phase, atol, rtol): the
        forward is traced (dataflow.py) and the reply carries the runner's report. ``marks``: a timed call of the
        probe clock's pass (probe_check.py): the runner neither flushes nor (but for the reference) shields, and
        ``marks()`` is read right before the seed is sent and once the outputs are the judge's (``CallReply.window``):
        whole outputs received, decoded and copied (the runner hashes nothing: what it computes until then is in the
        window), or the drawn chunks received and copied to the judge's host (their hashes, sent with "done",
        commit the whole: they come as DrawnChunks, checked against them once the probe has stopped,
        ``spot_check.verified``). ``window_at_done`` (the wall check, on the judge's host clock): the second mark is
        read at "done", which commits the outputs (hashed, whole or in chunks), so the window holds no copy of them
        to the judge: on an H100 the drawn chunks' copies of a 151 MB output made a call's span ~135 ms beyond its
        forward, varying by more than the claim."""
        nonce = int.from_bytes(os.urandom(7), "little")
        if self.payload is not None and not (timed and chunk_bytes) and payload.SHM_MIN_BYTES <= byte_limit < 1 << 40:
            self.payload.reserve(byte_limit)  # the whole outputs may come through the memfd: sized by the judge
        at_done = window_at_done and marks is not None
        whole_probe = marks is not None and not (timed and chunk_bytes) and not at_done
        before = marks() if marks is not None else None
        cpu_before = cpu_clock.settled(self.pid) if timed and self.cpu_clock else None
        t0 = time.perf_counter()
        self._send({"type": "timed" if timed else "call", "seed": seed, "widen": widen, "probe": marks is not None,
                    "check_mutation": check_mutation, "target": target, "nonce": nonce, "knockout": knockout,
                    "dataflow": dataflow, "chunk_bytes": chunk_bytes if timed else 0,
                    "digest": "none" if whole_probe else "device" if self.device_digest else "host"})
        msg = self._read(timeout)
        envelope = (time.perf_counter() - t0) * 1e3
        cpu = None  # the tree's CPU time: read once the outputs are here and the runner is idle again
        # the probe's marks: the second once the outputs are the judge's, or at "done" (never raises)
        window = self._window(before, marks) if at_done else None
        if msg.get("type") == "error":
            status = str(msg.get("status", "runtime_error"))
            raise StageError(status if status in ("runtime_error", "incorrect", "compile_error") else "runtime_error",
                             str(msg.get("error", ""))[:20000], restart=bool(msg.get("sticky")))
        if msg.get("type") != "done":
            raise self._unexpected(msg, "done")
        for signature, hit in triton_launchers.reported(msg.get("launchers")):
            if len(self.launchers) < triton_launchers.MAX_REPORTED:
                self.launchers.setdefault(signature, hit)
        try:
            launch_count(msg.get("launches"))  # checked where a WireError is the candidate's
            nbytes = expected_nbytes(msg.get("outputs"), byte_limit)
            if timed and chunk_bytes:
                sampled = self._sampled(msg, nonce, chunk_bytes, timeout, defer=marks is not None)
                if marks is not None and not at_done:
                    window = self._window(before, marks)
                if cpu_before is not None:
                    cpu = cpu_clock.window(cpu_before, cpu_clock.settled(self.pid))
                return self._reply(msg, envelope, sampled, window, cpu)
            data, into = self._payload(msg, nbytes, timeout, reuse=True)
            if cpu_before is not None:
                cpu = cpu_clock.window(cpu_before, cpu_clock.settled(self.pid))
            t_out = time.perf_counter()
            tensors = decode(msg["outputs"], data, self.torch_device)  # copies: the bytes cannot change after
            if msg.get("payload_via") in ("shm", "device"):
                self._note_payload("copy_out", t_out)
            if whole_probe:
                window = self._window(before, marks)
            elif commitment(tensors, nonce, self.device_digest) != msg.get("commitment"):
                raise StageError("incorrect", "the outputs the runner sent are not the ones it had committed to "
                                 "when it reported the call done: its time did not cover computing them",
                                 flags=("tampering",))
        except WireError as exc:
            raise StageError("incorrect", f"the candidate's outputs could not be read: {exc}") from None
        except ProtocolError as exc:
            raise self._died(str(exc)) from None
        del data, into
        outputs = tensors[0] if msg.get("structure") == "tensor" and len(tensors) == 1 else tuple(tensors)
        return self._reply(msg, envelope, outputs, window, cpu)

    def inputs_mutated(self, timeout: float) -> bool:
        """Whether the last timed call wrote to its inputs, as the runner finds by making them again from their seed
        (runner.Runner._inputs); asked once the call's outputs are the judge's, outside every clock. The runner's
        report, as the trials' ``mutated`` is: defence in depth."""
        self._send({"type": "inputs"})
        msg = self._read(timeout)
        if msg.get("type") == "error":
            raise StageError("runtime_error", str(msg.get("error", ""))[:20000], restart=bool(msg.get("sticky")))
        if msg.get("type") != "inputs":
            raise self._unexpected(msg, "inputs")
        return bool(msg.get("mutated"))

    def burst(self, seeds: list[int], *, timeout: float, target: str = "candidate") -> BurstReply:
        """Forwards back to back, one per seed (runner.Runner._burst), under the judge's clock; the outputs stay
        in the runner, committed, until ``burst_outputs`` draws some."""
        nonce = int.from_bytes(os.urandom(7), "little")
        t0 = time.perf_counter()
        self._send({"type": "burst", "seeds": list(seeds), "target": target, "nonce": nonce,
                    "digest": "device" if self.device_digest else "host"})
        msg = self._read(timeout)
        envelope = (time.perf_counter() - t0) * 1e3
        if msg.get("type") == "error":
            raise StageError("runtime_error", str(msg.get("error", ""))[:20000], restart=bool(msg.get("sticky")))
        if msg.get("type") != "burst_done":
            raise self._unexpected(msg, "burst_done")
        events, commitments = msg.get("event_ms"), msg.get("commitments")
        if (not isinstance(events, list) or not isinstance(commitments, list) or len(events) != len(seeds)
                or len(commitments) != len(seeds) or not isinstance(msg.get("outputs"), list)):
            raise StageError("incorrect", "the runner's burst reply is malformed", flags=("tampering",))
        return BurstReply(seeds=list(seeds), envelope_ms=envelope, event_ms=[finite_ms(e) for e in events],
                          commitments=commitments, nonce=nonce, structure=str(msg.get("structure")),
                          meta=msg["outputs"])

    def burst_outputs(self, reply: BurstReply, want: list[int], timeout: float, byte_limit: int) -> list[Any]:
        """The outputs of the burst's forwards ``want`` (drawn by the judge after its "done"), each checked
        against the commitment "done" carried: a forward computed only now would not match it. ``byte_limit``
        bounds one forward's outputs, as for a call."""
        per = len(reply.meta)
        try:
            nbytes = expected_nbytes(reply.meta, byte_limit) * len(want)
        except WireError as exc:
            raise StageError("incorrect", f"the candidate's burst outputs could not be read: {exc}") from None
        self._send({"type": "burst_outputs", "want": want})
        head = self._read(transfer_wait(nbytes, timeout))
        if head.get("type") == "error":
            raise StageError("incorrect", "the runner did not send the burst outputs asked for: "
                             + str(head.get("error", ""))[:2000], flags=("tampering",))
        if head.get("type") != "burst_outputs":
            raise self._unexpected(head, "burst_outputs")
        try:
            if head.get("outputs") != reply.meta * len(want):
                raise WireError("the burst outputs sent are not the shapes its forwards reported")
            data, into = self._payload(head, nbytes, timeout, reuse=False)
            tensors = decode(head["outputs"], data, self.torch_device)
        except WireError as exc:
            raise StageError("incorrect", f"the candidate's burst outputs could not be read: {exc}") from None
        except ProtocolError as exc:
            raise self._died(str(exc)) from None
        del data, into
        outputs = []
        for i, k in enumerate(want):
            flat = tensors[i * per:(i + 1) * per]
            if commitment(flat, reply.nonce + k, self.device_digest) != reply.commitments[k]:
                raise StageError("incorrect", "an output of the burst is not the one the runner had committed to "
                                 "when it reported the burst done: its time did not cover computing it",
                                 flags=("tampering",))
            outputs.append(flat[0] if reply.structure == "tensor" and per == 1 else tuple(flat))
        return outputs

    def _window(self, before: int | None, marks: Callable[[], int | None]) -> tuple[int, int] | None:
        """The probe's window around a call, closed now that its outputs are the judge's (and the judge's own
        copies of them done on the device)."""
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)
        after = marks()
        return (before, after) if before is not None and after is not None else None

    @staticmethod
    def _reply(msg: dict[str, Any], envelope: float, outputs: Any, window: tuple[int, int] | None = None,
               cpu: cpu_clock.Window | None = None) -> CallReply:
        return CallReply(outputs=outputs, event_ms=finite_ms(msg.get("event_ms")),
                         host_ms=finite_ms(msg.get("host_ms")), envelope_ms=envelope,
                         launches=launch_count(msg.get("launches")),
                         backends=[b for b in msg.get("backends") if b in BACKENDS] if isinstance(
                             msg.get("backends"), list) else [],
                         mutated=bool(msg.get("mutated")), numerics_changed=bool(msg.get("numerics_changed")),
                         dataflow=dataflow_report(msg.get("dataflow")), window=window,
                         shield_ms=finite_ms(msg.get("shield_ms")), cpu=cpu,
                         form=msg["form"][:FORM_MAX_CHARS] if isinstance(msg.get("form"), str) else "")

    def _sampled(self, msg: dict[str, Any], nonce: int, chunk_bytes: int, timeout: float,
                 defer: bool = False) -> SampledOutputs | DrawnChunks:
        """After "done": draw chunks, ask for them, check each against the hash "done" carried; with ``defer``,
        copied to the host now and checked when DrawnChunks.verify is called."""
        meta = msg["outputs"]
        try:
            check_hash_lists(meta, msg.get("chunk_hashes"), chunk_bytes)
        except ValueError as exc:
            raise WireError(str(exc)) from None
        want = pick_chunks(meta, chunk_bytes)
        self._send({"type": "chunks", "want": want, "chunk_bytes": chunk_bytes})
        head = self._read(transfer_wait(len(want) * chunk_bytes, timeout))
        if head.get("type") == "error":
            raise StageError("incorrect", "the runner did not send the chunks asked for: "
                             + str(head.get("error", ""))[:2000], flags=("tampering",))
        if head.get("type") != "chunk_bytes":
            raise self._unexpected(head, "chunk_bytes")
        sizes = [min(chunk_bytes, meta[k]["nbytes"] - j * chunk_bytes) for k, j in want]
        described = head.get("outputs")
        if (not isinstance(described, list) or not all(isinstance(d, dict) for d in described)
                or [d.get("nbytes") for d in described] != sizes
                or any(d.get("dtype") != "uint8" for d in described)):
            raise WireError("the runner's chunks are not the sizes asked for")
        raw, _ = self._payload(head, expected_nbytes(described, sum(sizes)), timeout, reuse=False)
        # decoded (copied) first, to the device of the output each chunk is of; then hashed from those copies
        on = [meta[k].get("device") for k, _ in want]
        pieces = decode([{**d, "device": None if defer else where} for d, where in zip(described, on, strict=True)],
                        raw, self.torch_device)
        if defer:
            return DrawnChunks(lambda: self._checked_chunks(
                msg, nonce, chunk_bytes, want, [p.to(self.torch_device) if where == "cuda" else p
                                                for p, where in zip(pieces, on, strict=True)]))
        return self._checked_chunks(msg, nonce, chunk_bytes, want, pieces)

    def _checked_chunks(self, msg: dict[str, Any], nonce: int, chunk_bytes: int, want: list[tuple[int, int]],
                        pieces: list[torch.Tensor]) -> SampledOutputs:
        meta = msg["outputs"]
        chunks = []
        for (k, j), piece in zip(want, pieces, strict=True):
            if chunk_hash(piece, nonce, k, j, chunk_bytes, self.device_digest) != msg["chunk_hashes"][k][j]:
                raise StageError("incorrect", "a chunk the runner sent is not the one it had hashed when it reported "
                                 "the call done: its time did not cover computing it", flags=("tampering",))
            dtype = WIRE_DTYPES[meta[k]["dtype"]]
            chunks.append((k, j * chunk_bytes // dtype.itemsize, piece.view(dtype)))
        return SampledOutputs(meta=meta, chunks=chunks)

    def _payload(self, msg: dict[str, Any], nbytes: int, timeout: float, reuse: bool) -> tuple[Any, Any]:
        """The ``nbytes`` announced by ``msg`` (outputs or drawn chunks): from the memfd where the runner says
        it put them there, else from the pipe (a kept buffer with ``reuse``). Returns the data and the buffer
        to release after decoding."""
        if msg.get("payload_bytes") != nbytes:
            raise WireError("the announced payload does not match the outputs described")
        data = self._shared_payload(nbytes, timeout) if msg.get("payload_via") in ("shm", "device") else None
        if data is not None:
            return data, None
        # through the pipe: from the start, or after the shared copy failed in the runner
        if not reuse:
            return self.reader.read_bytes(nbytes, transfer_wait(nbytes, timeout)), None
        data, into = self._receive_buffer(nbytes)
        self.reader.read_bytes(nbytes, transfer_wait(nbytes, timeout), into=into)
        return data, into

    def _shared_payload(self, nbytes: int, timeout: float) -> torch.Tensor | None:
        """The bytes the runner copied into the shared memfd after "done", once it says they are there; None
        when it says they follow through the pipe instead (its copy into the memfd failed)."""
        t_wait = time.perf_counter()
        msg = self._read(transfer_wait(nbytes, timeout))
        if msg.get("type") != "payload" or msg.get("bytes") != nbytes:
            raise WireError(f"expected the outputs' {nbytes:,} bytes in shared memory, got {str(msg)[:200]}")
        if msg.get("via") == "pipe":
            return None
        self._note_payload("runner_copy", t_wait)
        if msg.get("via") == "device":  # the judge's device buffer: read where it lies (decode clones it)
            if self.device_payload is None:
                raise WireError("the runner sent its outputs through a device buffer it was never given")
            try:
                view = self.device_payload.bytes(nbytes)
            except ValueError as exc:
                raise WireError(str(exc)) from None
            self.device_payloads += 1
            return view
        if self.payload is None:
            raise WireError("the runner sent its outputs through shared memory it was never given")
        t_map = time.perf_counter()
        try:
            view = self.payload.view(nbytes)
        except (ValueError, OSError) as exc:  # a size it did not write, a seal that forbids mapping: the runner's
            raise WireError(str(exc)) from None
        self._note_payload("judge_map", t_map)
        self.shm_payloads += 1
        return view

    def _note_payload(self, part: str, since: float) -> None:
        seconds = self.payload_seconds[part]
        if len(seconds) < PAYLOAD_NOTES:
            seconds.append(round(time.perf_counter() - since, 4))

    def _receive_buffer(self, nbytes: int) -> tuple[torch.Tensor, memoryview]:
        """A buffer for the payload. Large pageable ones are kept for the next call of the same size (every
        timed call of a problem returns the same bytes): a fresh 4 GB buffer pays a page fault per 4 KB."""
        if nbytes <= PINNED_RECEIVE_BYTES:
            return receive_buffer(nbytes, self.torch_device)
        if self._large_buffer is None or self._large_buffer[0].numel() != nbytes:
            self._large_buffer = None
            self._large_buffer = receive_buffer(nbytes, self.torch_device)
        return self._large_buffer

    @contextlib.contextmanager
    def frozen(self, settle: float = 2.0, refuse: bool = True, asleep_is_stopped: bool = True) -> Iterator[bool]:
        """The runner and everything it started stopped (SIGSTOP) for the duration: nothing of the candidate
        competes for the CPU with the baseline or with a calibration (a candidate that left busy children
        running during the spare's calibration widened the envelope's tolerance 5-fold and hid 3 ms a call).
        Work it queued on the GPU before is not stopped: see docs/integrity.md.

        Yields only once every thread of the tree is stopped: a thread inside a long system call runs on
        until it returns (round 4: children looping on MAP_POPULATE of 16 GB stayed busy through the spare's
        calibration, tolerance 8-13 ms instead of ~2). A tree with a thread still running after ``settle``
        seconds (nothing honest spends seconds in one system call while its runner waits for a command) is
        the candidate's verdict, a StageError: nothing is measured beside it. With ``refuse=False`` the
        context yields False instead. ``asleep_is_stopped=False``: threads asleep in a system call must stop
        too (before the judge reads files the runner may be writing). A tree that ran while held (it used CPU
        or started a process: sandbox.ran_between) is the candidate's StageError when the context ends, with
        ``refuse=False`` too: nothing measured or copied meanwhile may be kept."""
        procs = self.stop()
        try:
            still = not sandbox.unstopped(procs, settle, asleep_is_stopped)
            if not still and refuse:
                raise StageError("runtime_error", NOT_STOPPED)
            before = sandbox.tree_usage(self.pid)
            yield still
            # Seen stopped once is not stopped throughout: a process can have itself resumed (a timer that sends
            # SIGCONT) and sleep whenever the judge looks. What it used meanwhile, or a process it started, shows.
            if still and sandbox.ran_between(before, sandbox.tree_usage(self.pid)):
                raise StageError("runtime_error", RAN_WHILE_STOPPED)
        finally:
            self.resume()

    def stop(self) -> list[int]:
        """SIGSTOP the tree (sandbox.freeze_tree) for one holder; the pids stopped. Each ``stop`` needs a ``resume``:
        the tree runs again only once every holder has resumed it."""
        with self._stop_lock:
            procs = sandbox.freeze_tree(self.pid)
            self._stops += 1
            self._stopped.update(procs)
            return procs

    def restop(self) -> None:
        """SIGSTOP the tree again for the holder that already stopped it: processes it gained since (a child forked
        as the first stop landed) are stopped and resumed with the rest."""
        with self._stop_lock:
            if self._stops:
                self._stopped.update(sandbox.freeze_tree(self.pid))

    def resume(self) -> None:
        with self._stop_lock:
            self._stops -= 1
            if self._stops <= 0:
                self._stops = 0
                sandbox.thaw(sorted(self._stopped))
                self._stopped.clear()

    def _drop_device_payload(self) -> None:
        if self.device_payload is not None:
            self.device_payload.close()
            self.device_payload = None

    def _drop_payload(self, later: bool = False) -> None:
        """Close the memfd (also where the runner's start failed: it may still have been forked with it);
        ``later``: its pages freed on a thread of their own (payload.free_later), off the device hold."""
        if self.payload is not None:
            if later:
                payload.free_later(self.payload)
            else:
                self.payload.close()
                os.close(self.payload.fd)
            self.payload = None

    def kill(self, keep: Callable[[Path], None] | None = None) -> bool:
        """End the runner and every process of its tree, and remove its scratch folder; ``keep`` is called
        with the scratch folder once the whole tree is gone (nothing of the candidate can change it then) and
        before the folder is removed. Whether the whole tree was gone within 10 s."""
        began = time.perf_counter()
        self._large_buffer = None
        # Every process of the tree, not only the runner, is gone before the next candidate is judged: a SIGKILL
        # lands when a process leaves the kernel, and children inside a long system call (MAP_POPULATE: seconds)
        # ran on beside the next candidate's calibration (round 4: its tolerance 11 ms instead of ~2).
        tree = [self.pid, *(sandbox.descendants(self.pid) or [])]
        if self.proc is not None:
            sandbox.kill_and_wait(self.proc)
            streams = [self.proc.stdin, self.proc.stdout, self.proc.stderr]
        else:
            sandbox.kill_tree(self.pid)
            deadline = time.monotonic() + 10
            while _running(self.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            streams = [self._stderr]
            for fd in self._fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._fds = []
        gone = sandbox.wait_gone(tree, timeout=10.0)
        waited = time.perf_counter()
        self._drop_payload(later=True)
        self._drop_device_payload()
        dropped = time.perf_counter()
        if keep is not None and gone:
            try:
                keep(self.scratch)
            except Exception:  # noqa: BLE001 - a copy that fails keeps nothing; the runner still ends
                pass
        kept = time.perf_counter()
        for stream in streams:
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        remove_tree(self.scratch)  # shaped by the candidate: any depth (file_tree.py)
        reap_orphans()
        # where the kill's time goes, all of it inside the job's device hold (job.py: stage_seconds kill_*)
        self.kill_seconds = {"wait": waited - began, "payload": dropped - waited, "keep": kept - dropped,
                             "scratch": time.perf_counter() - kept}
        return gone


def _running(pid: int) -> bool:
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - gone
        return False


def reap_orphans() -> None:
    """Collect exited processes re-parented to this one: the judge is the first process of its PID
    namespace, so a runner whose ``unshare`` parent was killed becomes its child. Only zombies are
    waited for, by pid, so the spare's own Popen keeps its exit status."""
    try:
        import psutil

        for child in psutil.Process().children():
            if child.status() == psutil.STATUS_ZOMBIE:
                try:
                    os.waitpid(child.pid, os.WNOHANG)
                except ChildProcessError:
                    pass
    except Exception:  # noqa: BLE001 - psutil missing or a process vanished mid-walk
        pass
