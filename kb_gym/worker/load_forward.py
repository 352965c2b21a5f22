"""One forward of the candidate at the end of its load, outside the device lock (``KB_GYM_LOAD_FORWARD=1``; off by
default until a GPU batch has measured it).

A candidate's first call does work that later calls do not: a new Triton source compiles its kernels (1.4-1.7 s of
the warm-worker Triton rows' correctness stage on an H100, docs/benchmarks.md 1q), and a fresh runner starts cuBLAS's
handle or cuDNN's plans. That first call is the first correctness trial, inside the held device, with the GPU idle
while the host compiles: held time the other workers wait for, and much of what keeps the busy share low. Done at the
end of the load it overlaps other jobs' stages instead, stopped for their measurements as the load is (neighbours.py).

What it is not: a trial. Its inputs come from a seed of the judge's own (``WorkerContext.seed(..., "load_forward")``,
never a trial's or a timed call's), its outputs are dropped in the runner unread, and what it raises is left for the
trials to meet. It runs on a copy of the model (round 37: a lazy layer's weights, or a scale calibrated on the first
batch, would otherwise be one call ahead of the judge's reference in every trial); what it warms is the process's.
Only on a GPU (on the CPU it would be host work beside another job's timing), only where the
problem's output size is known (the evaluator's hint or the meta forward's prediction), and only where the inputs and
outputs together are small (``MAX_BYTES``): outside the lock its memory sits beside another job's.

A request of its own after the load, not part of it: a stop reaches host threads only, and a forward launches its
kernels before it waits for them, so an honest but slow one (a naive matmul kernel, ~0.3 s of GPU work) stopped for
a sibling's measurement between the two ran on past the NVML reading's grace and would be killed. While it runs, a
measurement waits for it instead (``neighbours.PauseWatcher.forward``, at most FORWARD_WAIT_S over the forward; the
runner synchronises before it replies, so its queue is empty when the measurement begins), and
``result.worker["load_forward"]["measurements_waited_s"]`` says what that cost other jobs. Still off by default: no
GPU batch has measured it (docs/benchmarks.md 1q, 1r).
"""

from __future__ import annotations

import os
from typing import Any

import torch

ENV = "KB_GYM_LOAD_FORWARD"  # "1": on a GPU; "force": on the CPU too (the tests: the path without a GPU)
MAX_BYTES = 512 << 20  # inputs and outputs of the forward together, beside another job's memory on the device


def spec(device: torch.device, seed: int, output_bytes: int | None) -> dict[str, Any] | None:
    """What the runner is asked to run after its load (runner.Runner._load_forward), or None where it is not."""
    mode = os.environ.get(ENV, "0")
    if mode not in ("1", "force") or (device.type != "cuda" and mode != "force"):
        return None
    if not output_bytes or output_bytes > MAX_BYTES:
        return None
    return {"seed": int(seed), "output_bytes": int(output_bytes), "max_bytes": MAX_BYTES}


def record(reply: Any) -> dict[str, Any] | None:
    """The runner's account of it (the candidate's process: a record, never trusted for a verdict)."""
    if not isinstance(reply, dict):
        return None
    seconds = reply.get("seconds")
    return {"ran": reply.get("ran") is True, "why": str(reply.get("why", ""))[:200],
            "seconds": float(seconds) if isinstance(seconds, (int, float)) else None}
