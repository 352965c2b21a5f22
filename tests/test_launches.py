"""The launch counter's knockout (kb_gym/worker/launches.py): with it set, the candidate's own kernels do nothing,
so a forward that still answers right did not need them (``token_kernel``). And which CUDA sources count as
launching a kernel of their own (kb_gym/worker/cuda_source.py)."""

from __future__ import annotations

import types

import pytest
import torch

from kb_gym.worker.cuda_source import code_only, defined_kernels, launches_own_kernel
from kb_gym.worker.launches import CountingModule, LaunchCounter


def _extension() -> types.ModuleType:
    """Stands in for a load_inline module: one function writes its output argument, two return results."""
    module = types.ModuleType("fake_ext")

    def scale_into(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(x * 2)

    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def argmax_and_max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.argmax(dim=1), x.amax(dim=1)

    module.scale_into, module.scaled, module.argmax_and_max = scale_into, scaled, argmax_and_max
    return module


def test_an_extension_function_counts_and_runs_as_always_without_the_knockout():
    counter = LaunchCounter()
    ext = CountingModule(_extension(), counter)
    x, out = torch.arange(6.0).reshape(2, 3), torch.zeros(2, 3)
    ext.scale_into(x, out)
    assert torch.equal(out, x * 2) and torch.equal(ext.scaled(x), x * 2)
    assert counter.count == 2 and counter.backends == {"cuda"}


def test_the_knockout_loses_what_an_extension_writes_and_spoils_what_it_returns():
    counter = LaunchCounter()
    ext = CountingModule(_extension(), counter)
    x, out = torch.arange(6.0).reshape(2, 3), torch.zeros(2, 3)
    counter.knockout = True
    ext.scale_into(x, out)
    assert torch.equal(out, torch.zeros(2, 3)), "written into a copy"
    assert torch.isnan(ext.scaled(x)).all()
    wide = torch.randn(64, 1000)
    index, values = ext.argmax_and_max(wide)
    assert torch.isnan(values).all()
    # an index output left as computed would still be right: it is overwritten with random values
    assert index.dtype == torch.int64 and not torch.equal(index, wide.argmax(dim=1))
    assert counter.count == 3, "the calls still count"
    counter.knockout = False
    assert torch.equal(ext.scaled(x), x * 2)


def test_on_a_gpu_only_extensions_that_define_a_device_kernel_count(monkeypatch, tmp_path):
    """An extension function that computes with ``torch::`` ops is PyTorch under another name (round 12: ``x * 2 + 1``
    in a C++ function kept its speed credit): on a GPU an extension counts only where its CUDA sources define a
    ``__global__`` function. On the CPU every extension counts (CPU tests build C++ ones)."""
    import torch.utils.cpp_extension as cpp

    monkeypatch.setattr(cpp, "load_inline", lambda *a, **k: _extension())
    monkeypatch.setattr(cpp, "load", lambda *a, **k: _extension())
    monkeypatch.setattr(LaunchCounter, "_hook_triton", lambda self: None)  # Triton's classes stay as they are here
    counter = LaunchCounter(device_kernels_only=True)
    counter.install()
    kernel = "__global__ void k(float* x) { x[0] = 1.0f; }\nvoid run(float* x) { k<<<1, 1>>>(x); }\n"
    wrapper_only = "torch::Tensor scaled(torch::Tensor x) { return x * 2 + 1; }\n"
    assert isinstance(cpp.load_inline("a", "", cuda_sources=[kernel]), CountingModule)
    assert isinstance(cpp.load_inline("b", "", [kernel, wrapper_only]), CountingModule)
    assert not isinstance(cpp.load_inline("c", "", cuda_sources=wrapper_only), CountingModule)
    assert not isinstance(cpp.load_inline("d", wrapper_only), CountingModule)
    cu = tmp_path / "k.cu"
    cu.write_text(kernel)
    assert isinstance(cpp.load("e", sources=[str(cu)]), CountingModule)
    cu.write_text(wrapper_only)
    assert not isinstance(cpp.load("f", [str(cu)]), CountingModule)
    on_cpu = LaunchCounter()
    monkeypatch.setattr(cpp, "load_inline", lambda *a, **k: _extension())
    on_cpu.install()
    assert isinstance(cpp.load_inline("g", wrapper_only), CountingModule)


KERNEL = (
    "__global__ void scale_k(const float* x, float* y, long n) { long i = threadIdx.x; if (i < n) y[i] = 2 * x[i]; }\n"
)
TORCH_OPS = "torch::Tensor run(torch::Tensor x) { return x * 2; }\n"


@pytest.mark.parametrize(
    "source",
    [
        # the decoration of round 12's leftover: a kernel in a comment, in a string, or defined and never launched
        "// __global__ void scale_k(float* x) {}\n" + TORCH_OPS,
        "/* __global__ void scale_k(float* x) {}\n scale_k<<<1, 1>>>(x); */\n" + TORCH_OPS,
        'const char* s = "__global__ void scale_k(float* x) { } scale_k<<<1,1>>>(x);";\n' + TORCH_OPS,
        'const char* s = R"raw(__global__ void scale_k(float* x) { } scale_k<<<1,1>>>(x);)raw";\n' + TORCH_OPS,
        KERNEL + TORCH_OPS,
        KERNEL + "torch::Tensor run(torch::Tensor x) { (void)scale_k; /* scale_k<<<1, 1>>> */ return x * 2; }\n",
        KERNEL + "torch::Tensor run(torch::Tensor x) { // scale_k<<<1, 1>>>(x, x, 0);\n return x * 2; }\n",
        "torch::Tensor run(torch::Tensor x) { return x * 2; }  // other_k<<<1, 1>>>\n",
    ],
)
def test_a_kernel_that_is_not_launched_does_not_make_torch_ops_a_kernel(source):
    assert not launches_own_kernel([source])


@pytest.mark.parametrize(
    "launch",
    [
        "scale_k<<<blocks, 256>>>(x, y, n);",
        "scale_k <<< blocks, 256, 0, stream >>> (x, y, n);",
        "cudaLaunchKernel((const void*)scale_k, grid, block, args, 0, stream);",
        "cudaLaunchKernel(reinterpret_cast<void*>(&scale_k), grid, block, args, 0, nullptr);",
    ],
)
def test_a_launched_kernel_counts(launch):
    assert launches_own_kernel([KERNEL, "void run(const float* x, float* y, long n) {\n  " + launch + "\n}\n"])


def test_templates_launch_bounds_extern_c_and_launch_macros_are_read():
    templated = (
        'template <typename T, int N>\nextern "C" __global__ void __launch_bounds__(256, 2) tile_k(const T* x) {}\n'
        "void run(const float* x) { tile_k<float, Tile<4>::value><<<1, 256>>>(x); }\n"
    )
    assert defined_kernels(templated) == ["tile_k"]
    assert launches_own_kernel([templated])
    by_macro = (
        KERNEL
        + "#define LAUNCH(k, n) k<<<((n) + 255) / 256, 256>>>\nvoid run(float* x, float* y, long n) { LAUNCH(scale_k, n)(x, y, n); }\n"
    )
    assert launches_own_kernel([by_macro])
    # a kernel defined in one source and launched from another of the same extension
    assert launches_own_kernel([KERNEL, "void run(float* x, float* y, long n) { scale_k<<<1, 32>>>(x, y, n); }"])


def test_blanking_keeps_code_and_drops_comments_and_literals():
    code = code_only('int a = 1; // x\nconst char* s = "/* not a comment"; /* gone */ char c = \'"\'; int b = 2;')
    assert "int a = 1;" in code and "int b = 2;" in code
    assert "gone" not in code and "not a comment" not in code and "x" not in code.replace("\n", "")


class _FakeShim:
    """Stands in for the preloaded launch shim: ``launch`` is a device launch of the candidate's own kernel."""

    def __init__(self) -> None:
        self.launched = 0
        self.knockout = False

    def own_launches(self) -> int:
        return self.launched

    def set_knockout(self, on: bool) -> None:
        self.knockout = on

    def launch(self, out: torch.Tensor, value: float) -> None:
        self.launched += 1
        if not self.knockout:
            out.fill_(value)


def test_with_the_launch_shim_an_extension_counts_and_is_knocked_out_per_device_launch(monkeypatch):
    """Where the runner has the shim, what counts is the device launches of the candidate's own kernels, and the
    knockout skips those launches alone: a function that computes with torch ops and launches one token kernel
    beside them still answers right, so it did not need its kernel."""
    import torch.utils.cpp_extension as cpp

    shim = _FakeShim()
    module = types.ModuleType("fake_ext")

    def token(x: torch.Tensor) -> torch.Tensor:
        shim.launch(torch.empty(1), 0.0)  # <<<1, 1>>> touching one element
        return x * 2  # torch:: ops

    def honest(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        shim.launch(out, 3.0)
        return out

    module.token, module.honest, module.torch_only = token, honest, lambda x: x * 2
    monkeypatch.setattr(cpp, "load_inline", lambda *a, **k: module)
    monkeypatch.setattr(LaunchCounter, "_hook_triton", lambda self: None)
    counter = LaunchCounter(device_kernels_only=True)
    counter.shim = shim
    counter.install()
    ext = cpp.load_inline("torch_ops_only", "torch::Tensor f(torch::Tensor x) { return x * 2; }")
    assert isinstance(ext, CountingModule), "the shim decides what counts, not the source's text"
    x = torch.ones(4)
    counter.reset()
    ext.torch_only(x)
    assert counter.count == 0 and not counter.backends
    ext.token(x)
    ext.honest(x)
    assert counter.count == 2 and counter.backends == {"cuda"}
    counter.knockout = True
    assert shim.knockout
    assert torch.equal(ext.token(x), x * 2), "the torch ops still run: the answer is still right"
    assert torch.equal(ext.honest(x), torch.zeros(4)), "the own kernel is skipped: the answer is lost"
    counter.knockout = False
    assert not shim.knockout and counter.count == 4
    counter.reset()
    assert counter.count == 0
    counter.count = 1  # the counter stays assignable, as the Python hooks' count was
    assert counter.count == 1


def test_a_knocked_out_triton_launch_runs_its_hooks_and_returns_as_a_real_one(monkeypatch):
    """The knockout launches with a grid of zero through Triton's own path: no program runs, but the pre-run hooks do
    and the launch returns what a real one returns, so the candidate cannot tell the knocked-out call by either
    (round 13: a skip returned None where a GPU launch returns its compiled kernel, and PyTorch's work hidden in a
    pre-run hook was skipped with the launch, which made the kernel look needed)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import triton
    import triton.language as tl

    def fill_two(y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.full([BLOCK], 2.0, tl.float32), mask=offs < n)

    kernel = triton.jit(fill_two)
    hooked = []
    kernel.add_pre_run_hook(lambda *a, **k: hooked.append(1))
    counter = LaunchCounter()
    counter.install()
    y = torch.zeros(64)
    real = kernel[(1,)](y, 64, BLOCK=64)
    assert torch.equal(y, torch.full((64,), 2.0)) and hooked == [1]
    counter.knockout = True
    try:
        y.zero_()
        skipped = kernel[(1,)](y, 64, BLOCK=64)
    finally:
        counter.knockout = False
    assert torch.equal(y, torch.zeros(64)), "no program ran"
    assert hooked == [1, 1], "the pre-run hook ran as on a real launch"
    assert type(skipped) is type(real)
    assert counter.count == 2
