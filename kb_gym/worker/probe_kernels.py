"""The probe clock's two Triton kernels (probe_clock.py). Imported only by the probe process, on a GPU.

``spin`` runs alone in the probe's CUDA context, one program of one warp, and reads ``%globaltimer`` (nanoseconds,
32 ns steps on the H200) in a loop. Without MPS the GPU runs one context at a time, so a jump between two
readings is time another context held the GPU: it records each jump over ``threshold_ns`` as (last reading before,
first reading after). It stops when the host sets ``stop`` or the timer passes ``until_ns`` (a probe whose host side
died never holds the GPU for long), and says which (``count_ptr[1]``: a pass that outlived its kernel saw nothing
at its end). ``stamp`` writes the timer once, from a second stream of the same context: the
judge's marks around a timed call.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Timer readings between two looks at the stop flag: a look is a volatile load from global memory (~0.5 us); the
# readings in between keep the loop's own step well under the gap threshold.
READINGS_PER_LOOK = 64


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def spin(gaps_ptr, count_ptr, stop_ptr, threshold_ns, max_gaps, until_ns, READINGS: tl.constexpr):
    last = _now()
    n = 0
    stop = tl.load(stop_ptr, volatile=True)
    while stop == 0:
        for _ in range(READINGS):
            t = _now()
            if t - last > threshold_ns:
                if n < max_gaps:
                    tl.store(gaps_ptr + 2 * n, last)
                    tl.store(gaps_ptr + 2 * n + 1, t)
                n += 1
            last = t
        stop = tl.load(stop_ptr, volatile=True)
        stop = tl.where(last > until_ns, 1, stop)
    tl.store(count_ptr, n)
    tl.store(count_ptr + 1, tl.where(last > until_ns, 1, 0))  # expired: no gap after this was seen


@triton.jit
def stamp(out_ptr):
    tl.store(out_ptr, _now())
