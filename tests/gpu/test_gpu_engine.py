"""Engine paths that exist only on a GPU: CUDA builds, streams, sticky errors, device memory.

Run on the device machine by scripts/gpu_check.sh; skipped elsewhere (tests/conftest.py).
"""

from __future__ import annotations

import os

import pytest

from kb_gym import EvalConfig, Evaluator, get_problem, load_problems
from kb_gym.problems import BUILTIN_DIR
from kb_gym.worker import launch_shim

pytestmark = pytest.mark.gpu

CUDA_RELU = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
__global__ void k(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = SCALE * fmaxf(x[i], 0.0f);
}
torch::Tensor run(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    k<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
ext = load_inline(name="shared_name_ext", cpp_sources="torch::Tensor run(torch::Tensor x);",
                  cuda_sources=src.replace("SCALE", "SCALE_VALUE"), functions=["run"])

class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
    def forward(self, x):
        return ext.run(x.contiguous())
'''

ILLEGAL_ADDRESS = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def bad(x_ptr, n):
    offs = tl.arange(0, 128) + 1_000_000_000_000
    tl.store(x_ptr + offs, tl.zeros([128], dtype=tl.float32))

class ModelNew(nn.Module):
    def forward(self, x):
        bad[(1,)](x, x.numel())
        return x
'''

SIDE_STREAM = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def relu_k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=m), 0.0), mask=m)

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.stream = torch.cuda.Stream()
        self.pad = None
    def forward(self, x):
        y = torch.empty_like(x)
        relu_k[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        torch.cuda.current_stream().synchronize()
        with torch.cuda.stream(self.stream):   # busy work the caller's stream events do not see
            a = torch.randn(4096, 4096, device=x.device)
            for _ in range(20):
                a = a @ a
                a = a / a.norm()
        return y
'''

HANG = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def spin(x_ptr, n):
    i = 0
    v = tl.load(x_ptr)
    while v == v:   # never false for finite inputs
        i += 1
        v = tl.load(x_ptr) + i * 0.0
    tl.store(x_ptr, v)

class ModelNew(nn.Module):
    def forward(self, x):
        spin[(1,)](x, x.numel())
        return torch.relu(x)
'''

OOM = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        self.hog = [torch.empty(size, dtype=torch.uint8, device=x.device) for size in SIZES]
        return torch.relu(x)
'''


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu") / "results.jsonl"
    evaluator = Evaluator("cuda:0", results_path=path, trials=3, timing_max_reps=60, timing_max_seconds=5,
                          load_timeout=240, correctness_timeout=30, timing_timeout=60)
    yield evaluator
    evaluator.close()


# The engine's paths are tested on the CPU size of the built-in problems: seconds, not the minutes that
# multi-GB GPU-size outputs take through five trials. GPU sizes have their own test below.
@pytest.fixture(scope="module")
def relu():
    return get_problem(load_problems("builtin", size="cpu"), name="level1/1_ReLU")


def _solution(problem):
    return (BUILTIN_DIR / "solutions" / f"level{problem.level}" / f"{problem.name}.py").read_text()


def test_triton_solutions_correct_on_gpu(ev):
    problems = load_problems("builtin", size="cpu")
    for path in sorted((BUILTIN_DIR / "solutions").glob("level*/*.py")):
        problem = get_problem(problems, name=f"{path.parent.name}/{path.stem}")
        r = ev.evaluate(problem, path.read_text())
        assert r.status == "correct", (problem.key, r.error)
        assert r.custom_kernel_launches and "no_custom_kernel" not in r.flags
        assert "token_kernel" not in r.flags, (problem.key, r.correctness.get("dataflow"))
        # the launch shim is on by default: every solution keeps its credit with its launches counted one by one
        assert r.worker["launch_shim"] == launch_shim.enabled(), r.worker
        assert r.speedup and r.speedup_ci and r.device == "cuda:0"
        assert r.hardware["name"] and r.hardware["driver"]


def test_triton_solutions_correct_at_gpu_size(ev):
    """Every solution is correct at the GPU size too (correctness only: the speedups are a benchmark)."""
    problems = load_problems("builtin", size="gpu")
    config = ev.config.replace(trials=2, timing=False, correctness_timeout=300)
    wrong = {}
    for path in sorted((BUILTIN_DIR / "solutions").glob("level*/*.py")):
        problem = get_problem(problems, name=f"{path.parent.name}/{path.stem}")
        r = ev.evaluate(problem, path.read_text(), config=config)
        if r.status != "correct" or "token_kernel" in r.flags:
            wrong[problem.key] = (r.status, r.flags, r.correctness.get("dataflow"), (r.error or "")[:300])
    assert not wrong, wrong


def test_reference_as_candidate_is_about_one(ev):
    problems = load_problems("builtin", size="cpu")
    for problem in problems[:6]:
        r = ev.evaluate(problem, problem.code.replace("class Model(", "class ModelNew("))
        assert r.status == "correct", (problem.key, r.error)
        assert 0.8 < r.speedup < 1.25, (problem.key, r.speedup)
        assert "no_custom_kernel" in r.flags


def test_load_inline_builds_and_same_name_extensions_do_not_collide(ev, relu):
    first = ev.evaluate(relu, CUDA_RELU.replace("SCALE_VALUE", "1.0f"))
    assert first.status == "correct", first.error
    assert "cuda" in first.backend and first.custom_kernel_launches > 0
    # Same extension name, different code: must build and load its own module, not reuse the first.
    second = ev.evaluate(relu, CUDA_RELU.replace("SCALE_VALUE", "2.0f"))
    assert second.status == "incorrect", second.error
    third = ev.evaluate(relu, CUDA_RELU.replace("SCALE_VALUE", "1.0f"))
    assert third.status == "correct", third.error


def test_cuda_builds_go_on_a_header_diet_and_stay_correct(ev, relu):
    """header_diet.py: the KernelBench pattern is built without torch/extension.h in its .cu, kernels that name
    nothing of torch without torch/types.h, a .cu that needs the whole API as written; all three correct."""
    import time

    from kb_gym.problems import get_problem, load_problems
    from kb_gym.problems.solutions import solution_backend, solution_files

    trimmed = ev.evaluate(relu, CUDA_RELU.replace("SCALE_VALUE", "(1.0f + 0.0f)"))
    assert trimmed.status == "correct" and trimmed.worker["headers"] == ["trimmed"], (trimmed.error, trimmed.worker)
    whole = ev.evaluate(relu, CUDA_RELU.replace("SCALE_VALUE", "(1.0f - 0.0f)").replace(
        "auto y = torch::empty_like(x);", "torch::NoGradGuard g; auto y = torch::empty_like(x);"))
    assert whole.status == "correct" and whole.worker["headers"] == ["as written"], (whole.error, whole.worker)
    path = next(f for f in solution_files("cuda") if solution_backend(f) == "cuda" and "42_RMSNorm" in f.name)
    problem = get_problem(load_problems("builtin", size="cpu"), name=f"{path.parent.name}/{path.stem}")
    t0 = time.perf_counter()
    lean = ev.evaluate(problem, path.read_text() + "\n# a source the build cache has not seen\n")
    print(f"load s: trimmed {trimmed.stage_seconds.get('load'):.1f}, as written {whole.stage_seconds.get('load'):.1f}, "
          f"lean {lean.stage_seconds.get('load'):.1f} ({time.perf_counter() - t0:.1f} s in all)")
    assert lean.status == "correct" and lean.worker["headers"] == ["lean"], (lean.error, lean.worker)


def test_two_workers_build_cuda_side_by_side_and_take_turns_on_the_gpu(relu, tmp_path):
    """workers_per_device=2: two fresh load_inline builds (tens of seconds of nvcc each) overlap, the
    GPU stages do not, and both kernels are judged as one worker would judge them."""
    import time

    # Sources no earlier test built (the build cache is keyed by source): 1.0f * 1 and 1.0f / 1.
    sources = [CUDA_RELU.replace("SCALE_VALUE", "(1.0f * 1)"), CUDA_RELU.replace("SCALE_VALUE", "(1.0f / 1)")]
    with Evaluator("cuda:0", results_path=False, workers_per_device=2, trials=2, timing_max_reps=20,
                   load_timeout=240) as two:
        two.warm()
        t0 = time.perf_counter()
        results = two.evaluate_many([(relu, s) for s in sources])
        wall = time.perf_counter() - t0
        intervals = sorted(iv for h in two._workers for iv in h.lock_intervals)
    assert [r.status for r in results] == ["correct", "correct"], [r.error for r in results]
    loads = [r.stage_seconds["load"] for r in results]
    assert wall < 0.8 * sum(loads) + 15, (wall, loads)  # the builds overlapped
    assert all(a[1] <= b[0] for a, b in zip(intervals, intervals[1:], strict=False)), intervals


def test_shared_stages_overlap_correctness_never_a_timing_and_keep_the_reference_at_1x(tmp_path):
    """``shared_stages``: two workers' correctness stages and kernel checks share the GPU, their timing stages never
    overlap anything, and the reference as candidate still times at about 1x (device_lock.py, modes)."""
    from kb_gym.problems import reference_as_candidate

    problem = get_problem(load_problems("builtin", size="gpu"), name="level1/10_MatmulTransposedB")
    with Evaluator("cuda:0", results_path=False, baseline_cache=False, workers_per_device=2,
                   shared_stages=True) as two:
        two.warm()
        first = two.evaluate(problem, reference_as_candidate(problem))  # the output size learnt: held alone
        later = two.evaluate_many([(problem, reference_as_candidate(problem))] * 6)
    results = [first, *later]
    assert all(r.status == "correct" for r in results), [r.error for r in results]
    spans = sorted(tuple(r.worker["timed_at"]) for r in results)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
    speedups = sorted(r.speedup for r in results)
    print("shared stages: speedups", [round(x, 3) for x in speedups],
          "device_wait", [round(r.stage_seconds.get("device_wait", 0), 2) for r in results])
    assert 0.95 <= speedups[len(speedups) // 2] <= 1.05, speedups


def test_cuda_compile_error_is_compile_error_with_compiler_message(ev, relu):
    broken = CUDA_RELU.replace("SCALE_VALUE", "1.0f").replace("fmaxf(x[i], 0.0f)", "fmaxf(x[i], undefined_symbol)")
    r = ev.evaluate(relu, broken)
    assert r.status == "compile_error"
    assert "undefined_symbol" in r.feedback


def test_illegal_address_is_runtime_error_and_worker_recovers(ev, relu):
    r = ev.evaluate(relu, ILLEGAL_ADDRESS)
    assert r.status in ("runtime_error", "crash"), (r.status, r.error)
    after = ev.evaluate(relu, _solution(relu))
    assert after.status == "correct", after.error


def test_side_stream_work_is_flagged(ev, relu):
    r = ev.evaluate(relu, SIDE_STREAM)
    assert "side_stream" in r.flags, (r.status, r.flags, r.runtime_ms, r.error)


def test_hanging_kernel_times_out_and_next_evaluation_works(ev, relu):
    cfg = ev.config.replace(correctness_timeout=10)
    r = ev.evaluate(relu, HANG, config=cfg)
    assert r.status == "timeout", (r.status, r.error)
    after = ev.evaluate(relu, _solution(relu))
    assert after.status == "correct", after.error


def test_device_oom_is_runtime_error_and_recovers(ev, relu):
    # More than the GPU holds, at once or 8 GiB at a time. torch 2.11's caching allocator in a runner raises an
    # internal assert on nvmlInit (CUDACachingAllocator.cpp:1135) instead of its OOM error (H200, 2026-12-02 and
    # -03: NVML fails in the sandbox); the runner names it (loading.out_of_device_memory), as the audit's retry of
    # out-of-memory rows and the policy's feedback need.
    for sizes in ("[1 << 40]", "[8 << 30] * 32"):
        r = ev.evaluate(relu, OOM.replace("SIZES", sizes))
        assert r.status == "runtime_error" and "out of memory" in r.error.lower(), (sizes, r.status, r.error)
    after = ev.evaluate(relu, _solution(relu))
    assert after.status == "correct", after.error


def test_gpu_memory_does_not_grow(ev, relu):
    import time

    import torch

    def free_after_settling() -> int:
        time.sleep(1.0)  # the next runner (forked as this one ends) has made its CUDA context
        return torch.cuda.mem_get_info(0)[0]

    source = _solution(relu)
    ev.evaluate(relu, source)
    free_before = free_after_settling()
    for _ in range(15):
        assert ev.evaluate(relu, source).status == "correct"
    free_after = free_after_settling()
    assert free_before - free_after < 256 << 20, (free_before - free_after) / 2**20


def test_compile_baseline(relu):
    with Evaluator("cuda:0", EvalConfig(baseline="compile", trials=2, timing_max_reps=30),
                   results_path=False) as ev:
        r = ev.evaluate(relu, _solution(relu))
    assert r.status == "correct", r.error
    assert r.baseline == "compile" and r.ref_runtime_ms > 0


def test_worker_runs_in_namespaces(ev, relu):
    r = ev.evaluate(relu, _solution(relu))
    assert r.worker["pid_namespace"] and r.worker["network_namespace"], r.worker


@pytest.mark.skipif(os.environ.get("KB_GYM_LANDLOCK", "auto").lower() in ("0", "off")
                    or not __import__("kb_gym.worker.landlock", fromlist=["abi_version"]).abi_version(),
                    reason="Landlock is off (KB_GYM_LANDLOCK=0) or the kernel has none")
def test_landlocked_gpu_worker_runs_kernels_and_writes_only_in_scratch(ev, relu, tmp_path):
    """GPU workers are confined by default; a driver whose CUDA does not start under the ruleset would leave
    them unconfined (``landlock_unusable`` in the worker info), which this test reports as a failure."""
    honest = ev.evaluate(relu, _solution(relu))
    assert honest.status == "correct" and honest.worker["landlock"] >= 1, (honest.error, honest.worker)
    target = tmp_path / "escaped.txt"
    escape = _solution(relu).replace("class ModelNew", f"open({str(target)!r}, 'w').write('x')\n\nclass ModelNew", 1)
    r = ev.evaluate(relu, escape, config=ev.config.replace(integrity="off"))
    assert r.status == "compile_error" and "Permission denied" in r.error and not target.exists(), r.error


ALWAYS_ONES_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    """Reads a 1 GiB input; the answer happens not to depend on it (a shortcut's dream)."""
    def forward(self, x):
        return (x.abs().amax(dim=1) > -1.0).float()

def get_inputs():
    return [torch.rand(16384, 16384)]

def get_init_inputs():
    return []
'''

SHORTCUT = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def fill_ones(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.full([BLOCK], 1.0, tl.float32), mask=offs < n)

class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty(x.shape[0], device=x.device)
        fill_ones[(triton.cdiv(x.shape[0], 1024),)](out, x.shape[0], BLOCK=1024)
        return out
'''


def test_faster_than_the_speed_of_light_is_flagged(ev):
    from kb_gym import Problem

    problem = Problem(id=1, name="1_AlwaysOnes", level=1, code=ALWAYS_ONES_PROBLEM)
    r = ev.evaluate(problem, SHORTCUT)
    assert r.status == "correct", r.error
    assert "excessive_speedup" in r.flags, (r.runtime_ms, r.correctness)
    honest = ev.evaluate(problem, ALWAYS_ONES_PROBLEM.replace("class Model(", "class ModelNew("))
    assert "excessive_speedup" not in honest.flags


UNINITIALISED_OUTPUT = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def touch(x_ptr, BLOCK: tl.constexpr):
    pass

class ModelNew(nn.Module):
    """Computes nothing: hopes the allocator hands back memory holding the reference's answer."""
    def forward(self, x):
        touch[(1,)](x, BLOCK=16)
        return torch.empty_like(x)
'''


def test_stale_memory_cannot_pass_for_an_answer(ev, relu):
    # The candidate runs before the reference in every trial, and the baseline's output stays
    # alive while the candidate runs during timing: freed memory never holds this call's answer.
    r = ev.evaluate(relu, UNINITIALISED_OUTPUT)
    assert r.status == "incorrect", (r.status, r.error)


CONV_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 32, 3)
    def forward(self, x):
        return self.conv(x)

def get_inputs():
    return [torch.randn(8, 16, 64, 64)]

def get_init_inputs():
    return []
'''

CONV_IN_FLOAT64 = CONV_PROBLEM.replace("class Model(", "class ModelNew(").replace(
    "return self.conv(x)",
    "return torch.nn.functional.conv2d(x.double(), self.conv.weight.double(), self.conv.bias.double()).float()")

MATMUL_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return a @ b

def get_inputs():
    return [torch.randn(256, 512), torch.randn(512, 256)]

def get_init_inputs():
    return []
'''

TRITON_MATMUL = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :], mask=(rm[:, None] < M) & ((k + rk)[None, :] < K))
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :], mask=((k + rk)[:, None] < K) & (rn[None, :] < N))
        acc = tl.dot(a, b, accPRECISION)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

class ModelNew(nn.Module):
    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty(M, N, device=a.device, dtype=a.dtype)
        matmul_kernel[(triton.cdiv(M, 64), triton.cdiv(N, 64))](a, b, c, M, N, K, BM=64, BN=64, BK=32)
        return c
'''


def test_fp32_problems_are_checked_in_true_fp32(ev):
    """The worker turns TF32 off: a convolution more exact than the reference passes (against PyTorch's
    default TF32 cuDNN reference it would miss the 1e-4 tolerance), and a Triton matmul passes with
    input_precision="ieee" but not with tl.dot's default TF32."""
    from kb_gym import Problem

    conv = Problem(id=1, name="1_Conv", level=1, code=CONV_PROBLEM)
    exact = ev.evaluate(conv, CONV_IN_FLOAT64, config=ev.config.replace(timing=False))
    assert exact.status == "correct", exact.error
    assert exact.correctness["rel_l2_err"] < 1e-5, exact.correctness
    matmul = Problem(id=2, name="2_Matmul", level=1, code=MATMUL_PROBLEM)
    ieee = ev.evaluate(matmul, TRITON_MATMUL.replace("PRECISION", ', input_precision="ieee"'), config=ev.config.replace(timing=False))
    assert ieee.status == "correct" and ieee.custom_kernel_launches, ieee.error
    tf32 = ev.evaluate(matmul, TRITON_MATMUL.replace("PRECISION", ""), config=ev.config.replace(timing=False))
    assert tf32.status == "incorrect", (tf32.status, tf32.correctness)


CUDA_TOKEN_RELU = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
__global__ void touch(float* y) { y[0] = y[0] + 0.0f; }
torch::Tensor run(torch::Tensor x) {
    auto y = torch::relu(x);              // the work, by PyTorch
    touch<<<1, 1>>>(y.data_ptr<float>());  // a token launch of its own
    return y;
}
"""
ext = load_inline(name="token_relu_ext", cpp_sources="torch::Tensor run(torch::Tensor x);", cuda_sources=src,
                  functions=["run"])

class ModelNew(nn.Module):
    def forward(self, x):
        return ext.run(x.contiguous())
'''


def test_the_launch_shim_tells_a_token_launch_beside_torch_ops_from_a_kernel(relu, tmp_path, monkeypatch):
    """With the preloaded launch shim (KB_GYM_LAUNCH_SHIM=1) extensions are knocked out per device launch: a
    function computing ReLU with ``torch::`` ops beside a ``<<<1, 1>>>`` launch is ``token_kernel``, no credit;
    the honest CUDA ReLU keeps its credit, counted by its launches. Without the shim the token one got credit."""
    from kb_gym.worker import launch_shim

    monkeypatch.setenv(launch_shim.ENV, "1")
    assert launch_shim.library() is not None, "no C compiler to build the shim"
    with Evaluator("cuda:0", results_path=False, trials=2, timing_max_reps=20, load_timeout=240) as shimmed:
        token = shimmed.evaluate(relu, CUDA_TOKEN_RELU)
        honest = shimmed.evaluate(relu, CUDA_RELU.replace("SCALE_VALUE", "(1.0f + 0.0f)"))
    assert token.status == "correct" and "token_kernel" in token.flags and token.speed_credit is False, (
        token.status, token.flags, token.error)
    assert honest.status == "correct" and honest.custom_kernel_launches > 0, (honest.error, honest.flags)
    assert "token_kernel" not in honest.flags and honest.speed_credit is True, honest.flags
