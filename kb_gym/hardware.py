"""Hardware fingerprint: what a timing is only comparable across."""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import subprocess
from typing import Any


def _driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - fall back to the CLI
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(device: str) -> dict[str, Any]:
    """GPU (or CPU) name, driver, torch/CUDA/Triton versions, and a short hash of them all."""
    import torch

    info: dict[str, Any] = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda or ""}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = ""
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        info.update(name=props.name, capability=f"{props.major}.{props.minor}",
                    memory_gb=round(props.total_memory / 2**30, 1), driver=_driver_version(),
                    uuid=str(getattr(props, "uuid", "")))  # this GPU, whatever CUDA_VISIBLE_DEVICES calls it
    else:
        info.update(name=_cpu_name(), capability="cpu", driver="", threads=torch.get_num_threads())
    info["host"] = socket.gethostname()
    key = {k: info[k] for k in ("name", "driver", "torch", "cuda", "triton", "capability")}
    info["hash"] = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return info
