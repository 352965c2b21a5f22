"""A problem's eager forward as cost-model ops, read off a run on meta tensors (no data, no device).

Every aten op the forward dispatches becomes one :class:`~kb_gym.problems.cost_model.Op`: the bytes of its
tensor arguments and results, and the flops of matmuls and convolutions (the ops that can be
flop-bound). Views and allocations without data movement cost nothing. This is what
``scripts/problem_times.py`` prints beside the measured eager time on a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx.experimental._config as _fx_config
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kb_gym.problems.cost_model import FP32_FLOPS_PER_S, Op, conv_flops_per_s, eager_ms
from kb_gym.problems.problem import Problem
from kb_gym.worker.loading import load_source

# aten ops that move no data: views, aliases and allocations
_FREE = frozenset({
    "view", "_unsafe_view", "t", "transpose", "permute", "expand", "reshape", "unsqueeze", "squeeze", "slice",
    "select", "alias", "as_strided", "split", "split_with_sizes", "chunk", "unbind", "detach", "_reshape_alias",
    "narrow", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty", "diagonal", "unfold",
    "lift_fresh_copy", "view_as_real", "view_as_complex", "_to_copy_meta",
})


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _flops(name: str, args: tuple[Any, ...], outs: list[torch.Tensor]) -> float:
    if name in ("mm", "addmm", "bmm", "baddbmm"):
        a, b = args[-2], args[-1]
        return 2.0 * math.prod(a.shape) * b.shape[-1]
    if name == "convolution" and outs:
        x, w, transposed = args[0], args[1], bool(args[6])
        # transposed: every input element meets every weight of its group once
        return 2.0 * (x.numel() * w.shape[1] if transposed else outs[0].numel() * w.shape[1]) * math.prod(w.shape[2:])
    return 0.0


def _conv_rate(args: tuple[Any, ...]) -> float:
    """The calibrated rate of ``aten.convolution(input, weight, bias, stride, padding, dilation, transposed,
    output_padding, groups)``: per group, output channels and the products each output sums."""
    w, transposed, groups = args[1], bool(args[6]), max(int(args[8]), 1)
    area = math.prod(w.shape[2:])
    if transposed:  # weight (c_in, c_out / groups, *kernel)
        return conv_flops_per_s(w.shape[1], w.shape[0] / groups * area)
    return conv_flops_per_s(w.shape[0] / groups, w.shape[1] * area)  # weight (c_out, c_in / groups, *kernel)


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Op] = []

    def __torch_dispatch__(self, func: Any, types_: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in _FREE:
            return out
        ins = [a for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor)]
        outs = [a for a in tree_flatten(out)[0] if isinstance(a, torch.Tensor)]
        moved = sum(map(_nbytes, ins)) + sum(map(_nbytes, outs))
        if name in ("index_select", "gather", "embedding") and len(ins) > 1:  # reads only the rows it picks
            moved = sum(_nbytes(t) for t in ins[1:] if not t.is_floating_point()) + 2 * sum(map(_nbytes, outs))
        rate = _conv_rate(args) if name == "convolution" else FP32_FLOPS_PER_S
        self.ops.append(Op(name, float(moved), _flops(name, args, outs), float(sum(map(_nbytes, outs))), rate))
        return out


@dataclass(frozen=True)
class EagerEstimate:
    ms: float
    launches: int
    gflop: float
    traffic_gb: float
    memory_gb: float  # inputs, parameters and every result, nothing freed: an upper bound on the peak
    input_shapes: list[tuple[int, ...]]
    output_shapes: list[tuple[int, ...]]


def estimate(problem: Problem) -> EagerEstimate:
    """The cost model's eager time of ``problem`` as its code stands (size it first), traced on meta tensors."""
    module = load_source(problem.code, f"kb_estimate_{problem.level}_{problem.id}")
    with torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
        inputs = list(module.get_inputs())
    if isinstance(model, torch.nn.Module):
        model.eval()
    recorder = _Recorder()
    # Meta tensors cannot know how many elements are nonzero (top-k routing): every one is assumed to be,
    # so such a problem's estimate is an upper bound.
    with torch.no_grad(), _fx_config.patch(meta_nonzero_assume_all_nonzero=True), recorder:
        out = model(*inputs)
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    resident = sum(_nbytes(t) for t in inputs if isinstance(t, torch.Tensor))
    if isinstance(model, torch.nn.Module):
        resident += sum(_nbytes(p) for p in model.parameters()) + sum(_nbytes(b) for b in model.buffers())
    ops = recorder.ops
    return EagerEstimate(ms=eager_ms(ops), launches=len(ops), gflop=sum(o.flops for o in ops) / 1e9,
                         traffic_gb=sum(o.bytes for o in ops) / 1e9,
                         memory_gb=(resident + sum(o.alloc for o in ops)) / 1e9,
                         input_shapes=[tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor)],
                         output_shapes=[tuple(t.shape) for t in outs])


def output_gb(problem: Problem) -> float:
    """GB of ``problem``'s outputs (4 bytes an element) from the meta-tensor trace; 0 for a problem the trace
    cannot follow (scripts order problems by it: smallest outputs first)."""
    try:
        return sum(math.prod(s) * 4 for s in estimate(problem).output_shapes) / 1e9
    except Exception:  # noqa: BLE001 (any failure of the trace only orders the problem first)
        return 0.0
