"""Timed outputs too large to copy whole on every call: checked on chunks the judge picks after "done".

A timed call of a GPU-sized problem returns hundreds of MB to GBs; copied through the pipe every call, a
4 GB output cost seconds a call (170 s for one evaluation on the H200). For those, the runner's "done" carries
one nonce-keyed digest per 1 MB chunk of each output instead of the bytes (``chunk_hashes``: BLAKE2b over the
host copy, digest.py; a runner cannot find other bytes with the same digest); only then does the judge
draw which chunks it wants (``os.urandom``) and the runner sends those. The judge checks each chunk against
its hash and its values against the reference's at the same positions. What that keeps:

- "done" still needs the exact output bits (every chunk's hash depends on them), so the judge's clock covers
  computing them, as with the whole-output commitment.
- A timed output wrong anywhere in a fraction f of its chunks passes one call with probability (1 - f)^k for k
  chunks drawn; an output wrong everywhere (a cached or stale answer, zeros) is caught on the first call.
  Correctness trials still compare whole outputs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kb_gym.worker import device_digest
from kb_gym.worker.digest import chunk_digest, chunk_digests
from kb_gym.worker.tensors import host_bytes

CHUNK_BYTES = 1 << 20  # at most; a multiple of every element size, so a chunk holds whole elements
MIN_CHUNK_BYTES = 4096
CHUNKS_PER_CALL = 16
_SYSTEM_RANDOM = random.SystemRandom()


def chunk_size(output_bytes: int) -> int:
    """Chunks of 1 MB, smaller for outputs under 64 MB so that there are at least 64 to draw from."""
    return max(MIN_CHUNK_BYTES, min(CHUNK_BYTES, output_bytes // 64 // 16 * 16))


def chunk_hashes(tensors: list[torch.Tensor], nonce: int, chunk_bytes: int = CHUNK_BYTES,
                 on_device: bool = False) -> list[list[int]]:
    """Per output, one keyed digest per ``chunk_bytes`` of its bytes (the last chunk may be shorter): on its GPU
    where ``on_device`` (device_digest.py, every chunk in the same launches), else of its host bytes (a GPU
    tensor is copied here: best already on the host, ``on_host``)."""
    return [device_digest.tree_digests(t, nonce, k, chunk_bytes) if on_device and device_digest.applies_to(t.device)
            else chunk_digests(host_bytes(t), nonce, k, chunk_bytes) for k, t in enumerate(tensors)]


def chunk_hash(piece: torch.Tensor, nonce: int, k: int, j: int, chunk_bytes: int, on_device: bool = False) -> int:
    """The digest of chunk ``j`` of output ``k`` (``piece``: its bytes, as a tensor), as chunk_hashes computes it."""
    if on_device and device_digest.applies_to(piece.device):
        return device_digest.tree_digests(piece, nonce, k, chunk_bytes, chunk_base=j)[0]
    return chunk_digest(host_bytes(piece), nonce, k, j)


def check_hash_lists(meta: list[dict[str, Any]], hashes: Any, chunk_bytes: int) -> None:
    """The runner's hash lists have one entry per chunk of each described output (raises ValueError)."""
    if not isinstance(hashes, list) or len(hashes) != len(meta):
        raise ValueError("the runner sent chunk hashes for a different number of outputs than it described")
    for item, row in zip(meta, hashes, strict=True):
        expected = -(-item["nbytes"] // chunk_bytes)
        if not isinstance(row, list) or len(row) != expected or not all(isinstance(h, int) for h in row):
            raise ValueError("the runner's chunk hashes do not match the outputs it described")


def pick_chunks(meta: list[dict[str, Any]], chunk_bytes: int, count: int = CHUNKS_PER_CALL) -> list[tuple[int, int]]:
    """``count`` distinct (output, chunk) pairs drawn from the operating system's randomness, one of each output
    first where there are no more outputs than ``count``: drawn from all chunks alike, a small output beside a
    large one (a loss beside a 6 GB tensor: one chunk of 6,000) went unchecked in 99.7% of calls (round 17)."""
    per_output = [-(-item["nbytes"] // chunk_bytes) for item in meta]
    every = [(k, j) for k, n in enumerate(per_output) for j in range(n)]
    if sum(n > 0 for n in per_output) > count:
        return sorted(_SYSTEM_RANDOM.sample(every, min(count, len(every))))
    first = {(k, _SYSTEM_RANDOM.randrange(n)) for k, n in enumerate(per_output) if n}
    rest = [pair for pair in every if pair not in first]
    return sorted(first | set(_SYSTEM_RANDOM.sample(rest, min(count - len(first), len(rest)))))


@dataclass
class SampledOutputs:
    """What the judge holds of a timed call's outputs: their description and the chunks it drew."""

    meta: list[dict[str, Any]]
    chunks: list[tuple[int, int, torch.Tensor]]  # (output, first element, values as a 1-D tensor)


@dataclass
class DrawnChunks:
    """A probe call's drawn chunks, received and copied to the judge's host, not yet checked against their hashes:
    with the probe spinning, each of the judge's own GPU visits waits out the probe's time slice (~2.5 ms on an
    H100: 16 chunks copied to the judge's GPU and hashed there one by one made a call's window ~70 visits, ~0.18 s),
    so the pass checks them once the probe has stopped (probe_check.py). ``verify()``: the SampledOutputs, or
    StageError as a call's check would raise it."""

    verify: Callable[[], SampledOutputs]


def verified(outputs: Any) -> Any:
    """A call's outputs, with DrawnChunks checked now."""
    return outputs.verify() if isinstance(outputs, DrawnChunks) else outputs


def reference_pieces(ref_tensors: list[torch.Tensor], sample: SampledOutputs) -> tuple[list[torch.Tensor], str | None]:
    """The reference's values at the positions of the drawn chunks, or why the outputs cannot match at all
    (a different number, shape or dtype of outputs)."""
    if len(ref_tensors) != len(sample.meta):
        return [], f"forward returned {len(sample.meta)} tensor(s), the reference returns {len(ref_tensors)}"
    for i, (item, ref) in enumerate(zip(sample.meta, ref_tensors, strict=True)):
        label = f"output {i}" if len(ref_tensors) > 1 else "output"
        if tuple(item["shape"]) != tuple(ref.shape):
            return [], f"{label} shape {tuple(item['shape'])} != expected {tuple(ref.shape)}"
        if item["dtype"] != str(ref.dtype).removeprefix("torch."):
            return [], f"{label} dtype {item['dtype']} != expected {ref.dtype}"
    pieces = []
    for k, first, values in sample.chunks:
        pieces.append(ref_tensors[k].reshape(-1)[first:first + values.numel()])
    return pieces, None
