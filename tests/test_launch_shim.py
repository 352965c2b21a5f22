"""The preloaded launch shim (kb_gym/worker/launch_shim.py), checked on the CPU against a stand-in CUDA runtime.

The stand-in ``libcudart.so.99`` "launches" a kernel by calling its host stub with the arguments, so a launch that
happens writes memory and a skipped one does not. Like torch's, it is loaded ``RTLD_LOCAL`` (as a dependency of a
library ctypes opens), where ``RTLD_NEXT`` does not reach it. What it cannot check here: symbol versions and the
stubs of a real nvcc build (the GPU tests do, with the shim on).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kb_gym.worker import launch_shim

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="needs a C compiler")

FAKE_CUDART = r"""
#include <stdlib.h>
typedef struct { unsigned int x, y, z; } dim3;
typedef int cudaError_t;
cudaError_t cudaLaunchKernel(const void *func, dim3 g, dim3 b, void **args, unsigned long shared, void *stream) {
    (void)g; (void)b; (void)shared; (void)stream;
    ((void (*)(void **))func)(args);
    return 0;
}
/* CUDA 13's stubs: a handle made once per kernel, then launches by handle (here a heap cell holding the stub) */
cudaError_t __cudaGetKernel(void **handle, const void *func) {
    void **cell = malloc(sizeof *cell);
    *cell = (void *)func;
    *handle = cell;
    return 0;
}
cudaError_t __cudaLaunchKernel(const void *handle, dim3 g, dim3 b, void **args, unsigned long shared, void *stream) {
    return cudaLaunchKernel(*(void *const *)handle, g, b, args, shared, stream);
}
"""

# A library outside the runner's scratch: torch's kernels, launched from anywhere.
TORCH_LIKE = r"""
typedef struct { unsigned int x, y, z; } dim3;
int cudaLaunchKernel(const void *, dim3, dim3, void **, unsigned long, void *);
void torch_kernel(void **args) { float *out = *(float **)args[0]; out[1] = 2.0f; }
void *torch_kernel_stub(void) { return (void *)torch_kernel; }
int torch_launch(float *out) { void *args[] = {&out}; dim3 one = {1, 1, 1}; return cudaLaunchKernel((void *)torch_kernel, one, one, args, 0, 0); }
"""

# The candidate's extension, built under the scratch folder: its own kernel, torch's kernel launched from its
# code, and torch's launch called from its code.
EXTENSION = r"""
typedef struct { unsigned int x, y, z; } dim3;
int cudaLaunchKernel(const void *, dim3, dim3, void **, unsigned long, void *);
int torch_launch(float *out);
void *torch_kernel_stub(void);
void own_kernel(void **args) { float *out = *(float **)args[0]; out[0] = 1.0f; }
int run_own(float *out) { void *args[] = {&out}; dim3 one = {1, 1, 1}; return cudaLaunchKernel((void *)own_kernel, one, one, args, 0, 0); }
int run_torch_stub(float *out) { void *args[] = {&out}; dim3 one = {1, 1, 1}; return cudaLaunchKernel(torch_kernel_stub(), one, one, args, 0, 0); }
int run_torch(float *out) { return torch_launch(out); }
/* as nvcc 13's stubs launch: by a handle made for the stub */
int __cudaGetKernel(void **, const void *);
int __cudaLaunchKernel(const void *, dim3, dim3, void **, unsigned long, void *);
int run_own_handle(float *out) {
    static void *handle = 0;
    if (!handle) __cudaGetKernel(&handle, (void *)own_kernel);
    void *args[] = {&out}; dim3 one = {1, 1, 1}; return __cudaLaunchKernel(handle, one, one, args, 0, 0);
}
int run_torch_handle(float *out) {
    static void *handle = 0;
    if (!handle) __cudaGetKernel(&handle, torch_kernel_stub());
    void *args[] = {&out}; dim3 one = {1, 1, 1}; return __cudaLaunchKernel(handle, one, one, args, 0, 0);
}
/* what a candidate that reads our source tries: the control entry point, declared and called with a guess */
long kb_launch_shim_control(unsigned long long key, int op, const char *arg);
long tamper(void) { return kb_launch_shim_control(0, 2, 0); }
long tamper_root(void) { return kb_launch_shim_control(12345, 1, "/"); }
"""

DRIVER = """
import ctypes, json, sys
from kb_gym.worker.launch_shim import Shim

shim = Shim.preloaded()
ext = ctypes.CDLL(sys.argv[1])  # RTLD_LOCAL, as Python opens torch's libraries
shim.set_root(sys.argv[2])
seen = {"tamper": [ext.tamper(), ext.tamper_root()]}

def call(name):
    out = (ctypes.c_float * 2)(0.0, 0.0)
    rc = getattr(ext, name)(out)
    return [rc, list(out), shim.own_launches()]

for knockout in (False, True):
    shim.set_knockout(knockout)
    for name in ("run_own", "run_torch_stub", "run_torch", "run_own_handle", "run_torch_handle"):
        seen[f"{name} knockout={knockout}"] = call(name)
print(json.dumps(seen))
"""


def _cc(tmp: Path, name: str, source: str, *flags: str) -> Path:
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / name
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-o", str(out), str(src), *flags], check=True)
    return out


def test_the_shim_counts_and_knocks_out_only_the_candidates_own_launches(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(launch_shim.ENV, "1")
    libs, scratch = tmp_path / "libs", tmp_path / "scratch"
    (scratch / "ext" / "candidate").mkdir(parents=True)
    libs.mkdir()
    _cc(libs, "libcudart.so.99", FAKE_CUDART, "-Wl,-soname,libcudart.so.99")
    _cc(libs, "libtorchlike.so", TORCH_LIKE, f"-L{libs}", "-l:libcudart.so.99", f"-Wl,-rpath,{libs}")
    ext = _cc(scratch / "ext" / "candidate", "candidate.so", EXTENSION, f"-L{libs}", "-l:libtorchlike.so",
              "-l:libcudart.so.99", f"-Wl,-rpath,{libs}")
    env = launch_shim.preload_env("cuda:0", {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert env["LD_PRELOAD"].endswith("libkb_launch_shim.so")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVER), str(ext), str(scratch)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    import json

    seen = json.loads(done.stdout)
    assert seen["tamper"] == [-1, -1], "the runner keyed the shim first: a guessed key changes nothing"
    # without the knockout every launch runs; only the candidate's own kernel counts
    assert seen["run_own knockout=False"] == [0, [1.0, 0.0], 1]
    assert seen["run_torch_stub knockout=False"] == [0, [0.0, 2.0], 1], "torch's kernel launched by the candidate"
    assert seen["run_torch knockout=False"] == [0, [0.0, 2.0], 1]
    # by handle (CUDA 13's stubs): the handle is the candidate's where its stub is
    assert seen["run_own_handle knockout=False"] == [0, [1.0, 0.0], 2]
    assert seen["run_torch_handle knockout=False"] == [0, [0.0, 2.0], 2]
    # with it the candidate's own launch is skipped (and still counted); torch's run as always
    assert seen["run_own knockout=True"] == [0, [0.0, 0.0], 3]
    assert seen["run_torch_stub knockout=True"] == [0, [0.0, 2.0], 3]
    assert seen["run_torch knockout=True"] == [0, [0.0, 2.0], 3]
    assert seen["run_own_handle knockout=True"] == [0, [0.0, 0.0], 4]
    assert seen["run_torch_handle knockout=True"] == [0, [0.0, 2.0], 4]


def test_switched_off_or_off_a_gpu_nothing_is_preloaded(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(launch_shim.ENV, "0")
    assert "LD_PRELOAD" not in launch_shim.preload_env("cuda:0", {})
    monkeypatch.delenv(launch_shim.ENV)  # on by default, for GPU runners only
    assert "LD_PRELOAD" not in launch_shim.preload_env("cpu", {})
    env = launch_shim.preload_env("cuda:1", {"LD_PRELOAD": "/opt/other.so"})
    kept = env["LD_PRELOAD"].split()
    assert kept[0].endswith("libkb_launch_shim.so") and kept[1] == "/opt/other.so"
    assert launch_shim.preloaded_in(env) and not launch_shim.preloaded_in({"LD_PRELOAD": "/opt/other.so"})


def test_a_process_without_the_shim_has_no_handle():
    assert launch_shim.Shim.preloaded() is None
