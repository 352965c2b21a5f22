"""Keyed BLAKE2b digests of output bytes: what a runner commits to with "done" and the judge checks after.

The commitment (and each spot-checked chunk's hash) must bind the exact bytes: a runner that reports "done"
before its outputs exist, then computes them while they are copied out, must not find other bytes within the
tolerance that give the digest it sent. A weighted sum of the output's words mod 2^63 (the first design) is
linear: our round-3 red team nudged the low bits of 6-10 values per chunk (a 6-dimensional lattice, solved
in the runner in milliseconds) so that the real answer, computed after "done", hashed to what "done" had
committed for the input itself (tests/adversarial/test_redteam_round3.py). Any sum of per-word values falls
to the same kind of attack (Wagner's k-list algorithm) when every word has hundreds of values inside the
tolerance. BLAKE2b, keyed by the call's nonce, output and chunk, has no such structure.

Outputs are hashed on the host, in 8 MB pieces on threads (hashlib releases the GIL), the pieces' digests
hashed again: a tree whose root binds every byte, its length and position.

Outputs that live on a GPU are hashed there instead when the judge has checked the device kernel
(device_digest.py: the same idea, BLAKE2s in tree mode): no host copy before "done", and milliseconds
instead of tens of them for hundreds of MB. This module is the host path: CPU outputs, and GPUs where the
kernel is not available.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor

PIECE_BYTES = 8 << 20
MASK = (1 << 63) - 1  # digests travel as JSON integers below 2^63
THREADS = max(1, min(16, os.cpu_count() or 1))  # ~1 GB/s of BLAKE2b a core


def _key(nonce: int, k: int, chunk: int = -1) -> bytes:
    return (b"kb" + (nonce & ((1 << 64) - 1)).to_bytes(8, "little") + k.to_bytes(4, "little", signed=True)
            + chunk.to_bytes(8, "little", signed=True))


def _flat(view: memoryview) -> memoryview:
    """``view`` as flat bytes, so that slices are byte ranges."""
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def bytes_digest(view: memoryview, key: bytes) -> int:
    """The keyed digest of ``view``'s bytes as an integer below 2^63."""
    view = _flat(view)
    if len(view) <= PIECE_BYTES:
        root = hashlib.blake2b(view, digest_size=16, key=key, person=b"kb-leaf")
    else:
        pieces = [view[i:i + PIECE_BYTES] for i in range(0, len(view), PIECE_BYTES)]
        with ThreadPoolExecutor(min(THREADS, len(pieces))) as pool:  # joined on exit: no thread outlives a call
            leaves = list(pool.map(lambda p: hashlib.blake2b(p, digest_size=32, key=key, person=b"kb-leaf")
                                   .digest(), pieces))
        root = hashlib.blake2b(b"".join(leaves) + len(view).to_bytes(8, "little"), digest_size=16, key=key,
                               person=b"kb-root")
    return int.from_bytes(root.digest()[:8], "little") & MASK


def commitment_of(digests: list[int], sizes: list[int], nonce: int) -> int:
    """The commitment to a call's outputs from each output's digest and byte count, in order."""
    joined = b"".join(d.to_bytes(8, "little") + n.to_bytes(8, "little") for d, n in zip(digests, sizes, strict=True))
    return int.from_bytes(hashlib.blake2b(joined, digest_size=16, key=_key(nonce, -1), person=b"kb-all")
                          .digest()[:8], "little") & MASK


def output_digest(view: memoryview, nonce: int, k: int) -> int:
    """The digest of output ``k``'s host bytes."""
    return bytes_digest(view, _key(nonce, k))


def chunk_digests(view: memoryview, nonce: int, k: int, chunk_bytes: int) -> list[int]:
    """One digest per ``chunk_bytes`` of output ``k``'s bytes (the last chunk may be shorter)."""
    view = _flat(view)
    starts = range(0, len(view), chunk_bytes)
    if len(view) <= PIECE_BYTES:
        return [bytes_digest(view[s:s + chunk_bytes], _key(nonce, k, j)) for j, s in enumerate(starts)]
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(lambda js: bytes_digest(view[js[1]:js[1] + chunk_bytes], _key(nonce, k, js[0])),
                             enumerate(starts)))


def chunk_digest(chunk: memoryview, nonce: int, k: int, j: int) -> int:
    """The digest of chunk ``j`` of output ``k``, as chunk_digests computes it."""
    return bytes_digest(chunk, _key(nonce, k, j))
