"""Count launches of the candidate's own kernels (Triton JIT functions, load_inline extensions).

Installed once in the worker before any candidate is imported. A candidate whose forward launches
none of its own kernels earns the ``no_custom_kernel`` flag.

With ``knockout`` set (one call at the end of a job, ``correctness.kernels_needed``) the same hooks make those
kernels do nothing: a Triton launch runs no program (a zero grid), an extension function runs on copies of its
arguments and its tensor results are spoiled. A forward whose answer is still right did not need its kernels.
Where the runner has the preloaded launch shim (launch_shim.py: GPU runners, ``KB_GYM_LAUNCH_SHIM=1``) extensions
are counted and knocked out per device launch instead: their own kernels are skipped, the ``torch::`` ops around
them run.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kb_gym.worker.cuda_source import launches_own_kernel


class LaunchCounter:
    def __init__(self, device_kernels_only: bool = False) -> None:
        self._counted = 0
        self.backends: set[str] = set()
        self._knockout = False
        # On a GPU an extension's functions count only where its CUDA sources launch a kernel of their own
        # (``__global__``): a function that computes with ``torch::`` ops is PyTorch under another name (round 12),
        # and a ``__global__`` in a comment or never launched beside it changes nothing
        self.device_kernels_only = device_kernels_only
        # The preloaded launch shim (launch_shim.py), where the runner has one: it counts and knocks out the
        # extensions' own device launches one by one, in place of the per-function count and spoiling below
        self.shim: Any = None
        self._shim_base = 0
        # One traced forward (dataflow.py) where set: every launch of the candidate's goes through its ``launch``
        self.dataflow: Any = None
        self._internal = 0  # > 0 while the runner launches kernels of its own (the device digest) mid-forward

    @property
    def count(self) -> int:
        """Launches of the candidate's own kernels since the last ``reset``."""
        own = self.shim.own_launches() - self._shim_base if self.shim is not None else 0
        return self._counted + own

    @count.setter
    def count(self, value: int) -> None:
        self._counted = value - (self.count - self._counted)

    @property
    def knockout(self) -> bool:
        return self._knockout

    @knockout.setter
    def knockout(self, on: bool) -> None:
        self._knockout = on
        if self.shim is not None:
            self.shim.set_knockout(on)

    @contextlib.contextmanager
    def internal(self) -> Iterator[None]:
        """Launches under this are the runner's own: neither counted nor traced."""
        self._internal += 1
        try:
            yield
        finally:
            self._internal -= 1

    def tracing(self) -> Any:
        """The dataflow trace a launch of the candidate's goes through now, or None (every timed call: nothing more
        is done per launch than this check)."""
        trace = self.dataflow
        return None if trace is None or trace.quiet else trace

    def reset(self) -> None:
        self._counted = 0
        if self.shim is not None:
            self._shim_base = self.shim.own_launches()

    def install(self) -> None:
        self._hook_triton()
        self._hook_cpp_extensions()

    def _hook_triton(self) -> None:
        try:
            import triton.runtime.jit as jit
        except Exception:  # noqa: BLE001 - no Triton: nothing to count
            return
        classes = [jit.JITFunction]
        try:
            import triton.runtime.interpreter as interpreter

            classes.append(interpreter.InterpretedFunction)
        except Exception:  # noqa: BLE001
            pass
        for cls in classes:
            original = cls.run
            if getattr(original, "_kb_counted", False):
                continue

            def run(kernel: Any, *args: Any, _original=original, **kwargs: Any) -> Any:
                if self._internal:
                    return _original(kernel, *args, **kwargs)
                if not kwargs.get("warmup", False):
                    self._counted += 1
                    self.backends.add("triton")
                    if self.knockout:
                        # Triton's own path with no program to run (a grid of zero: its launcher launches nothing):
                        # pre-run hooks run and the launch returns what a real one does, so neither tells the
                        # knocked-out call (round 13: a skip returned None, a real launch its compiled kernel, on a
                        # GPU; and PyTorch's work put in a pre-run hook was skipped with it)
                        kwargs["grid"] = (0,)
                    trace = self.tracing()
                    if trace is not None:
                        name = f"triton:{getattr(kernel, '__name__', type(kernel).__name__)}"
                        return trace.launch(name, args, kwargs, lambda: _original(kernel, *args, **kwargs))
                return _original(kernel, *args, **kwargs)

            run._kb_counted = True  # type: ignore[attr-defined]
            cls.run = run

    def _hook_cpp_extensions(self) -> None:
        import torch.utils.cpp_extension as cpp

        for name in ("load_inline", "load"):
            original = getattr(cpp, name)
            if getattr(original, "_kb_counted", False):
                continue

            @functools.wraps(original)
            def loader(*args: Any, _original=original, _name=name, **kwargs: Any) -> Any:
                module = _original(*args, **kwargs)
                if not isinstance(module, types.ModuleType):
                    return module
                if self.shim is None and self.device_kernels_only and not _defines_device_kernel(_name, args, kwargs):
                    return module
                return CountingModule(module, self)

            loader._kb_counted = True  # type: ignore[attr-defined]
            setattr(cpp, name, loader)


def _defines_device_kernel(loader: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the CUDA sources given to ``load_inline`` (or the ``.cu`` files given to ``load``) launch a
    ``__global__`` function of their own (``cuda_source.launches_own_kernel``). Unreadable sources count as
    launching one: the count stays what it was."""
    try:
        if loader == "load_inline":
            sources = kwargs.get("cuda_sources", args[2] if len(args) > 2 else None)
            texts = [sources] if isinstance(sources, str) else list(sources or [])
        else:
            files = kwargs.get("sources", args[1] if len(args) > 1 else [])
            files = [files] if isinstance(files, str) else list(files)
            texts = [Path(f).read_text(errors="replace") for f in files if str(f).endswith((".cu", ".cuh"))]
        return launches_own_kernel([str(t) for t in texts])
    except Exception:  # noqa: BLE001
        return True


class CountingModule:
    """Stands in for a compiled extension module and counts calls to its functions."""

    def __init__(self, module: types.ModuleType, counter: LaunchCounter) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_counter", counter)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if callable(value) and not isinstance(value, type):
            counter = self._counter

            @functools.wraps(value)
            def call(*args: Any, **kwargs: Any) -> Any:
                if counter.shim is not None:  # the shim counts its device launches and knocks them out
                    before = counter.shim.own_launches()
                    try:
                        return _run(counter, name, value, args, kwargs)
                    finally:
                        if counter.shim.own_launches() > before:
                            counter.backends.add("cuda")
                counter._counted += 1
                counter.backends.add("cuda")
                if counter.knockout:
                    copied = dict(zip(kwargs, _copies(kwargs.values()), strict=True))
                    return _spoiled(value(*_copies(args), **copied))
                return _run(counter, name, value, args, kwargs)

            return call
        return value

    def __dir__(self) -> list[str]:
        return dir(self._module)


def _run(counter: LaunchCounter, name: str, function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """An extension function called, through the dataflow trace where one is on."""
    trace = counter.tracing()
    if trace is None:
        return function(*args, **kwargs)
    return trace.launch(f"ext:{name}", args, kwargs, lambda: function(*args, **kwargs))


def _copies(values: Any) -> list[Any]:
    """Tensors (and lists of them) copied: what a function writes in place is lost."""
    import torch

    def copy(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.clone()
        if isinstance(v, (list, tuple)):
            return type(v)(copy(x) for x in v)
        return v

    return [copy(v) for v in values]


def _spoiled(result: Any) -> Any:
    """The function's tensor results overwritten: NaN where floating, random values elsewhere (an index output
    left as computed would still be right)."""
    import torch

    if isinstance(result, torch.Tensor):
        with torch.no_grad():
            if result.is_floating_point() or result.is_complex():
                result.fill_(float("nan"))
            else:
                result.random_()
    elif isinstance(result, (list, tuple)):
        for r in result:
            _spoiled(r)
    return result
