"""Messages between the evaluator and a worker: one JSON object per line over a pipe.

JSON rather than pickle on purpose: the worker runs untrusted code, and unpickling anything it
wrote would hand that code the evaluator process.
"""

from __future__ import annotations

import json
import math
import os
import select
import time
from typing import Any

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# The start-up message of a GPU worker whose CUDA fails under the Landlock ruleset (KB_GYM_LANDLOCK=auto).
LANDLOCK_BREAKS_CUDA = "landlock_breaks_cuda"
# Where a memfd payload's time goes, as a judge reports it per runner (result.worker["payload_seconds"]): the runner's
# copy in after "done", the judge's mapping, the judge's copy out and hash; at most PAYLOAD_NOTES calls each.
PAYLOAD_PARTS = ("runner_copy", "judge_map", "copy_out")
PAYLOAD_NOTES = 64


class ProtocolError(RuntimeError):
    """The other side closed the pipe, or wrote something that is not a message."""


def _finite(obj: Any) -> Any:
    # JSON has no inf/nan; a speedup of inf must not break the stream.
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(_finite(message), default=str) + "\n").encode()


def write_message(fd: int, message: dict[str, Any]) -> None:
    data = encode(message)
    while data:
        written = os.write(fd, data)
        data = data[written:]


class MessageReader:
    """Reads newline-framed JSON messages from a file descriptor with a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""

    def read(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message, or None when ``timeout`` seconds pass first. Raises ProtocolError on EOF."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise ProtocolError("worker closed its pipe")
            self._buffer += chunk
            if len(self._buffer) > MAX_MESSAGE_BYTES:
                raise ProtocolError("worker wrote an oversized message")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"worker wrote a malformed message: {exc}") from None
        if not isinstance(message, dict):
            raise ProtocolError("worker wrote a non-object message")
        return message

    def read_bytes(self, nbytes: int, timeout: float | None, into: memoryview | None = None) -> memoryview:
        """The ``nbytes`` raw bytes that follow a message (tensors: a description, then their bytes), read
        into ``into`` where given (page-locked memory the GPU copies from directly), else a new buffer."""
        view = memoryview(bytearray(nbytes)) if into is None else into.cast("B")[:nbytes]
        if len(view) != nbytes:
            raise ValueError(f"a buffer of {len(view)} bytes cannot take {nbytes}")
        got = min(nbytes, len(self._buffer))
        view[:got] = self._buffer[:got]
        self._buffer = self._buffer[got:]
        deadline = None if timeout is None else time.monotonic() + timeout
        while got < nbytes:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                raise ProtocolError(f"payload stalled after {got} of {nbytes} bytes")
            n = os.readv(self.fd, [view[got:got + (1 << 24)]])
            if n == 0:
                raise ProtocolError("the other side closed its pipe mid-payload")
            got += n
        return view

