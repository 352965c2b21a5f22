"""A clock outside the candidate's process: a pristine probe process that sees another context's GPU time.

Without MPS a GPU runs one CUDA context at a time. The probe keeps one small kernel spinning in its own context
(probe_kernels.spin) that records every gap in its readings of ``%globaltimer``: time its context was off the GPU,
which is time another context held it. Around a timed call the judge takes a mark before sending the seed and one
when the runner's "done" arrives (probe_kernels.stamp, from the probe's second stream); the gaps between the marks
are the GPU time of every other context in that window: the runner's, when the judge keeps its own context idle
there. A runner can make that longer (more work), never shorter, whatever it reports of its own events. Measured on
the H200 (docs/benchmarks.md 0v, scripts/gpu_probe_clock.py): for calls of 5 us to 1 ms one gap equal to the
worker's own bracket, and the worker's events no slower beside the probe; a call longer than a time slice (~2-3 ms)
shares the GPU with the probe (slower, with ~0.2 ms a switch), so the judge runs it only around short calls
(probe_check.py) and only while it holds the device.

    python -m kb_gym.worker.probe_clock cuda:0     # started by the judge (ProbeClock); speaks JSON lines

The probe runs no candidate code and reads nothing a runner wrote: it is started by the judge, from the judge's
environment, and is killed with it (its parent's death, or its stdin closing).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

MAX_GAPS = 1 << 16  # per probe pass: a pass is a few dozen calls of a few gaps each
THRESHOLD_NS = 1000  # a jump between two readings longer than this is another context's time (a step is ~0.1 us)
MAX_PASS_S = 30.0  # the spinning kernel stops by itself after this, whatever its host side does
START_TIMEOUT_S = 120.0  # import torch and Triton, a CUDA context, the two kernels compiled (cached after)
REPLY_TIMEOUT_S = 10.0


class ProbeError(RuntimeError):
    """The probe did not answer as it should: the check it serves is skipped and says why."""


class PassVoid(RuntimeError):
    """What the calls of a pass did left the probe nothing to read (probe_check: unverified, not skipped)."""


def busy_in(gaps: list[tuple[int, int]], t0: int, t1: int) -> tuple[float, int]:
    """Milliseconds of the gaps inside the window [t0, t1] (``%globaltimer`` nanoseconds), clipped to it, and how
    many gaps reach into it."""
    inside = [(max(a, t0), min(b, t1)) for a, b in gaps if b > t0 and a < t1]
    return sum(b - a for a, b in inside) / 1e6, len(inside)


class ProbeClock:
    """The judge's handle on its probe process (one per judge, started with it on a GPU). Every method raises
    ProbeError where the probe failed; ``note`` then says why, and the probe is not used again."""

    def __init__(self, device: str, log_path: Path) -> None:
        self.note = ""
        self.running = False
        self._log = open(log_path, "ab")  # noqa: SIM115 - the probe's stderr, for as long as it lives
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-P", "-m", "kb_gym.worker.probe_clock", device], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, env=env)
        self._ready = False

    @property
    def usable(self) -> bool:
        return self.proc is not None and not self.note

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> bool:
        """Whether the probe has started (its kernels compiled and tried); False with ``note`` set otherwise."""
        if self._ready:
            return True
        if not self.usable:
            return False
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            return False  # still starting: asked again next time, never killed for being slow
        try:
            reply = self._read(1.0)
        except ProbeError:
            return False
        if reply.get("type") != "ready":
            self._fail(f"the probe did not start: {reply.get('error') or reply}")
            return False
        self._ready = True
        return True

    def start(self) -> None:
        """Start the spinning kernel: from here on the GPU time-slices between the probe and any other context."""
        self._ask({"type": "start"}, "started")
        self.running = True

    def mark(self) -> int:
        """``%globaltimer`` now, as the probe's context reads it (a few tens of microseconds, round trip)."""
        return int(self._ask({"type": "mark"}, "mark")["t"])

    def stop(self) -> list[tuple[int, int]]:
        """Stop the spinning kernel; the gaps it recorded, as (last reading before, first reading after). A pass
        whose gaps overflowed the record, or that outlived the kernel (MAX_PASS_S), raises PassVoid: the calls in
        it did that (a flood of tiny launches, a call that slept past the kernel's end), not the probe."""
        self.running = False
        reply = self._ask({"type": "stop"}, "stopped")
        if reply.get("overflow"):
            raise PassVoid(f"more than {MAX_GAPS} gaps in one pass")
        if reply.get("expired"):
            raise PassVoid(f"the pass outlived the probe's kernel ({MAX_PASS_S:.0f} s)")
        try:
            return [(int(a), int(b)) for a, b in reply["gaps"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise self._fail(f"the probe's gaps are malformed: {exc}") from None

    @contextlib.contextmanager
    def spinning(self):
        """The probe spinning for the block; stopped on the way out whatever happens (gaps dropped on error)."""
        self.start()
        try:
            yield self
        finally:
            if self.running and self.usable:  # an error on the way: what the pass saw is dropped, the error stands
                with contextlib.suppress(ProbeError, PassVoid):
                    self.stop()

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._log.close()

    def _ask(self, msg: dict[str, Any], want: str) -> dict[str, Any]:
        if not self.usable or not self.wait_ready():
            raise ProbeError(self.note or "the probe is not running")
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as exc:
            raise self._fail(f"the probe is gone: {exc}") from None
        reply = self._read(REPLY_TIMEOUT_S)
        if reply.get("type") != want:
            raise self._fail(f"the probe answered {reply!r} to {msg['type']}")
        return reply

    def _read(self, timeout: float) -> dict[str, Any]:
        out = self.proc.stdout
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            raise self._fail(f"the probe did not answer within {timeout:.0f} s")
        line = out.readline()
        if not line:
            raise self._fail(f"the probe exited (status {self.proc.poll()})")
        try:
            reply = json.loads(line)
        except ValueError:
            raise self._fail(f"the probe wrote {line[:200]!r}") from None
        return reply if isinstance(reply, dict) else {}

    def _fail(self, why: str) -> ProbeError:
        self.note = self.note or why
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        return ProbeError(self.note)


# --- the probe process ---------------------------------------------------------------------------------------------

def _serve(device_name: str, proto: IO[str]) -> None:
    import torch

    from kb_gym.worker import probe_kernels as k

    device = torch.device(device_name)
    torch.cuda.set_device(device)
    gaps = torch.zeros(2 * MAX_GAPS, dtype=torch.int64, device=device)
    count = torch.zeros(2, dtype=torch.int32, device=device)  # gaps seen, and whether the kernel expired
    stop = torch.ones(1, dtype=torch.int32, device=device)
    stamp = torch.zeros(1, dtype=torch.int64, device=device)
    host = torch.zeros(1, dtype=torch.int64).pin_memory()
    # Non-blocking streams (PyTorch's pool): nothing queued on the legacy default stream waits for the spinning kernel.
    spin_stream, side = torch.cuda.Stream(device), torch.cuda.Stream(device)

    def now() -> int:
        with torch.cuda.stream(side):
            k.stamp[(1,)](stamp, num_warps=1)
            host.copy_(stamp, non_blocking=True)
        side.synchronize()
        return int(host.item())

    def launch(until: int) -> None:
        with torch.cuda.stream(spin_stream):
            k.spin[(1,)](gaps, count, stop, THRESHOLD_NS, MAX_GAPS, until, READINGS=k.READINGS_PER_LOOK, num_warps=1)

    def halt() -> dict[str, Any]:
        with torch.cuda.stream(side):
            stop.fill_(1)
        side.synchronize()
        spin_stream.synchronize()
        with torch.cuda.stream(side):
            n, expired = count.tolist()
            kept = gaps[: 2 * min(n, MAX_GAPS)].view(-1, 2).cpu().tolist()
        return {"type": "stopped", "gaps": kept, "overflow": n > MAX_GAPS, "expired": bool(expired)}

    # Both kernels compiled and run once before "ready" (the spin kernel exits at once: stop is set), so that no
    # compile or module load happens while a pass runs.
    launch(0)
    t = now()
    spin_stream.synchronize()
    torch.cuda.synchronize(device)
    _reply(proto, {"type": "ready", "t": t, "pid": os.getpid()})
    for line in sys.stdin:
        try:
            kind = json.loads(line).get("type")
        except (ValueError, AttributeError):
            kind = None
        if kind == "mark":
            _reply(proto, {"type": "mark", "t": now()})
        elif kind == "start":
            with torch.cuda.stream(side):
                stop.zero_()
                count.zero_()
            side.synchronize()
            launch(now() + int(MAX_PASS_S * 1e9))
            _reply(proto, {"type": "started"})
        elif kind == "stop":
            _reply(proto, halt())
        else:
            _reply(proto, {"type": "error", "error": f"unknown request {line[:100]!r}"})


def _reply(proto: IO[str], msg: dict[str, Any]) -> None:
    proto.write(json.dumps(msg) + "\n")
    proto.flush()


def main() -> None:
    with contextlib.suppress(Exception):  # the judge killed: the probe goes too (Linux only; stdin's end otherwise)
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the libraries print goes to the log, never into the protocol
    try:
        _serve(sys.argv[1], proto)
    except Exception as exc:  # noqa: BLE001 - said to the judge, which then does without the probe
        _reply(proto, {"type": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]})
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
