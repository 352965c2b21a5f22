"""Tensors across the runner's pipe: a description (dtype, shape, device) and the raw bytes.

The judge rebuilds plain ``torch.Tensor`` objects from bytes it has bounded in advance, so whatever
a candidate returns (a subclass, a lazy list, a view of a buffer it keeps writing to) arrives as
values fixed at the moment the runner sent them, in a type the judge chose.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import torch

from kb_gym.worker import device_digest
from kb_gym.worker.digest import commitment_of, output_digest

WIRE_DTYPES = MappingProxyType({
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool, "complex64": torch.complex64, "complex128": torch.complex128,
})
_NAMES = MappingProxyType({v: k for k, v in WIRE_DTYPES.items()})
_PLAIN = (torch.Tensor, torch.nn.Parameter)


class WireError(ValueError):
    """What arrived does not describe plain tensors of a size the judge accepts."""


def flatten_plain(out: Any) -> tuple[str, list[torch.Tensor]]:
    """``forward``'s return value as ("tensor" | "sequence", tensors); numbers become 0-d tensors.
    Raises TypeError for anything else, a tensor subclass included."""
    if isinstance(out, torch.Tensor):
        return "tensor", [_plain(out)]
    if isinstance(out, (bool, int, float)):
        return "tensor", [torch.tensor(out)]
    if isinstance(out, (list, tuple)):
        flat: list[torch.Tensor] = []
        for item in out:
            flat.extend(flatten_plain(item)[1])
        return "sequence", flat
    raise TypeError(f"forward returned {type(out).__name__}; expected a tensor or a tuple/list of tensors")


FORM_MAX_CHARS = 2048  # a form longer than this is cut (and then differs from any reference's shorter one)


def output_form(out: Any) -> str:
    """How ``forward``'s return value nests: ``t`` a tensor, ``n`` a Python number, ``(...)`` a tuple or list (one
    kind: a list where the reference returns a tuple is the same answer). Flattening alone made ``(y,)``, ``[[a],
    (b,)]`` and a float the reference's ``y``, ``(a, b)`` and 0-d tensor (round 31)."""
    parts: list[str] = []

    def walk(item: Any) -> None:
        if len(parts) > FORM_MAX_CHARS:
            return
        if isinstance(item, torch.Tensor):
            parts.append("t")
        elif isinstance(item, (list, tuple)):
            parts.append("(")
            for k, inner in enumerate(item):
                if k:
                    parts.append(",")
                walk(inner)
            parts.append(")")
        else:
            parts.append("n")

    walk(out)
    return "".join(parts)[:FORM_MAX_CHARS]


def _plain(t: torch.Tensor) -> torch.Tensor:
    if type(t) not in _PLAIN:
        raise TypeError(f"forward returned a {type(t).__name__}, a torch.Tensor subclass; return plain tensors")
    return t


def describe(tensors: list[torch.Tensor]) -> list[dict[str, Any]]:
    """What ``send_bytes`` will write for each tensor: dtype, shape, device kind and byte count."""
    meta = []
    for t in tensors:
        name = _NAMES.get(t.dtype)
        if name is None:
            raise TypeError(f"forward returned a tensor of dtype {t.dtype}, which cannot be compared")
        meta.append({"dtype": name, "shape": list(t.shape), "device": t.device.type,
                     "nbytes": t.numel() * t.element_size()})
    return meta


def _resolved(t: torch.Tensor) -> torch.Tensor:
    """The tensor's values with lazy conjugation and negation applied: a conj() view's bytes are its base's,
    and viewing them as bytes raised (a right answer returned as ``x.conj()`` was a runtime_error)."""
    return t.detach().resolve_conj().resolve_neg()


def on_host(t: torch.Tensor) -> torch.Tensor:
    """The tensor as a contiguous host tensor (a GPU tensor through page-locked memory: a direct copy,
    several times faster than into pageable memory, from a pool the CUDA host allocator keeps)."""
    t = _resolved(t)
    if t.is_cuda:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t)
        return host
    return t.contiguous()


def host_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's values as contiguous host bytes (``on_host``)."""
    host = on_host(t)
    if not host.numel():
        return memoryview(b"")
    return memoryview(host.reshape(-1).view(torch.uint8).numpy())


# The judge lives long and torch's host allocator keeps what it pinned: outputs up to this size are read
# into page-locked memory (a direct copy to the GPU), larger ones into pageable memory.
PINNED_RECEIVE_BYTES = 256 << 20
MAX_DIMS = 64  # torch's own limit on a tensor's dimensions
MAX_OUTPUTS = 4096  # outputs one call may describe


def flatten_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's values as a flat uint8 tensor on its device (contiguous)."""
    return _resolved(t).contiguous().reshape(-1).view(torch.uint8)


def receive_buffer(nbytes: int, device: torch.device) -> tuple[torch.Tensor, memoryview]:
    """Where the judge reads ``nbytes`` of a runner's outputs (not zero-filled first: every byte is read)."""
    pinned = device.type == "cuda" and 0 < nbytes <= PINNED_RECEIVE_BYTES
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    return buf, memoryview(buf.numpy())


def expected_nbytes(meta: Any, limit: int) -> int:
    """Total bytes ``meta`` announces, checked against ``limit`` before anything is read."""
    if not isinstance(meta, list) or len(meta) > MAX_OUTPUTS:
        raise WireError("the runner described its outputs in an unreadable form")
    total = 0
    for item in meta:
        if not isinstance(item, dict) or item.get("dtype") not in WIRE_DTYPES:
            raise WireError("the runner described an output with an unknown dtype")
        shape = item.get("shape")
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 40 for s in shape)):
            raise WireError("the runner described an output with an invalid shape")
        numel, span = 1, 1
        for s in shape:
            numel *= s
            span *= max(s, 1)  # an empty tensor's strides are still the product of the other sizes
        if span >= 1 << 62:
            raise WireError("the runner described an output whose strides overflow")
        nbytes = numel * WIRE_DTYPES[item["dtype"]].itemsize
        if item.get("nbytes") != nbytes:
            raise WireError("an output's byte count does not match its shape and dtype")
        total += nbytes
    if total > limit:
        raise WireError(f"the outputs are {total:,} bytes, more than the {limit:,} the reference's outputs allow")
    return total


def decode(meta: list[dict[str, Any]], data: Any, device: torch.device) -> list[torch.Tensor]:
    """Plain tensors on ``device`` (CPU where the runner returned CPU tensors) from checked ``meta``;
    ``data``: the bytes (a bytearray or memoryview) or a uint8 tensor (receive_buffer)."""
    out, offset = [], 0
    flat = data if isinstance(data, torch.Tensor) else None
    for item in meta:
        dtype = WIRE_DTYPES[item["dtype"]]
        n = item["nbytes"]
        if not n:
            raw = None
        elif flat is not None:
            raw = flat[offset:offset + n]
        else:
            raw = torch.frombuffer(data, dtype=torch.uint8, count=n, offset=offset)
        offset += n
        where = device if item.get("device") == "cuda" else torch.device("cpu")
        # a copy either way: the judge's tensor shares nothing with the bytes it was read from
        # (copy=True: bytes already on ``where``, in a device buffer the runner can still write, are cloned too)
        copied = None if not n else raw.to(where, copy=True)
        try:  # only the shape is the runner's here (a device error in the copy above is not)
            t = copied.view(dtype).reshape(item["shape"]) if n else torch.empty(item["shape"], dtype=dtype,
                                                                               device=where)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise WireError(f"the runner described an output the judge cannot build: {str(exc)[:200]}") from None
        out.append(t)
    return out


def digest_of(t: torch.Tensor, nonce: int, k: int, on_device: bool) -> int:
    """Output ``k``'s digest: on its GPU where ``on_device`` (device_digest.py), else of its host bytes."""
    if on_device and device_digest.applies_to(t.device):
        return device_digest.tree_digests(t, nonce, k)[0]
    return output_digest(host_bytes(t), nonce, k)


def commitment(tensors: list[torch.Tensor], nonce: int, on_device: bool = False) -> int:
    """A number that only the exact output bits give, keyed by a per-call nonce: the runner sends it with
    "done", the judge recomputes it from the bytes that arrive after. A runner that reports done before
    its outputs exist cannot know it, so the judge's clock, which stops on "done", covers the work. Keyed
    BLAKE2 of each output's bytes (digest.py: why not a sum of the words), on the GPU where ``on_device``."""
    return commitment_of([digest_of(t, nonce, k, on_device) for k, t in enumerate(tensors)],
                         [t.numel() * t.element_size() for t in tensors], nonce)
