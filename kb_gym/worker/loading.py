"""Loading a problem or candidate module from source, and the error text the policy sees."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

from kb_gym.result import Status

# What a StageError can say: every verdict but "correct" (a status a runner reported, taken at its word, once
# named the verdict: round 9). Anything else becomes a runtime_error.
FAILURE_STATUSES = tuple(s.value for s in Status if s is not Status.CORRECT)


class StageError(Exception):
    """A failure with a verdict attached: status and a message for the policy."""

    def __init__(self, status: str, message: str, restart: bool = False, flags: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status if status in FAILURE_STATUSES else "runtime_error"
        self.message = message
        self.restart = restart
        self.flags = flags


def load_module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_source(code: str, name: str) -> Any:
    """``code`` imported as module ``name`` from a file of its own (Triton reads a kernel's source file)."""
    path = Path(tempfile.mkdtemp(prefix="kb_gym_source_")) / f"{name}.py"
    path.write_text(code)
    return load_module(path, name)


def trim_traceback(exc: BaseException, candidate_file: str) -> str:
    """The exception with the frames that matter to the policy: its own file's, and the last."""
    frames = traceback.extract_tb(exc.__traceback__)
    keep = [f for f in frames if f.filename == candidate_file]
    if frames and (not keep or keep[-1] is not frames[-1]):
        keep.append(frames[-1])
    lines = [f'  File "{Path(f.filename).name}", line {f.lineno}, in {f.name}\n    {f.line or ""}'
             for f in keep[-6:]]
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return ("Traceback (most relevant frames):\n" + "\n".join(lines) + "\n" if lines else "") + message


def check_signature(cls: type, method: str, args: list[Any], ref_cls: type) -> None:
    try:
        inspect.signature(getattr(cls, method)).bind(None, *args)
    except TypeError as exc:
        ref_sig = inspect.signature(getattr(ref_cls, method))
        raise StageError("compile_error",
                         f"ModelNew.{method} cannot take the reference's arguments ({len(args)} given): {exc}. "
                         f"Model.{method} is {ref_sig}; ModelNew must accept the same arguments.") from None
    except (ValueError, AttributeError):
        pass  # builtins without a signature: let the call decide


def sticky_cuda_error(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        torch.cuda.synchronize(device)
        torch.zeros(1, device=device).add_(1).item()
        return False
    except Exception:  # noqa: BLE001 - any failure here means the context is unusable
        return True


OUT_OF_DEVICE_MEMORY = "out of memory on the device"  # how a runner's error names it (runner._send_exception)


def out_of_device_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the GPU's memory running out: PyTorch's allocator, or cuBLAS's workspace (a RuntimeError
    naming CUBLAS_STATUS_ALLOC_FAILED). Inside a runner torch's caching allocator can fail to say so: composing its
    OOM message it starts NVML, which the sandbox keeps from working, and raises an internal assert on
    ``nvmlInit_v2_()`` instead (H200, torch 2.11: every OOM of a runner). Called only on that path, the assert means
    the allocation failed."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("CUDACachingAllocator" in text and "nvmlInit" in text
                                              or "CUBLAS_STATUS_ALLOC_FAILED" in text)
