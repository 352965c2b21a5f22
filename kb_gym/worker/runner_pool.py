"""The judge's pool of runners: the zygote that forks them, and pristine spares always on hand.

``RunnerPool.take()`` hands out the oldest spare (forked by the zygote in milliseconds, or started as a
fresh interpreter where forking is not possible) and forks the next one at once, so start-up is hidden
behind the evaluation; ``pristine()`` lends that spare for measurements that must run where no
candidate ever ran (the envelope's calibration).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kb_gym import sandbox
from kb_gym.worker import build_cache, device_payload, payload
from kb_gym.worker.loading import StageError
from kb_gym.worker.protocol import MessageReader, ProtocolError
from kb_gym.worker.runner_client import STARTUP_TIMEOUT, RunnerProcess
from kb_gym.worker.runner_start import READS_BREAK_CUDA, runner_env


def _zygote_env(device: str, home: Path) -> dict[str, str]:
    env = runner_env(device, home)
    # torch.cuda.is_available() through NVML: a driver initialised here would be unusable in every child.
    env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    return env


class Zygote:
    """The judge's handle on its zygote (zygote.py): started once, forks each runner."""

    def __init__(self, device: str, scratch_root: Path) -> None:
        from kb_gym.workers import LogDrain

        home = Path(tempfile.mkdtemp(prefix="zygote_", dir=scratch_root))
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, "-P", "-m", "kb_gym.worker.zygote", "--fd", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=_zygote_env(device, home), start_new_session=True,
                                     cwd=str(home))
        theirs.close()
        self.sock = ours
        self.reader = MessageReader(ours.fileno())
        self.drain = LogDrain(self.proc.stderr)
        self.drain.start()
        self.ready = False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        if self.ready:
            return
        try:
            msg = self.reader.read(timeout)
        except ProtocolError:
            msg = None
        if msg is None or msg.get("type") != "ready":
            self.close()
            raise StageError("crash", f"the runner zygote failed to start: {self.drain.text_since(0)[-1500:]}")
        self.ready = True

    def spawn(self, device: str, scratch: str, env: dict[str, str], namespaces: bool, fds: list[int]) -> int:
        self.wait_ready()
        fixed = build_cache.mount_point(Path(scratch))
        fixed.mkdir(parents=True, exist_ok=True)
        request = {"device": device, "scratch": scratch, "env": env, "namespaces": namespaces,
                   "fixed_scratch": str(fixed), "fds": len(fds)}
        try:
            socket.send_fds(self.sock, [json.dumps(request).encode() + b"\n"], fds)
            reply = self.reader.read(30.0)
        except (OSError, ProtocolError) as exc:
            self.close()
            raise StageError("crash", f"the runner zygote is gone ({exc})") from None
        if not reply or reply.get("type") != "spawned":
            self.close()
            raise StageError("crash", f"the runner zygote did not fork a runner: {reply!r}")
        return int(reply["pid"])

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        sandbox.kill_and_wait(self.proc)


# Spares kept started. The envelope's calibration needs a pristine runner right before the timing loop, and a
# runner forked at the job's start is still starting there whenever loading and the trials take less than its
# start-up (the H200: CUDA's context in a fresh fork, 0.3-0.85 s waited a candidate in docs/benchmarks.md 0i). With
# two, the one that calibrates was started a whole job earlier (each job still starts one runner), but the one
# started at the job's start may still be starting while the loop runs, taking a core from the host side of the
# timed calls (with two, a 2-core CI run failed a test whose honest candidate followed a quickly refused one, most
# likely so; session 20). So one is the default; two is for a machine with cores to spare, once measured there.
def _spares_wanted() -> int:
    value = os.environ.get("KB_GYM_SPARES", "1")
    return max(1, int(value)) if value.strip().isdigit() else 1


SPARES = _spares_wanted()


class RunnerPool:
    """Pristine spares per judge, oldest first: ``take()`` hands out the oldest and starts another at once.

    Spares are forked by the judge's zygote; where it cannot start (KB_GYM_ZYGOTE=0 turns it off) each
    runner is a fresh interpreter instead. ``pristine()`` lends the oldest, the one ``take()`` hands out
    next: a spare that only measured the reference is still pristine."""

    def __init__(self, device: str, scratch_root: Path, spares: int = SPARES) -> None:
        self.device = device
        self.scratch_root = scratch_root
        self.depth = max(1, spares)
        self.spares: list[RunnerProcess] = []
        self.started = 0
        self.zygote: Zygote | None = None
        self.zygote_failed = os.environ.get("KB_GYM_ZYGOTE", "1") == "0"
        self.zygote_error = ""
        # the output bytes the next spares' memfds are mapped for at their start (payload.PREMAP_MIN_BYTES); the
        # judge sets it per job from its problem's earlier evaluations, 0 where it knows none
        self.payload_hint = 0
        self.device_buffers_fail = False  # a spare started for the hint got none: the memfd from then on

    def _zygote(self) -> Zygote | None:
        if self.zygote_failed:
            return None
        if self.zygote is not None and not self.zygote.alive:
            self.zygote.close()
            self.zygote = None
        if self.zygote is None:
            self.zygote = Zygote(self.device, self.scratch_root)
        try:
            self.zygote.wait_ready()
        except StageError as exc:
            self._give_up_zygote(exc.message)
        return self.zygote

    def _give_up_zygote(self, why: str) -> None:
        """Forked runners do not start here: fresh interpreters from now on, and the reason kept."""
        self.zygote_failed, self.zygote_error = True, why[:1000]
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

    def _start(self) -> RunnerProcess:
        self.started += 1
        try:
            return RunnerProcess(self.device, self.scratch_root, self._zygote(), self.payload_hint)
        except StageError as exc:  # the zygote died between its check and the fork
            self._give_up_zygote(exc.message)
            return RunnerProcess(self.device, self.scratch_root, payload_bytes=self.payload_hint)

    def prestart(self) -> None:
        """Dead spares out, and as many started as the pool keeps."""
        for dead in [s for s in self.spares if not s.alive]:
            dead.kill()
            self.spares.remove(dead)
        while len(self.spares) < self.depth:
            self.spares.append(self._start())

    def _refit(self) -> None:
        """The oldest spare replaced where the hint's outputs would cross its memfd though it could have had the
        judge's device buffer (device_payload.py): a spare is given its buffer at birth only, and it was started
        during an earlier job, most often of another problem. Out of the device lock, so only the worker's time; in
        the H200 batch half of a 6.4 GB problem's later evaluations went through the memfd for want of it (0v)."""
        want = payload.premap_size(self.payload_hint)
        if self.device_buffers_fail or not device_payload.wanted(self.device, want):
            return
        buffer = self.spares[0].device_payload
        if buffer is not None and buffer.size >= want:
            return
        self.spares.pop(0).kill()
        self.spares.insert(0, self._start())
        if self.spares[0].device_payload is None:
            self.device_buffers_fail = True  # the driver would not: no more restarts for nothing

    def take(self) -> RunnerProcess:
        self.prestart()
        self._refit()
        runner = self.spares.pop(0)
        try:
            runner.wait_ready()
        except StageError as exc:
            if runner.forked:
                self._give_up_zygote(exc.message)
            elif self.device not in READS_BREAK_CUDA:
                raise
            # again, differently (the failed one killed itself: wait_ready)
            runner = RunnerProcess(self.device, self.scratch_root, self._zygote())
            self.started += 1
            runner.wait_ready()
        self.prestart()
        return runner

    def discard_spare(self) -> None:
        """The oldest spare killed (it failed, or a measurement wants another process)."""
        if self.spares:
            self.spares.pop(0).kill()

    def pristine(self, timeout: float = STARTUP_TIMEOUT) -> RunnerProcess | None:
        """The oldest spare, up (waiting at most ``timeout`` more for it) and never given a candidate: for
        measurements that must run where no candidate ran. None when it failed to start."""
        try:
            self.prestart()
            spare = self.spares[0]
            spare.wait_ready(timeout=max(1.0, time.monotonic() - spare.started + timeout))
        except StageError:
            self.discard_spare()  # the next take() starts another
            return None
        return spare

    def close(self) -> None:
        while self.spares:
            self.spares.pop().kill()
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
