"""Why the launch shim does or does not see a candidate's launches, on a GPU (docs/benchmarks.md).

1. A bare process with the shim preloaded builds a small extension whose kernel writes 42 and prints what the
   shim saw: every launch, the candidate's own, whether the knockout skipped the write, and how the extension
   binds ``cudaLaunchKernel`` (its undefined dynamic symbols, the runtime it maps).
2. An honest CUDA ReLU in an Evaluator with the shim on (``KB_GYM_LAUNCH_SHIM=1``): its launches as counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

from kb_gym.worker import launch_shim

EXT = r'''
import ctypes, os, re, subprocess, sys, torch
from torch.utils.cpp_extension import load_inline
src = r"""
#include <torch/extension.h>
__global__ void put(float* y) { y[0] = 42.0f; }
torch::Tensor run(torch::Tensor x) {
    auto y = torch::zeros_like(x);
    put<<<1, 1>>>(y.data_ptr<float>());
    return y;
}
"""
def seen(root):
    lib = ctypes.CDLL(None)
    try:
        control = lib.kb_launch_shim_control
    except AttributeError:
        return "shim not preloaded"
    control.argtypes = [ctypes.c_ulonglong, ctypes.c_int, ctypes.c_char_p]
    control.restype = ctypes.c_long
    ext = load_inline(name="shim_diag_ext", cpp_sources="torch::Tensor run(torch::Tensor x);", cuda_sources=src,
                      functions=["run"])
    x = torch.ones(8, device="cuda")
    before = control(0, 3, None), control(0, 0, None)
    value = ext.run(x)[0].item()
    after = control(0, 3, None), control(0, 0, None)
    so = ext.__file__
    nm = subprocess.run(["nm", "-D", "--undefined-only", so], capture_output=True, text=True).stdout
    maps = sorted({line.split()[-1] for line in open("/proc/self/maps") if "cudart" in line or "shim" in line})
    return (f"root={root} ext={so} value={value} launches all/own before={before} after={after} "
            f"undefined={[l.split()[-1] for l in nm.splitlines() if 'aunch' in l or 'Config' in l]} maps={maps} "
            f"TORCH_EXTENSIONS_DIR={os.environ.get('TORCH_EXTENSIONS_DIR')}")
'''

BARE = EXT + '''
root = sys.argv[1]
lib = ctypes.CDLL(None)
control = lib.kb_launch_shim_control
control.argtypes = [ctypes.c_ulonglong, ctypes.c_int, ctypes.c_char_p]
control.restype = ctypes.c_long
control(7, 1, root.encode())
print(seen(root))
control(7, 2, b"1")  # knockout on: the write of 42 is skipped
from torch.utils.cpp_extension import load_inline as _l
ext = _l(name="shim_diag_ext", cpp_sources="torch::Tensor run(torch::Tensor x);", cuda_sources=src, functions=["run"])
print("knocked out: value", ext.run(torch.ones(8, device="cuda"))[0].item(), "own", control(0, 0, None))
'''

HONEST = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
__global__ void k(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
torch::Tensor run(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    k<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
ext = load_inline(name="shim_diag_relu", cpp_sources="torch::Tensor run(torch::Tensor x);", cuda_sources=src,
                  functions=["run"])

class ModelNew(nn.Module):
    def forward(self, x):
        return ext.run(x.contiguous())
'''


def main() -> None:
    lib = launch_shim.library()
    print("shim library:", lib)
    if lib is None:
        return
    with tempfile.TemporaryDirectory() as root:
        env = {**os.environ, "LD_PRELOAD": str(lib), "TORCH_EXTENSIONS_DIR": os.path.join(root, "ext")}
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(BARE), root], env=env, capture_output=True,
                              text=True, timeout=400)
        print("1. bare:", done.stdout.strip(), done.stderr.strip()[-1500:] if done.returncode else "")

    os.environ[launch_shim.ENV] = "1"
    from kb_gym import Evaluator, get_problem, load_problems

    relu = get_problem(load_problems("builtin", size="cpu"), name="level1/1_ReLU")
    with Evaluator("cuda:0", results_path=False, trials=2, timing_max_reps=20, load_timeout=300) as ev:
        result = ev.evaluate(relu, HONEST, config=ev.config.replace(timing=False))
    print("2. runner, an honest CUDA ReLU:", result.status, result.flags, "launches", result.custom_kernel_launches,
          (result.error or "")[-800:])


if __name__ == "__main__":
    main()
