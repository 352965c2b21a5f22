"""A roofline cost model of a PyTorch program's eager forward on one GPU (fp32, TF32 off).

Each eager op (one kernel launch) is described by the bytes it reads and writes, the flops it does and
the bytes it newly allocates. Its time is ``max(bytes / HBM_BYTES_PER_S, flops / flops_per_s) +
LAUNCH_S`` (``flops_per_s`` is FP32_FLOPS_PER_S but for convolutions), and a program's time is the sum
over its ops, run one after another as eager PyTorch does.
Memory is the inputs, the parameters and every tensor an op allocates, with nothing freed: an upper
bound on the forward's peak.

The constants are calibrated on an H200 (docs/problems.md, "Calibration"): 200 synthetic and 106 built-in
problems, each forward measured (median of 10 cold-L2 calls, fp32, TF32 off) against its estimate. Elementwise
ops and reductions ran at ~4.3e12 B/s (measured / estimated 0.75-0.78 at the datasheet-ish 3.3e12), matmuls
at the 50e12 FLOP/s priced (Linear median 0.99, bmm 1.10), and cuDNN's fp32 convolutions far below it and
unevenly: 5-65e12 FLOP/s, slower with fewer output channels and a shorter reduction (in_channels x kernel
area). A fit of 85 plain convolutions prices them (``conv_flops_per_s``); its residual is 0.72-1.39x from
the 10th to the 90th percentile, against 0.49-1.83x for one rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# --- the constants (calibrated on an H200: docs/problems.md) -------------------------------------------
HBM_BYTES_PER_S = 4.3e12  # achieved memory bandwidth, bytes read + written per second
FP32_FLOPS_PER_S = 50e12  # fp32 matmul without TF32 (the elementwise ops never reach it)
LAUNCH_S = 5e-6  # per eager op: launch and the gap to the next kernel
FP32_BYTES = 4
# fp32 convolution, TF32 off: CONV_SCALE * c_out ** CONV_OUT_EXP * (c_in * kernel area) ** CONV_REDUCE_EXP,
# per group, capped at CONV_MAX (log-linear least squares over 85 measured convolutions on the H200)
CONV_SCALE, CONV_OUT_EXP, CONV_REDUCE_EXP, CONV_MAX = 9.0e11, 0.405, 0.263, 45e12


def conv_flops_per_s(out_channels: float, reduction: float) -> float:
    """The fp32 rate of a convolution with ``out_channels`` per group, each summing ``reduction`` products
    (input channels per group times the kernel's area or volume)."""
    rate = CONV_SCALE * max(out_channels, 1.0) ** CONV_OUT_EXP * max(reduction, 1.0) ** CONV_REDUCE_EXP
    return min(rate, CONV_MAX)


@dataclass(frozen=True)
class Op:
    """One eager op: ``bytes`` read plus written, ``flops``, and ``alloc`` bytes of new tensors it returns."""

    name: str
    bytes: float
    flops: float = 0.0
    alloc: float = 0.0
    flops_per_s: float = FP32_FLOPS_PER_S  # the rate this op's flops run at (convolutions: conv_flops_per_s)


def op_seconds(op: Op) -> float:
    """The roofline time of one op, launch included."""
    return max(op.bytes / HBM_BYTES_PER_S, op.flops / op.flops_per_s) + LAUNCH_S


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
    return Op(name, moved, flops=2.0 * out * c_in * kernel * kernel, alloc=out * FP32_BYTES,
              flops_per_s=conv_flops_per_s(c_out, c_in * kernel * kernel))
