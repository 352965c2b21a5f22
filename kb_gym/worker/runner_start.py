"""How a judge starts a runner: the environment it gives it (tool locations and build settings, never credentials),
and the pipe its outputs come back through."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import torch

from kb_gym import sandbox
from kb_gym.worker import build_cache, launch_shim, pch, process

# What a runner's environment keeps of the judge's: tool locations and build settings, never
# credentials or tokens (a candidate could return them in its error text).
_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH",
             "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "CC", "CXX", "KB_GYM_LANDLOCK", "KB_GYM_RUNNER_READS",
             "KB_GYM_SECCOMP", "OMP_NUM_THREADS", "PYTHONPATH", "NVIDIA_VISIBLE_DEVICES", "TRITON_PTXAS_PATH",
             "KB_GYM_HEADER_DIET", "KB_GYM_PAYLOAD_PIN")
# Devices whose runners' CUDA failed under the read rules: later runners there skip them.
READS_BREAK_CUDA: dict[str, str] = {}


def own_gpu(device: str) -> str:
    """The judge's GPU as a CUDA_VISIBLE_DEVICES entry, for its runners to see that GPU only: on a host of eight, a
    runner that saw them all could run its forward on another GPU in the probe check's calls, where the probe does
    not look (probe_check.py), or time-slice a neighbouring judge's timing. "" on the CPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return ""
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible:
        return visible[index] if index < len(visible) else ""
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    return ("GPU-" + uuid if uuid and not uuid.startswith(("GPU-", "MIG-")) else uuid) if uuid else str(index)


_F_SETPIPE_SZ = 1031
_PIPE_BYTES = 1 << 20  # the default pipe-max-size: 16x fewer system calls per GB of outputs than 64 KB


def widen_pipe(fd: int) -> None:
    """Outputs come back through this pipe: at the default 64 KB a 4 GB output took ~65,000 reads and writes.
    Measured here (2 cores): 0.48 GB/s at 64 KB, 1.70 GB/s at 1 MB."""
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:  # an unprivileged process above the system's pipe-max-size: the default stays
        pass


def runner_env(device: str, scratch: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", TORCHINDUCTOR_COMPILE_THREADS="1",
               HOME=str(scratch / "home"), TMPDIR=str(scratch / "tmp"),
               # torch.load never unpickles code, whatever it is asked (round 23: a pickle that called eval)
               TORCH_FORCE_WEIGHTS_ONLY_LOAD="1")
    if device == "cpu":
        # One intra-op thread on both sides of a CPU timing: two processes' OpenMP pools would otherwise
        # spin against each other on a few cores (a 10 us ReLU measured 2.7 ms in the runner).
        env.update(TRITON_INTERPRET="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                   **process.cpu_malloc_env())
    if sandbox.namespace_prefix():
        env["KB_GYM_RUNNER_PRIVATE_SHM"] = "1"
    env[process.ENV_HOST_IPC] = process.host_ipc_namespace()  # a runner in a namespace of its own caps SysV there
    if device in READS_BREAK_CUDA:
        env["KB_GYM_RUNNER_READS"] = "0"
    gpu = own_gpu(device)
    if gpu:
        env[process.ENV_GPU] = gpu
    pch_root = pch.root_for(build_cache.extensions_root(), build_cache.toolchain(torch.device(device)),
                            torch.device(device).type)
    if pch_root is not None:
        pch_root.mkdir(parents=True, exist_ok=True)  # before the runner's Landlock rules name it
        env[pch.ENV_DIR] = str(pch_root)
    return launch_shim.preload_env(device, env)
