"""Fewer torch headers in candidates' CUDA translation units: the larger part of a cold ``load_inline`` build.

``load_inline`` prepends ``#include <torch/types.h>`` to every ``cuda_sources``, and the usual candidate (the
KernelBench pattern) includes ``torch/extension.h`` there as well. nvcc then runs its front end (cudafe++),
the device compiler (cicc) and the host compiler over 15-30 MB of preprocessed torch, pybind11 and Python
headers. Measured on the 2-core CPU machine (nvcc 13, sm_90, one .cu; docs/benchmarks.md):

- the KernelBench pattern as written: 126 s; with ``torch/extension.h`` left out of the .cu (``torch/types.h``,
  which declares ``torch::Tensor``, the factories, ``TORCH_CHECK`` and the dispatch macros, still prepended):
  54 s;
- a .cu that names nothing of torch (kernels only; the wrapper in ``cpp_sources``): 58 s as load_inline
  builds it, 1.5 s without the prepended header.

So, in a runner, before the candidate is imported, ``install`` wraps ``load_inline``:

- ``lean``: CUDA sources that name nothing of torch are built with ``no_implicit_headers`` and only CUDA's
  headers prepended (``LEAN_PREFIX``); the C++ sources get exactly the ``#include
  <torch/extension.h>`` load_inline would have added, so ``main.cpp`` and its precompiled header are unchanged.
- ``trimmed``: CUDA sources that use torch but nothing beyond ``torch/types.h`` (no pybind11, ``torch::nn``,
  autograd, ...) have their ``torch/extension.h``-style includes removed.
- A dieted build that fails for want of a declaration is built again exactly as written (``fallback``), and a
  marker in the build folder makes later loads of the same build (the build cache) skip straight to that; any
  other compiler error is the candidate's and stands.

What is built is still the candidate's code, and what it computes is judged as before: the diet changes
which declarations are in scope, never what a compiled kernel does (a source that needs one it lost fails
to compile and is built as written).
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from pathlib import Path
from typing import Any

FALLBACK_MARKER = ".kb_gym_built_as_written"
ENV_SWITCH = "KB_GYM_HEADER_DIET"  # "0": every build as written
MODES = ("lean", "trimmed", "as written", "fallback", "lean, failed", "trimmed, failed")
# Anything of torch, ATen, c10, pybind11 or Python: a CUDA source naming none of these needs no torch header.
_NAMES_TORCH = re.compile(r"\b(?:torch|at|c10|py|pybind11|caffe2)\s*::|#\s*include\s*[<\"](?:torch|ATen|c10|caffe2|"
                          r"pybind11|Python)|\b(?:TORCH|AT|C10|PYBIND11|C10D)_[A-Z0-9_]+\b|\b(?:Tensor|IntArrayRef|"
                          r"ScalarType|Scalar|kFloat|kHalf|kBFloat16)\b")
# What torch/extension.h declares beyond torch/types.h (torch/all.h's API, pybind11), or output streams.
_BEYOND_TYPES = re.compile(r"\bpy\s*::|pybind11|PYBIND11|\btorch\s*::\s*(?:nn|optim|jit|data|autograd|cuda|fft|linalg|"
                           r"special|serialize|save|load|manual_seed|NoGradGuard|AutoGradMode|InferenceMode|python|"
                           r"utils|Library|stable|nested|sparse|enable_grad|no_grad)\b|\bNoGradGuard\b|"
                           r"\bInferenceMode\b|\bTORCH_LIBRARY|\bstd\s*::\s*(?:cout|cerr|clog|endl)\b|iostream|"
                           r"THPVariable|\bPyObject\b")
_WHOLE_API = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"]torch/(?:extension|torch|all|python)\.h[>\"][^\n]*$",
                        re.MULTILINE)
# Three lines, as load_inline's own prefix: a compiler message's line numbers stay those of the usual build.
# cuda_bf16.h includes cuda_fp16.h (the half types c10 would have brought in).
LEAN_PREFIX = "#include <cuda.h>\n#include <cuda_runtime.h>\n#include <cuda_bf16.h>"
# A failed build of a dieted source is built again as written only where the errors could be a lost declaration
# (nvcc's front end, then GCC's wording): any other error is the candidate's, and the same as written.
_MISSING_DECLARATION = re.compile(r"is undefined|has no member|must be a class or namespace name|no instance of|"
                                  r"incomplete type|is not a template|explicit type is missing|was not declared|"
                                  r"has not been declared|is not a member of|does not name a type|not declared in|"
                                  r"no matching function|no operator|no suitable")


def _joined(sources: Any) -> str | None:
    if isinstance(sources, str):
        return sources
    if isinstance(sources, list | tuple) and all(isinstance(s, str) for s in sources):
        return "\n".join(sources)
    return None


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def plan(cuda_sources: Any) -> tuple[str, str | None]:
    """The diet for these CUDA sources: ("lean" | "trimmed", the source to build) or ("as written", None)."""
    cuda = _joined(cuda_sources)
    if not cuda:
        return "as written", None
    code = _COMMENT.sub(" ", cuda)  # comments decide nothing ("//" in a string: at worst a failed diet first)
    if not _NAMES_TORCH.search(code):
        return "lean", LEAN_PREFIX + "\n" + cuda
    if _WHOLE_API.search(code) and not _BEYOND_TYPES.search(code):
        return "trimmed", _WHOLE_API.sub("", cuda)  # the lines emptied, not removed: line numbers stay
    return "as written", None


def build_directory(name: str, kwargs: dict[str, Any]) -> Path | None:
    """Where torch builds extension ``name`` (its ``build_directory``, else the runner's TORCH_EXTENSIONS_DIR/name)."""
    if kwargs.get("build_directory"):
        return Path(kwargs["build_directory"])
    root = os.environ.get("TORCH_EXTENSIONS_DIR")  # a runner's scratch/ext: torch builds in root/name
    return Path(root) / name if root else None


def _lost_declaration(exc: BaseException) -> bool:
    """Whether a dieted build's failure could be a declaration the diet took away."""
    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    if cause is not None:  # torch raises "Error building extension" from the compiler's output
        output = getattr(cause, "output", None) or b""
        text += "\n" + (output.decode("utf-8", "replace") if isinstance(output, bytes) else str(output))
    return isinstance(exc, ImportError) or bool(_MISSING_DECLARATION.search(text))


def record_of(value: Any) -> list[str]:
    """A runner's report of its builds' diets, as the judge keeps it: known names only, a few of them."""
    return [v for v in value if v in MODES][:16] if isinstance(value, list) else []


def install(record: list[str]) -> None:
    """Wrap ``torch.utils.cpp_extension.load_inline`` in this process; each call's diet is appended to
    ``record`` ("lean", "trimmed", "as written", or "fallback" where the dieted source failed to build)."""
    import torch.utils.cpp_extension as cpp_extension

    original = cpp_extension.load_inline
    if "no_implicit_headers" not in inspect.signature(original).parameters:  # torch before 2.8
        return

    @functools.wraps(original)
    def load_inline(name: Any, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        plain = not args and not kwargs.get("no_implicit_headers") and _joined(cpp_sources) is not None
        mode, source = plan(cuda_sources) if plain else ("as written", None)
        folder = build_directory(name, kwargs) if isinstance(name, str) else None
        if source is None or folder is None or (folder / FALLBACK_MARKER).exists():
            record.append("fallback" if source is not None and folder is not None else "as written")
            return original(name, cpp_sources, cuda_sources, *args, **kwargs)
        dieted = dict(kwargs)
        cpp = cpp_sources
        if mode == "lean":  # load_inline's own C++ header, as it would add it: main.cpp stays the same
            cpp = ["#include <torch/extension.h>", *([cpp_sources] if isinstance(cpp_sources, str) else cpp_sources)]
            dieted["no_implicit_headers"] = True
        try:
            module = original(name, cpp, [source], **dieted)
        except (RuntimeError, OSError, ImportError) as exc:
            if not _lost_declaration(exc):
                record.append(f"{mode}, failed")
                raise
            folder.mkdir(parents=True, exist_ok=True)
            (folder / FALLBACK_MARKER).write_text(mode)
            record.append("fallback")
            return original(name, cpp_sources, cuda_sources, *args, **kwargs)
        record.append(mode)
        return module

    cpp_extension.load_inline = load_inline
