"""``kb-gym demo``: known candidates (correct, wrong, broken, plain PyTorch) on built-in problems."""

from __future__ import annotations

import time

from kb_gym.problems import BUILTIN_DIR, Problem, get_problem, load_problems

WRONG_RELU = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def leaky_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.where(x > 0, x, 0.01 * x), mask=mask)  # leaky, not ReLU


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        leaky_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
        return out
'''

BROKEN = '''
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x)
        return x.clamp_min(0)
'''


def _solution(problem: Problem) -> str:
    return (BUILTIN_DIR / "solutions" / f"level{problem.level}" / f"{problem.name}.py").read_text()


def _torch_copy(problem: Problem) -> str:
    return problem.code.replace("class Model(", "class ModelNew(")


def demo_cases(dataset: str = "builtin") -> list[tuple[Problem, str, str]]:
    problems = load_problems(dataset)
    relu = get_problem(problems, name="level1/1_ReLU")
    softmax = get_problem(problems, name="level1/3_RowSoftmax")
    fused = get_problem(problems, name="level2/1_LinearBiasReLUScale")
    return [
        (relu, "Triton kernel (correct)", _solution(relu)),
        (relu, "Triton kernel (wrong: leaky)", WRONG_RELU),
        (relu, "syntax error", BROKEN),
        (relu, "plain PyTorch copy", _torch_copy(relu)),
        (softmax, "Triton kernel (correct)", _solution(softmax)),
        (fused, "Triton fused epilogue", _solution(fused)),
    ]


def run_demo(device: str = "auto", dataset: str = "builtin") -> int:
    from rich.console import Console
    from rich.table import Table

    from kb_gym.evaluator import Evaluator
    from kb_gym.rewards import get_reward

    console = Console(width=120)
    reward_fn = get_reward("default")
    cases = demo_cases(dataset)
    table = Table(title="kb_gym demo: built-in problems, known candidates")
    for col in ("problem", "candidate", "status", "reward", "speedup", "flags", "seconds"):
        table.add_column(col)
    with Evaluator(device, timing_max_reps=50, timing_max_seconds=5.0) as ev:
        console.print(f"devices: {', '.join(ev.devices)}; starting worker...")
        started = time.perf_counter()
        ev.warm()
        console.print(f"worker ready in {time.perf_counter() - started:.1f} s")
        for problem, label, source in cases:
            t0 = time.perf_counter()
            result = ev.evaluate(problem, source)
            reward, _ = reward_fn(result)
            speed = f"{result.speedup:.3f}x" if result.speedup is not None else "-"
            table.add_row(problem.key, label, result.status, f"{reward:+.2f}", speed,
                          ", ".join(result.flags) or "-", f"{time.perf_counter() - t0:.2f}")
        if ev.store is not None:
            console.print(f"results appended to {ev.store.path}")
    console.print(table)
    if "cpu" in ev.devices:
        console.print("(CPU: Triton runs in its interpreter, so kernels are far slower than PyTorch here; "
                      "speedups mean something only on a GPU.)")
    return 0
