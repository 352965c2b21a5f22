"""The header diet of candidates' CUDA builds (worker/header_diet.py): what each source is built with, and
that a dieted source that fails for want of a declaration is built as written, once."""

from __future__ import annotations

import subprocess

import pytest
import torch.utils.cpp_extension as cpp_extension

from kb_gym.worker import header_diet
from kb_gym.worker.header_diet import FALLBACK_MARKER, LEAN_PREFIX, plan

KERNEL_ONLY = r"""
#include <cuda_runtime.h>
__global__ void axpb(const float* x, float* y, float a, float b, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;  // no torch in this file: the Tensor wrapper is in cpp_sources
}
void axpb_launch(const float* x, float* y, float a, float b, long n, cudaStream_t s) {
    axpb<<<(n + 255) / 256, 256, 0, s>>>(x, y, a, b, n);
}
"""
KERNELBENCH_STYLE = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
__global__ void relu(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be on the GPU");
    auto y = torch::empty_like(x);
    relu<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""
WITH_PYBIND = KERNELBENCH_STYLE + 'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("relu_cuda", &relu_cuda); }\n'
WITH_NN = KERNELBENCH_STYLE.replace("auto y = torch::empty_like(x);", "auto y = torch::nn::functional::relu(x);")


def test_kernels_that_name_nothing_of_torch_are_built_lean_with_load_inlines_line_count():
    mode, source = plan(KERNEL_ONLY)
    assert mode == "lean" and source == LEAN_PREFIX + "\n" + KERNEL_ONLY
    assert LEAN_PREFIX.count("\n") == 2  # three lines, as load_inline's own prefix: message line numbers hold
    assert plan([KERNEL_ONLY, "// more"])[0] == "lean"  # a list of sources, as load_inline takes


def test_the_kernelbench_pattern_loses_only_the_whole_api_include_and_keeps_its_line_numbers():
    mode, source = plan(KERNELBENCH_STYLE)
    assert mode == "trimmed" and "torch/extension.h" not in source
    assert source.count("\n") == KERNELBENCH_STYLE.count("\n")
    assert "torch::empty_like" in source and "#include <cuda_runtime.h>" in source


@pytest.mark.parametrize("source", [WITH_PYBIND, WITH_NN, KERNELBENCH_STYLE + "void f() { std::cout << 1; }\n",
                                    "#include <torch/types.h>\n" + KERNEL_ONLY])
def test_sources_that_need_more_than_torch_types_are_built_as_written(source):
    mode, built = plan(source)
    assert mode == "as written" and built is None
    assert plan(None) == ("as written", None) and plan("") == ("as written", None)


class FakeBuilder:
    """load_inline as far as the diet sees it: records each call; ``fails`` says how a dieted build fails."""

    def __init__(self, fails: str = ""):
        self.calls: list[dict] = []
        self.fails = fails

    def __call__(self, name, cpp_sources, cuda_sources=None, *, build_directory=None, functions=None,
                 no_implicit_headers=False, **kwargs):
        self.calls.append({"cpp": cpp_sources, "cuda": cuda_sources, "no_implicit_headers": no_implicit_headers})
        dieted = cuda_sources != [KERNELBENCH_STYLE] and cuda_sources != KERNELBENCH_STYLE
        if self.fails and dieted:
            raise RuntimeError(f"Error building extension '{name}'") from subprocess.CalledProcessError(
                1, "ninja", output=self.fails.encode())
        return f"module {len(self.calls)}"


@pytest.fixture
def builder(monkeypatch, tmp_path):
    def make(fails: str = "") -> tuple[FakeBuilder, list[str]]:
        fake = FakeBuilder(fails)
        monkeypatch.setattr(cpp_extension, "load_inline", fake)
        monkeypatch.setattr(header_diet.inspect, "signature", lambda f: _Params())
        record: list[str] = []
        header_diet.install(record)
        return fake, record

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    return make


class _Params:
    parameters = {"no_implicit_headers": None}


def test_a_lean_build_gets_load_inlines_own_cpp_header_and_no_implicit_cuda_headers(builder):
    fake, record = builder()
    cpp_extension.load_inline("ext", "void axpb_launch();", KERNEL_ONLY, functions=["axpb_launch"])
    (call,) = fake.calls
    assert call["no_implicit_headers"] and call["cpp"] == ["#include <torch/extension.h>", "void axpb_launch();"]
    assert call["cuda"] == [LEAN_PREFIX + "\n" + KERNEL_ONLY] and record == ["lean"]


def test_a_dieted_build_that_lost_a_declaration_is_built_as_written_and_later_loads_skip_the_diet(builder, tmp_path):
    fake, record = builder(fails='cuda.cu(9): error: namespace "torch" has no member "empty_like"')
    assert cpp_extension.load_inline("ext", "torch::Tensor relu_cuda(torch::Tensor x);", KERNELBENCH_STYLE) == "module 2"
    assert [c["cuda"] for c in fake.calls] == [[plan(KERNELBENCH_STYLE)[1]], KERNELBENCH_STYLE]
    assert record == ["fallback"] and (tmp_path / "ext" / FALLBACK_MARKER).is_file()
    cpp_extension.load_inline("ext", "torch::Tensor relu_cuda(torch::Tensor x);", KERNELBENCH_STYLE)
    assert fake.calls[-1]["cuda"] == KERNELBENCH_STYLE and len(fake.calls) == 3  # the kept build: as written


def test_a_dieted_build_that_fails_on_the_candidates_own_error_is_not_built_twice(builder):
    fake, record = builder(fails="cuda.cu(7): error: expected a \";\"")
    with pytest.raises(RuntimeError, match="Error building extension"):
        cpp_extension.load_inline("ext", "torch::Tensor relu_cuda(torch::Tensor x);", KERNELBENCH_STYLE)
    assert len(fake.calls) == 1 and record == ["trimmed, failed"]


def test_the_judge_keeps_only_known_diet_names():
    assert header_diet.record_of(["lean", "fallback", "rm -rf", 3]) == ["lean", "fallback"]
    assert header_diet.record_of("lean") == []
