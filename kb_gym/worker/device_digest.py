"""Keyed BLAKE2s tree digests computed on the GPU: the commitment of outputs that live on the device.

Why on the device: the commitment is taken before "done", inside the judge's envelope of every timed call. On
the host (digest.py) it first needs the output copied out and then hashed at ~1 GB/s a core: tens of ms a
call for a 512 MB output, and the envelope's tolerance, which grows with the calibrated overhead and its
spread, grew with it (measured on the H200, docs/benchmarks.md 0d). One Triton kernel per tree level hashes
the bytes where they are: a few ms for GBs, and no host copy before "done" at all.

What is computed is standard BLAKE2s in tree mode (RFC 7693 parameter block: fanout 32, maximal depth 255,
leaf length 1024, inner length 32), so that ``reference_digest`` with ``hashlib.blake2s`` is its exact
specification and the judge checks the kernel against it before trusting it (``self_check``):

- level 0: the bytes in 1 KB leaves (the last one shorter; an empty input is one empty leaf), leaf ``i``
  hashed with node offset ``i``, node depth 0, the last leaf flagged as the last node;
- level d: the previous level's 32-byte digests joined and cut into 1 KB nodes (32 digests), hashed with
  node depth d; the first level with a single node is the root.

The salt is the call's nonce and the personalisation the output and chunk index, so a runner cannot reuse
digests across calls, outputs or positions. BLAKE2s rather than BLAKE2b: 32-bit words are native to a GPU.
``segment_bytes`` hashes equal segments of one tensor as independent trees in the same launches (the
spot-checked chunks of spot_check.py), segment ``j`` personalised with ``j``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

import torch

LEAF_BYTES = 1024
FANOUT = 32
MASK = (1 << 63) - 1  # as digest.py: digests travel as JSON integers below 2^63
BLOCK = 128  # nodes a program hashes, one per thread
_IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
_WHOLE = -1  # the chunk index of a digest over a whole output


def _salt(nonce: int) -> bytes:
    return (nonce & ((1 << 64) - 1)).to_bytes(8, "little")


def _person(k: int, j: int) -> bytes:
    return k.to_bytes(4, "little", signed=True) + j.to_bytes(4, "little", signed=True)


def reference_digest(data: bytes | memoryview, nonce: int, k: int, j: int = _WHOLE) -> int:
    """The tree digest of ``data`` with hashlib: the specification the kernel is checked against."""
    data = bytes(data)
    salt, person = _salt(nonce), _person(k, j)

    def node(piece: bytes, depth: int, offset: int, last: bool) -> bytes:
        return hashlib.blake2s(piece, digest_size=32, salt=salt, person=person, fanout=FANOUT, depth=255,
                               leaf_size=LEAF_BYTES, node_offset=offset, node_depth=depth, inner_size=32,
                               last_node=last).digest()

    def level(joined: bytes, depth: int) -> list[bytes]:
        pieces = [joined[i:i + LEAF_BYTES] for i in range(0, len(joined), LEAF_BYTES)] or [b""]
        return [node(p, depth, i, i == len(pieces) - 1) for i, p in enumerate(pieces)]

    nodes, depth = level(data, 0), 0
    while len(nodes) > 1:
        depth += 1
        nodes = level(b"".join(nodes), depth)
    return int.from_bytes(nodes[0][:8], "little") & MASK


def _params(depth: int, nonce: int, k: int) -> list[int]:
    """The parameter block's eight words XOR the IV (node offset 0; the chunk word for a whole output), then
    the IV's last word alone (chunked segments XOR their index into it)."""
    p = [32 | (FANOUT << 16) | (255 << 24), LEAF_BYTES, 0, (depth << 16) | (32 << 24),
         *struct.unpack("<2I", _salt(nonce)), *struct.unpack("<2I", _person(k, _WHOLE))]
    return [iv ^ w for iv, w in zip(_IV, p, strict=True)] + [_IV[7]]


_kernel: Any = None


def _build() -> Any:
    """The level kernel (Triton imported on first use: a CPU-only judge never needs it)."""
    from kb_gym.worker.blake2s_kernel import level

    return level


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as int32 words on its device, zero-padded to whole words and 16-byte aligned (a copy
    only where they are not)."""
    flat = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
    if flat.numel() % 4:
        flat = torch.cat([flat, flat.new_zeros(4 - flat.numel() % 4)])
    elif flat.data_ptr() % 16:  # a view into the middle of a buffer: one more compiled variant otherwise
        flat = flat.clone()
    return flat.view(torch.int32)


def tree_digests(t: torch.Tensor, nonce: int, k: int, segment_bytes: int = 0, chunk_base: int = 0,
                 kernel: bool | None = None) -> list[int]:
    """The tree digest of ``t``'s bytes (``segment_bytes`` 0), or one per ``segment_bytes`` of them (a
    multiple of 4; the last segment may be shorter; segment ``i`` personalised as chunk ``chunk_base + i``),
    computed where ``t`` is by the kernel (a CUDA tensor, or with ``kernel`` any tensor under TRITON_INTERPRET=1);
    a CPU tensor otherwise by ``reference_digest``: the same values (the whole GPU path tested without one)."""
    global _kernel
    nbytes = t.numel() * t.element_size()
    if segment_bytes and segment_bytes % 4:
        raise ValueError("segments must be whole words")
    if not (t.is_cuda if kernel is None else kernel):
        flat = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
        raw = memoryview(flat.view(torch.uint8).numpy()) if nbytes else b""
        if not segment_bytes:
            return [reference_digest(raw, nonce, k)]
        return [reference_digest(raw[s:s + segment_bytes], nonce, k, chunk_base + j)
                for j, s in enumerate(range(0, max(nbytes, 1), segment_bytes))]
    if _kernel is None:
        _kernel = _build()
    seg = segment_bytes if segment_bytes and nbytes > segment_bytes else max(nbytes, 0)
    n_seg = max(1, -(-nbytes // seg)) if seg else 1
    full, last = (seg, nbytes - (n_seg - 1) * seg) if n_seg > 1 else (nbytes, nbytes)
    chunked = 1 if segment_bytes else 0
    src = _words(t) if nbytes else torch.zeros(1, dtype=torch.int32, device=t.device)
    stride, depth = seg // 4, 0
    while True:
        cap = max(1, -(-full // LEAF_BYTES))
        consts = torch.tensor([*_IV, *_params(depth, nonce, k), n_seg, cap, stride, full, last, depth, chunked,
                               chunk_base], dtype=torch.int64).to(t.device)
        dst = torch.empty(n_seg * cap * 8, dtype=torch.int32, device=t.device)
        _kernel[(-(-n_seg * cap // BLOCK),)](src, dst, consts, BLOCK=BLOCK)
        if cap == 1:
            break
        full, last = cap * 32, max(1, -(-last // LEAF_BYTES)) * 32
        src, stride, depth = dst, cap * 8, depth + 1
    roots = dst.view(n_seg, 8)[:, :2].cpu().numpy().astype("<u4").tobytes()
    return [int.from_bytes(roots[8 * i:8 * i + 8], "little") & MASK for i in range(n_seg)]


# Sizes that exercise partial words, blocks and leaves, three levels, and segments (bytes, segment bytes).
CHECK_SIZES = ((0, 0), (3, 0), (64, 0), (1000, 0), (1024, 0), (1025, 0), (40_000, 0), (1_100_000, 0),
               (70_000, 8192), (9000, 4096))


def self_check(device: torch.device, sizes: tuple[tuple[int, int], ...] = CHECK_SIZES,
               kernel: bool = True) -> str | None:
    """Why the kernel cannot be trusted on ``device`` (None: it gives hashlib's digests at ``sizes``; ``kernel``
    False checks the path around it: CPU tensors are hashed by ``reference_digest``)."""
    try:
        gen = torch.Generator().manual_seed(7)
        for nbytes, segment in sizes:
            data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
            got = tree_digests(data.to(device), 12345, 2, segment, kernel=kernel)
            want = tree_digests(data, 12345, 2, segment, kernel=False)  # hashlib's, segment by segment
            if segment:
                if nbytes > segment and tree_digests(data[segment:2 * segment].to(device), 12345, 2, segment,
                                                     chunk_base=1, kernel=kernel) != want[1:2]:
                    return f"the device digest of chunk 1 of {nbytes} bytes differs from hashlib's"
            if got != want:
                return f"the device digest of {nbytes} bytes (segments of {segment}) differs from hashlib's"
    except Exception as exc:  # noqa: BLE001 - no Triton, a compile failure: the host digest stands in
        return f"the device digest is not available: {type(exc).__name__}: {str(exc)[:300]}"
    return None


ENV_SWITCH = "KB_GYM_DEVICE_DIGEST"  # "0": GPU outputs hashed on the host; "force": CPU ones too (tests)
ENV_WARM = "KB_GYM_DEVICE_DIGEST_WARM"  # set by the judge for its runners: load the kernel at start-up
QUICK_SIZES = ((0, 0), (3, 0), (1025, 0), (9000, 4096))  # the self-check where the kernel is interpreted
_trust: dict[str, str | None] = {}
_seed: list[Path] = []


def applies_to(device: torch.device) -> bool:
    """Whether outputs on ``device`` are hashed where they are: GPUs, and with ``force`` the CPU too (the
    kernel under Triton's interpreter: the whole path tested on a machine without a GPU)."""
    mode = os.environ.get(ENV_SWITCH, "1")
    return mode != "0" and (device.type == "cuda" or mode == "force")


def trusted(device: torch.device) -> bool:
    """Whether this process (a judge) hashes ``device``'s outputs there: ``applies_to`` it and the kernel
    checked against hashlib here, once. The first check also leaves the compiled kernel in this process's
    Triton cache, which ``seed`` copies into each runner's so that it need not compile it again."""
    if not applies_to(device):
        return False
    key = str(device)
    if key not in _trust:
        gpu = device.type == "cuda"
        cache = _compile_cache()
        own = os.environ.get("TRITON_CACHE_DIR")
        if cache is not None:  # compiled into a folder of its own (Triton reads the variable at each compile)
            os.environ["TRITON_CACHE_DIR"] = str(cache)
        try:
            _trust[key] = self_check(device, CHECK_SIZES if gpu else QUICK_SIZES, kernel=gpu)
        finally:
            if cache is not None and own is not None:
                os.environ["TRITON_CACHE_DIR"] = own
            elif cache is not None:
                del os.environ["TRITON_CACHE_DIR"]
        if _trust[key] is not None:
            print(f"kb_gym: outputs on {key} are hashed on the host: {_trust[key]}", file=sys.stderr)
        elif cache is not None and not _seed:  # the kernel and Triton's launchers, compiled by the judge
            _seed.extend(cache / name for name in sorted(os.listdir(cache)))
    return _trust[key] is None


def _compile_cache() -> Path | None:
    """Where the judge compiles the kernel: beside the build cache (written only by judges; runners get
    copies), so that it is compiled once per machine and Triton version, not at every judge's start."""
    from kb_gym.worker.build_cache import extensions_root

    root = extensions_root()
    if root is None:
        return None
    try:
        import triton

        version = triton.__version__
    except ImportError:
        return None
    folder = root.parent / "digest_triton" / version
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def seed(triton_cache: Path) -> None:
    """Copy the compiled kernel (and Triton's launcher for it) into a runner's Triton cache folder."""
    for entry in _seed:
        target = triton_cache / entry.name
        if entry.is_dir() and not target.exists():
            shutil.copytree(entry, target)
            for group in target.glob("__grp__*.json"):
                _repoint(group, entry, target)


def _repoint(group: Path, source: Path, target: Path) -> None:
    """Point a copied Triton group file at the copies. It lists its files by absolute path, so the runner's
    Triton would open the judge's folder, which Landlock keeps it from reading (found on the H200: every
    runner's kernel load failed with PermissionError, and every output was hashed on the host)."""
    import json

    try:
        data = json.loads(group.read_text())
        paths = data["child_paths"]
        data["child_paths"] = {name: str(target / Path(p).relative_to(source)) if Path(p).is_relative_to(source)
                               else p for name, p in paths.items()}
        group.write_text(json.dumps(data))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # not a layout we know
        group.unlink(missing_ok=True)  # a cache miss: the runner's Triton compiles the kernel in its own folder


def warm(device: torch.device) -> str | None:
    """In a runner at start-up: load the kernel (from the seeded cache) and hash a few bytes with it, so that
    no call pays for it. Why it failed, or None (the judge asks a runner that failed for host digests)."""
    try:
        tree_digests(torch.zeros(8, dtype=torch.uint8, device=device), 1, 0, kernel=device.type == "cuda")
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:500]}"
    return None


def why_not(device: torch.device) -> str:
    """Why this process hashes ``device``'s outputs on the host ('' where it does not)."""
    if not applies_to(device):
        return "switched off" if os.environ.get(ENV_SWITCH) == "0" else ""
    return _trust.get(str(device)) or ""
