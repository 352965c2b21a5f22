"""Prompts: turn an observation (reference code + feedback) into a prompt string or chat messages.

One backend per kernel language, picked by name (``"triton"``, ``"cuda"``), each with its own
rules and a one-shot example written for kb_gym: a small reference ``Model`` and a ``ModelNew``
for it that passes the evaluator. ``build_prompt`` gives one string (base models, completion
APIs); ``build_messages`` gives ``[{"role": "system", ...}, {"role": "user", ...}]`` for chat
templates. Both include the feedback on the previous attempt when there is any (multi-turn).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

EXAMPLE_REFERENCE = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    """out = relu(x * scale + y), elementwise."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        return torch.relu(x * self.scale + y)


size = 4096


def get_inputs():
    return [torch.randn(size), torch.randn(size)]


def get_init_inputs():
    return [0.5]
'''

TRITON_EXAMPLE = '''\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_add_relu_kernel(x_ptr, y_ptr, out_ptr, scale, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x * scale + y, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        BLOCK = 1024
        scale_add_relu_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, self.scale, n, BLOCK=BLOCK)
        return out
'''

CUDA_EXAMPLE = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# The kernel and its launcher name nothing of torch: nvcc then compiles no torch headers (seconds, not a minute).
cuda_source = r"""
#include <cuda_runtime.h>
#include <cstdint>

__global__ void scale_add_relu_kernel(const float* x, const float* y, float* out, float scale, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i] * scale + y[i];
        out[i] = v > 0.0f ? v : 0.0f;
    }
}

void scale_add_relu_launch(const float* x, const float* y, float* out, float scale, int64_t n, cudaStream_t stream) {
    const int threads = 256;
    const int blocks = (int)((n + threads - 1) / threads);
    scale_add_relu_kernel<<<blocks, threads, 0, stream>>>(x, y, out, scale, n);
}
"""

# The torch side: checks, allocation and the stream, compiled as C++.
cpp_source = r"""
#include <c10/cuda/CUDAStream.h>
#include <cstdint>

void scale_add_relu_launch(const float* x, const float* y, float* out, float scale, int64_t n, cudaStream_t stream);

torch::Tensor scale_add_relu(torch::Tensor x, torch::Tensor y, double scale) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto yc = y.contiguous();
    auto out = torch::empty_like(xc);
    scale_add_relu_launch(xc.data_ptr<float>(), yc.data_ptr<float>(), out.data_ptr<float>(), (float)scale,
                          xc.numel(), c10::cuda::getCurrentCUDAStream());
    return out;
}
"""

scale_add_relu = load_inline(name="scale_add_relu", cpp_sources=cpp_source, cuda_sources=cuda_source,
                             functions=["scale_add_relu"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        return scale_add_relu.scale_add_relu(x, y, self.scale)
'''

COMMON_RULES: tuple[str, ...] = (
    "Define `class ModelNew(nn.Module)`, a drop-in replacement for `Model`: the same `__init__` "
    "arguments and the same `forward` arguments, returning the same outputs (shape, dtype, and "
    "values within a small tolerance). It is built with `get_init_inputs()` and called with "
    "`get_inputs()`, exactly like `Model`.",
    "If `Model` has parameters or submodules (nn.Linear, nn.Conv2d, ...), create the same ones in "
    "the same order in `ModelNew.__init__`, so that seeded initialisation gives them the same "
    "values; your kernels may read their weights.",
    "Do the computation in your own {language} kernels. PyTorch may allocate outputs and "
    "reshape tensors, but a `ModelNew` that calls PyTorch operators for the real work, or falls "
    "back to PyTorch when a kernel fails, earns no speed credit.",
    "Do not modify the inputs in place, cache results between calls, run work on other streams "
    "or threads, or touch the evaluation harness, its timers or its random seeds.",
    "Answer with the complete, self-contained program (imports, kernels, `ModelNew`) in a single "
    "Markdown code block fenced as python. `get_inputs`, "
    "`get_init_inputs`, tests and a main block are not needed.",
)


@dataclass(frozen=True)
class PromptBackend:
    """A kernel language: its name, the rules specific to it and a one-shot example.

    ``example_reference`` is a KernelBench-format problem and ``example_solution`` a ``ModelNew``
    for it that the evaluator accepts (tests/test_prompts.py checks the Triton one on CPU).
    """

    name: str
    language: str
    rules: tuple[str, ...]
    example_reference: str
    example_solution: str


BACKENDS: dict[str, PromptBackend] = {
    "triton": PromptBackend(
        name="triton",
        language="Triton",
        rules=(
            "Write the kernels in Triton (`import triton`, `import triton.language as tl`, "
            "`@triton.jit`) and launch them from `forward`. Make block sizes `tl.constexpr` and mask "
            "loads and stores at the edges.",
            "float32 problems are checked in true float32 (relative error about 1e-4): `tl.dot` on "
            "float32 inputs uses TF32 unless you pass `input_precision=\"ieee\"`, and TF32 fails the check.",
        ),
        example_reference=EXAMPLE_REFERENCE,
        example_solution=TRITON_EXAMPLE,
    ),
    "cuda": PromptBackend(
        name="cuda",
        language="CUDA",
        rules=(
            "Write the kernels in CUDA C++ and compile them at import time with "
            "`torch.utils.cpp_extension.load_inline`: kernels and their launchers in `cuda_sources`, the "
            "`torch::Tensor` functions that check inputs, allocate outputs and call the launchers in "
            "`cpp_sources`, the exported names in `functions`. Keep torch out of `cuda_sources` (raw "
            "pointers and a `cudaStream_t`): nvcc then compiles no torch headers, seconds instead of a minute.",
            "Launch kernels on PyTorch's current stream (`c10::cuda::getCurrentCUDAStream()` from "
            "`<c10/cuda/CUDAStream.h>`), and make inputs contiguous before indexing them as flat arrays.",
            "float32 problems are checked in true float32 (relative error about 1e-4): TF32 or half "
            "precision tensor-core math fails the check.",
        ),
        example_reference=EXAMPLE_REFERENCE,
        example_solution=CUDA_EXAMPLE,
    ),
}
"""Every prompt backend, by name. Add one with :func:`register_backend`."""

DEFAULT_BACKEND = "triton"
# Said in words, not with backticks: a completion that echoes three backticks in its prose confuses
# fence parsers that look for a fence anywhere in a line.
_BLOCK = "python code block"


def list_backends() -> list[str]:
    """Names of every registered backend, sorted."""
    return sorted(BACKENDS)


def get_backend(backend: str | PromptBackend = DEFAULT_BACKEND) -> PromptBackend:
    """The backend named ``backend``; a ValueError lists the known names for an unknown one."""
    if isinstance(backend, PromptBackend):
        return backend
    if isinstance(backend, str) and backend.strip().lower() in BACKENDS:
        return BACKENDS[backend.strip().lower()]
    raise ValueError(f"Unknown prompt backend {backend!r}. Known backends: {', '.join(list_backends())}.")


def register_backend(backend: PromptBackend, *, overwrite: bool = False) -> PromptBackend:
    """Add ``backend`` to :data:`BACKENDS`; a taken name raises ValueError unless ``overwrite``."""
    if backend.name in BACKENDS and not overwrite and BACKENDS[backend.name] is not backend:
        raise ValueError(f"Prompt backend {backend.name!r} is already registered; pass overwrite=True.")
    BACKENDS[backend.name] = backend
    return backend


def fence(code: str, lang: str = "python") -> str:
    """``code`` in a Markdown fenced block whose fence is longer than any backtick run inside it."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{code.rstrip()}\n{ticks}"


def build_system_prompt(backend: str | PromptBackend = DEFAULT_BACKEND) -> str:
    """The task statement and the rules (the system message of :func:`build_messages`)."""
    spec = get_backend(backend)
    rules = [rule.format(language=spec.language) for rule in COMMON_RULES[:-1]]
    rules += list(spec.rules) + [COMMON_RULES[-1]]
    numbered = "\n".join(f"{i}. {rule}" for i, rule in enumerate(rules, 1))
    return (
        "You are an expert GPU kernel engineer. You are given a PyTorch reference program: a "
        "`Model` class with `get_inputs()` (the forward arguments) and `get_init_inputs()` (the "
        f"constructor arguments). Write `ModelNew`, a faster replacement whose forward runs custom "
        f"{spec.language} kernels. It is checked against `Model` on random inputs and timed against "
        "PyTorch on the GPU: only a correct kernel counts, and a faster one scores higher.\n\n"
        f"Rules:\n{numbered}"
    )


def tool_closing(submissions: int) -> str:
    """How to answer when the model has the ``submit_kernel`` tool (training/tool_env.py)."""
    return ("Submit the complete program defining `ModelNew` by calling the `submit_kernel` tool with it as `code`. "
            "Each call returns the verdict (correct, incorrect, compile_error, ...) with the speedup or what went "
            f"wrong: fix it and submit again, up to {submissions} time(s); your best submission counts.")


def build_user_prompt(reference: str, feedback: str = "", backend: str | PromptBackend = DEFAULT_BACKEND, *,
                      previous_code: str | None = None, one_shot: bool = True, tool_calls: int | None = None) -> str:
    """The example, the task's reference code and, when given, the previous attempt and its feedback.
    ``tool_calls``: the model answers through the ``submit_kernel`` tool, at most that many times."""
    spec = get_backend(backend)
    parts = []
    if one_shot:
        parts.append("Example reference program:\n\n" + fence(spec.example_reference))
        parts.append(f"A valid answer for it ({spec.language}):\n\n" + fence(spec.example_solution))
    parts.append("Your task. The reference program:\n\n" + fence(reference))
    if previous_code and previous_code.strip():
        parts.append("Your previous attempt:\n\n" + fence(previous_code))
    if feedback and feedback.strip():
        parts.append("Feedback on your previous attempt:\n\n" + feedback.strip())
        closing = ("Fix what the feedback reports, or make the kernel faster if it is already correct. "
                   f"Answer with the complete program defining `ModelNew` in a single {_BLOCK}.")
    else:
        closing = f"Write `ModelNew` for this reference. Answer with the complete program in a single {_BLOCK}."
    parts.append(tool_closing(tool_calls) if tool_calls else closing)
    return "\n\n".join(parts)


def build_messages(reference: str, feedback: str = "", backend: str | PromptBackend = DEFAULT_BACKEND, *,
                   previous_code: str | None = None, one_shot: bool = True,
                   system: bool = True, tool_calls: int | None = None) -> list[dict[str, str]]:
    """Chat messages: a system message with the rules, a user message with the example and the task.

    ``system=False`` puts everything in one user message, for chat templates without a system role.
    ``tool_calls``: the task says to answer through the ``submit_kernel`` tool (at most that many calls).
    """
    system_text = build_system_prompt(backend)
    user_text = build_user_prompt(reference, feedback, backend, previous_code=previous_code, one_shot=one_shot,
                                  tool_calls=tool_calls)
    if not system:
        return [{"role": "user", "content": system_text + "\n\n" + user_text}]
    return [{"role": "system", "content": system_text}, {"role": "user", "content": user_text}]


def build_prompt(reference: str, feedback: str = "", backend: str | PromptBackend = DEFAULT_BACKEND, *,
                 previous_code: str | None = None, one_shot: bool = True) -> str:
    """One prompt string: the rules, the one-shot example, the reference and any feedback."""
    return "\n\n".join(m["content"] for m in build_messages(reference, feedback, backend,
                                                             previous_code=previous_code, one_shot=one_shot))


def observation_messages(observation: Mapping[str, str], backend: str | PromptBackend = DEFAULT_BACKEND,
                         **kwargs: object) -> list[dict[str, str]]:
    """:func:`build_messages` for an env observation (``{"reference": ..., "feedback": ...}``)."""
    return build_messages(observation["reference"], observation.get("feedback", ""), backend, **kwargs)  # type: ignore[arg-type]


def observation_prompt(observation: Mapping[str, str], backend: str | PromptBackend = DEFAULT_BACKEND,
                       **kwargs: object) -> str:
    """:func:`build_prompt` for an env observation (``{"reference": ..., "feedback": ...}``)."""
    return build_prompt(observation["reference"], observation.get("feedback", ""), backend, **kwargs)  # type: ignore[arg-type]


__all__ = ["BACKENDS", "COMMON_RULES", "CUDA_EXAMPLE", "DEFAULT_BACKEND", "EXAMPLE_REFERENCE", "PromptBackend",
           "TRITON_EXAMPLE", "build_messages", "build_prompt", "build_system_prompt", "build_user_prompt",
           "fence", "get_backend", "list_backends", "observation_messages", "observation_prompt",
           "register_backend"]
