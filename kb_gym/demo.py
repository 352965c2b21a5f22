"""``kb-gym demo``: the environment driven by a scripted policy of known candidates on built-in problems."""

from __future__ import annotations

import time
from collections.abc import Callable

from kb_gym.problems import BUILTIN_DIR, Problem, get_problem, load_problems, reference_as_candidate

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


# Scripted episodes: (problem, max_turns, [(label, source-maker), ...]). The first episode shows the
# multi-turn loop: a syntax error, then a wrong kernel, then a correct one, each after feedback.
def demo_episodes() -> list[tuple[str, int, list[tuple[str, Callable[[Problem], str]]]]]:
    return [
        ("level1/1_ReLU", 3, [("syntax error", lambda p: BROKEN), ("Triton, wrong (leaky)", lambda p: WRONG_RELU),
                              ("Triton, correct", _solution)]),
        ("level1/1_ReLU", 1, [("plain PyTorch copy", reference_as_candidate)]),
        ("level1/3_RowSoftmax", 1, [("Triton, correct", _solution)]),
        # a fusion that pays at GPU size (3.6x on the H200, docs/benchmarks.md 0e)
        ("level2/4_LayerNormResidualTanh", 1, [("Triton fused LayerNorm+residual+tanh", _solution)]),
    ]


def run_demo(device: str = "auto", dataset: str = "builtin") -> int:
    """Drive the Gymnasium environment with a scripted policy and print one row per step."""
    import gymnasium as gym
    from rich.console import Console
    from rich.table import Table

    import kb_gym  # noqa: F401 - registers the environments
    from kb_gym.evaluator import Evaluator

    console = Console(width=130)
    table = Table(title="kb_gym demo: KernelBench-v0, scripted policy, built-in problems (reward mode: improvement)")
    for col in ("ep", "problem", "turn", "action", "status", "reward", "speedup", "flags", "end", "s"):
        table.add_column(col)
    problems = load_problems(dataset)
    with Evaluator(device, timing_max_reps=50, timing_max_seconds=5.0) as ev:
        console.print(f"devices: {', '.join(ev.devices)}; starting the worker...")
        started = time.perf_counter()
        ev.warm()
        console.print(f"worker ready in {time.perf_counter() - started:.1f} s")
        last_feedback = ""
        for episode, (name, max_turns, script) in enumerate(demo_episodes(), 1):
            env = gym.make("KernelBench-v0", dataset=problems, evaluator=ev, max_turns=max_turns)
            obs, info = env.reset(seed=episode, options={"name": name})
            problem = get_problem(problems, name=name)
            for turn, (label, make_source) in enumerate(script, 1):
                t0 = time.perf_counter()
                obs, reward, terminated, truncated, info = env.step(make_source(problem))
                speed = f"{info['speedup']:.3f}x" if info.get("speedup") is not None else "-"
                end = "terminated" if terminated else ("truncated" if truncated else "")
                table.add_row(str(episode), name, str(turn), label, info["status"], f"{reward:+.2f}", speed,
                              ", ".join(info.get("flags") or []) or "-", end, f"{time.perf_counter() - t0:.2f}")
                if episode == 1 and turn == 2:
                    last_feedback = obs["feedback"]
                if terminated or truncated:
                    break
            env.close()
        if ev.store is not None:
            console.print(f"results appended to {ev.store.path}")
    console.print(table)
    if last_feedback:
        console.print("Feedback the policy saw after its wrong kernel (episode 1, turn 2):")
        console.print(last_feedback, markup=False, highlight=False)
    if "cpu" in ev.devices:
        console.print("(CPU: Triton runs in its interpreter, so kernels are far slower than PyTorch here; "
                      "speedups mean something only on a GPU.)")
    return 0
