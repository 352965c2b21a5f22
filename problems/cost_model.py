"""A roofline cost model of a PyTorch program's eager forward on one GPU (fp32, TF32 off).

Each eager op (one kernel launch) is described by the bytes it reads and writes, the flops it does and
the bytes it newly allocates. Its time is ``max(bytes / HBM_BYTES_PER_S, flops / FP32_FLOPS_PER_S) +
LAUNCH_S`` and a program's time is the sum over its ops, run one after another as eager PyTorch does.
Memory is the inputs, the parameters and every tensor an op allocates, with nothing freed: an upper
bound on the forward's peak.

The constants are an H200's datasheet-and-experience numbers, not a measurement: **calibrate on the
GPU: H200 measurement pending.** A later run on an H200 can compare each synthetic problem's measured
eager time with the estimate its generated code records (``# estimated eager time on an H200: ...``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# --- the constants (calibrate on the GPU: H200 measurement pending) ---------------------------------
HBM_BYTES_PER_S = 3.3e12  # achieved memory bandwidth, bytes read + written per second
FP32_FLOPS_PER_S = 50e12  # fp32 matmul/conv without TF32 (the elementwise ops never reach it)
LAUNCH_S = 5e-6  # per eager op: launch and the gap to the next kernel
FP32_BYTES = 4


@dataclass(frozen=True)
class Op:
    """One eager op: ``bytes`` read plus written, ``flops``, and ``alloc`` bytes of new tensors it returns."""

    name: str
    bytes: float
    flops: float = 0.0
    alloc: float = 0.0


def op_seconds(op: Op) -> float:
    """The roofline time of one op, launch included."""
    return max(op.bytes / HBM_BYTES_PER_S, op.flops / FP32_FLOPS_PER_S) + LAUNCH_S


def eager_ms(ops: Iterable[Op]) -> float:
    """The estimated eager time of ``ops`` run one after another, in milliseconds."""
    return 1e3 * sum(op_seconds(op) for op in ops)


def memory_bytes(ops: Iterable[Op], resident: float = 0.0) -> float:
    """``resident`` bytes (inputs, parameters) plus every op's allocation, nothing freed."""
    return resident + sum(op.alloc for op in ops)


# --- ops by kind, sizes in elements (fp32) -----------------------------------------------------------

def pointwise(name: str, numel: int, reads: float = 1.0, extra_read: int = 0, inplace: bool = False) -> Op:
    """An elementwise op over ``numel`` elements: reads ``reads`` tensors of that size (plus
    ``extra_read`` broadcast elements, a bias), writes one (in place: allocates none)."""
    moved = (reads * numel + extra_read + numel) * FP32_BYTES
    return Op(name, moved, flops=numel * reads, alloc=0 if inplace else numel * FP32_BYTES)


def reduction(name: str, numel: int, out: int) -> Op:
    """Reduce ``numel`` elements to ``out``."""
    return Op(name, (numel + out) * FP32_BYTES, flops=numel, alloc=out * FP32_BYTES)


def matmul(name: str, batch: int, m: int, k: int, n: int, bias: int = 0, shared_rhs: bool = False) -> Op:
    """``batch`` products (m, k) @ (k, n), plus ``bias`` broadcast elements; ``shared_rhs``: one right
    operand for all (a Linear's weight)."""
    rhs = k * n if shared_rhs else batch * k * n
    moved = (batch * m * k + rhs + bias + batch * m * n) * FP32_BYTES
    return Op(name, moved, flops=2.0 * batch * m * k * n, alloc=batch * m * n * FP32_BYTES)


def conv2d(name: str, batch: int, c_in: int, c_out: int, kernel: int, height: int, width: int) -> Op:
    """A same-padded, stride-1 2-D convolution (no bias: PyTorch adds it in a separate op)."""
    out = batch * c_out * height * width
    moved = (batch * c_in * height * width + c_out * c_in * kernel * kernel + out) * FP32_BYTES
    return Op(name, moved, flops=2.0 * out * c_in * kernel * kernel, alloc=out * FP32_BYTES)
