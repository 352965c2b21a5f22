"""Where a Triton kernel's first call in a fresh runner goes (the warm-Triton target of the throughput issue).

A runner is new for every candidate and its Triton cache is a folder of its own, so each candidate's first call of
each kernel pays Triton's compile, and, where this Triton builds a C launcher per kernel signature, a gcc build of
that launcher. Which of the two dominates decides the fix: kept kernels (``KB_GYM_TRITON_CACHE``, by source) help
only a source evaluated again; launchers kept by signature would help every new source, but only if a process that
never ran candidate code builds them. Run on the device machine: ``python3 -P scripts/triton_first_call.py``.

Each case runs in a fresh interpreter with an empty ``TRITON_CACHE_DIR`` that has first run one unrelated kernel
(as a runner's start-up runs the device digest's), then times: a kernel's first call, a second kernel with the same
signature, a third with another signature, and the first kernel's second call; and lists what each call added to the
cache (``.so`` files are launchers or the driver's utilities, ``.cubin`` kernels).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, time
from pathlib import Path
import torch, triton, triton.language as tl

cache = Path(os.environ["TRITON_CACHE_DIR"])

def files():
    return {str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()}

@triton.jit
def warm(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1.0, mask=i < n)

@triton.jit
def relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.maximum(tl.load(x_ptr + i, mask=i < n), 0.0), mask=i < n)

@triton.jit
def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 3.0, mask=i < n)

@triton.jit
def axpy(x_ptr, y_ptr, z_ptr, a, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(z_ptr + i, a * tl.load(x_ptr + i, mask=m) + tl.load(y_ptr + i, mask=m), mask=m)

x = torch.randn(1 << 20, device="cuda"); y = torch.empty_like(x); z = torch.empty_like(x)
n = x.numel(); grid = (triton.cdiv(n, 1024),)
out = {"triton": triton.__version__}

def timed(name, fn):
    before = files()
    t = time.perf_counter(); fn(); torch.cuda.synchronize(); out[name] = round(time.perf_counter() - t, 4)
    added = sorted(files() - before)
    out[name + "_added"] = [a for a in added if a.endswith((".so", ".cubin"))]

timed("warmup_kernel", lambda: warm[grid](x, n, BLOCK=1024))
timed("relu_first", lambda: relu[grid](x, y, n, BLOCK=1024))
timed("scale_same_signature", lambda: scale[grid](x, y, n, BLOCK=1024))
timed("axpy_other_signature", lambda: axpy[grid](x, y, z, 2.0, n, BLOCK=1024))
timed("relu_again", lambda: relu[grid](x, y, n, BLOCK=1024))
import triton.backends.nvidia.driver as drv
out["make_launcher"] = hasattr(drv, "make_launcher")  # a C launcher generated and built per signature
print(json.dumps(out))
"""


def main() -> int:
    rows = []
    for _run in range(3):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache)
            env.pop("TRITON_INTERPRET", None)
            child = os.path.join(cache, "..", f"triton_first_call_{os.getpid()}.py")  # @jit wants a source file
            with open(child, "w") as f:
                f.write(CHILD)
            try:
                proc = subprocess.run([sys.executable, "-P", child], env=env, capture_output=True, text=True,
                                      timeout=300)
            finally:
                os.unlink(child)
            if proc.returncode != 0:
                print(proc.stderr[-3000:])
                return 1
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]))
    keys = ("warmup_kernel", "relu_first", "scale_same_signature", "axpy_other_signature", "relu_again")
    print("run | " + " | ".join(keys))
    for i, r in enumerate(rows):
        print(f"{i} | " + " | ".join(f"{r[k]:.3f} s" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
