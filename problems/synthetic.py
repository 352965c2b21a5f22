"""Synthetic problems: KernelBench-format programs composed from a menu of operators.

``load_problems("synthetic")`` gives 100 problems (seed 0); ``"synthetic:N"`` and ``"synthetic:N:SEED"``
give other counts and seeds. A level-1 problem is one operator; a level-2 problem is a head
(Linear, Conv2d or a batched matmul) followed by one to three operators to fuse into it, the shape
of KernelBench's level 2. Generation is deterministic in the seed, so a synthetic set is as
reproducible as a file.

The menu avoids the degenerate shapes the official-set audit found (docs/audit-official.md):
inputs are ``torch.randn`` (both signs, so no activation is the identity on them), no constant
shifts push every value below a ReLU, a reduction only ever ends a program and only over the
feature or channel dimension (a mean over a whole image barely moves between inputs), never a max
over values a clamp, tanh or sigmoid pinned to a bound, and never a sum over a LayerNorm's rows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kb_gym.problems.problem import Problem

DEFAULT_COUNT = 100
LEVEL1_SHARE = 0.3


@dataclass
class _Program:
    """A problem under construction: constructor arguments, module members, forward lines, inputs."""

    parts: list[str] = field(default_factory=list)
    constants: list[tuple[str, object]] = field(default_factory=list)  # module-level sizes, in order
    init_args: list[str] = field(default_factory=list)  # constants passed to Model(...)
    members: list[str] = field(default_factory=list)
    forward: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)  # get_inputs() expressions
    args: list[str] = field(default_factory=lambda: ["x"])
    feature_dim: str = "1"  # the dimension a softmax or reduction runs over
    bias_shape: tuple[int, ...] = (1,)  # broadcasts over the head's output
    norm_dim: str | None = None  # the constant naming the last dimension, while a LayerNorm may follow
    saturated: bool = False  # values pinned to a bound (clamp, tanh, sigmoid): a max over them is that bound
    zero_sum: bool = False  # rows of a LayerNorm sum to zero until a nonlinearity: a sum over them is constant

    def unique(self, name: str) -> str:
        """``name``, or ``name_2``, ``name_3``... when an earlier operator took it (two Scales)."""
        taken = {n for n, _ in self.constants}
        k = 1
        while (candidate := name if k == 1 else f"{name}_{k}") in taken:
            k += 1
        return candidate

    def constant(self, name: str, value: object, init: bool = False) -> str:
        self.constants.append((name, value))
        if init:
            self.init_args.append(name)
        return name

    def source(self, seed: int) -> str:
        params = ", ".join(self.init_args)
        lines = ["import torch", "import torch.nn as nn", "", "",
                 "class Model(nn.Module):",
                 f'    """Synthetic problem (kb_gym, seed {seed}): {" -> ".join(self.parts)}."""', "",
                 f"    def __init__(self{', ' + params if params else ''}):",
                 "        super().__init__()"]
        lines += [f"        {m}" for m in self.members]
        lines += ["", f"    def forward(self, {', '.join(self.args)}):"]
        lines += [f"        {f}" for f in self.forward] + ["        return x", "", ""]
        lines += [f"{name} = {value!r}" for name, value in self.constants]
        lines += ["", "", "def get_inputs():", f"    return [{', '.join(self.inputs)}]", "", "",
                  "def get_init_inputs():", f"    return [{', '.join(self.init_args)}]", ""]
        return "\n".join(lines)


# --- heads: the operator that makes the main tensor -------------------------------------------------

def _linear(p: _Program, rng: random.Random) -> None:
    p.parts.append("Linear")
    p.constant("batch_size", rng.choice([64, 128, 256]))
    p.constant("in_features", rng.choice([256, 512, 1024]), init=True)
    out_features = rng.choice([256, 512, 1024])
    p.constant("out_features", out_features, init=True)
    p.members.append("self.linear = nn.Linear(in_features, out_features)")
    p.forward.append("x = self.linear(x)")
    p.inputs.append("torch.randn(batch_size, in_features)")
    p.bias_shape, p.norm_dim = (out_features,), "out_features"


def _conv2d(p: _Program, rng: random.Random) -> None:
    p.parts.append("Conv2d")
    p.constant("batch_size", rng.choice([8, 16]))
    p.constant("in_channels", rng.choice([3, 8, 16]), init=True)
    out_channels = rng.choice([16, 32])
    p.constant("out_channels", out_channels, init=True)
    p.constant("kernel_size", rng.choice([3, 5]), init=True)
    side = rng.choice([32, 64])
    p.constant("height", side)
    p.constant("width", side)
    p.members.append("self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)")
    p.forward.append("x = self.conv(x)")
    p.inputs.append("torch.randn(batch_size, in_channels, height, width)")
    p.bias_shape = (out_channels, 1, 1)


def _bmm(p: _Program, rng: random.Random) -> None:
    p.parts.append("BatchedMatmul")
    p.constant("batch_size", rng.choice([8, 16]))
    sizes = {name: rng.choice([128, 256, 512]) for name in ("m", "k", "n")}
    for name, value in sizes.items():
        p.constant(name, value)
    p.args = ["x", "y"]
    p.forward.append("x = torch.bmm(x, y)")
    p.inputs += ["torch.randn(batch_size, m, k)", "torch.randn(batch_size, k, n)"]
    p.feature_dim, p.norm_dim, p.bias_shape = "2", "n", (sizes["n"],)


def _elementwise_input(p: _Program, rng: random.Random) -> None:
    p.constant("batch_size", rng.choice([256, 1024, 4096]))
    p.constant("dim", rng.choice([1024, 4096]))
    p.inputs.append("torch.randn(batch_size, dim)")
    p.norm_dim = "dim"


HEADS = (_linear, _conv2d, _bmm)

# --- operators that follow: (name, forward line, needs) ---------------------------------------------

ACTIVATIONS: dict[str, str] = {
    "ReLU": "x = torch.relu(x)",
    "GELU": "x = torch.nn.functional.gelu(x)",
    "SiLU": "x = x * torch.sigmoid(x)",
    "Tanh": "x = torch.tanh(x)",
    "Sigmoid": "x = torch.sigmoid(x)",
    "LeakyReLU": "x = torch.nn.functional.leaky_relu(x, negative_slope=0.1)",
    "Mish": "x = x * torch.tanh(torch.nn.functional.softplus(x))",
    "HardSwish": "x = x * torch.clamp(x + 3, 0, 6) / 6",
}


SATURATING = ("Tanh", "Sigmoid")


def _activation(p: _Program, rng: random.Random) -> None:
    name = rng.choice(sorted(ACTIVATIONS))
    p.parts.append(name)
    p.forward.append(ACTIVATIONS[name])
    p.saturated |= name in SATURATING  # and stays so: an elementwise op after a bound keeps a bound
    p.zero_sum = False


def _scale(p: _Program, rng: random.Random) -> None:
    p.parts.append("Scale")
    name = p.constant(p.unique("scale"), rng.choice([0.5, 1.5, 2.0]), init=True)
    p.members.append(f"self.{name} = {name}")
    p.forward.append(f"x = x * self.{name}")


def _bias(p: _Program, rng: random.Random) -> None:
    p.parts.append("BiasAdd")
    shape = p.constant(p.unique("bias_shape"), p.bias_shape, init=True)
    member = shape.replace("_shape", "")
    p.members.append(f"self.{member} = nn.Parameter(torch.randn({shape}) * 0.1)")
    p.forward.append(f"x = x + self.{member}")


def _clamp(p: _Program, rng: random.Random) -> None:
    p.parts.append("Clamp")
    bound = rng.choice([0.5, 1.0])
    p.forward.append(f"x = torch.clamp(x, min={-bound}, max={bound})")
    p.saturated, p.zero_sum = True, False


def _softmax(p: _Program, rng: random.Random) -> None:
    p.parts.append("Softmax")
    p.forward.append(f"x = torch.softmax(x, dim={p.feature_dim})")


def _layernorm(p: _Program, rng: random.Random) -> None:
    p.parts.append("LayerNorm")
    p.members.append(f"self.norm = nn.LayerNorm({p.norm_dim})")
    p.forward.append("x = self.norm(x)")
    if p.norm_dim not in p.init_args:
        p.init_args.append(p.norm_dim)
    p.norm_dim = None  # one per program
    p.zero_sum = True


REDUCTIONS: dict[str, str] = {
    "Sum": "x = torch.sum(x, dim={d}, keepdim=True)",
    "Max": "x = torch.amax(x, dim={d}, keepdim=True)",
    "LogSumExp": "x = torch.logsumexp(x, dim={d}, keepdim=True)",
}


def _reduction(p: _Program, rng: random.Random) -> None:
    # The max of a thousand clamped (or tanh'd) values is the bound itself, whatever the inputs; the
    # sum of a LayerNorm's row (scaled, shifted) is a constant.
    banned = ({"Max"} if p.saturated else set()) | ({"Sum"} if p.zero_sum else set())
    name = rng.choice(sorted(set(REDUCTIONS) - banned))
    p.parts.append(name)
    p.forward.append(REDUCTIONS[name].format(d=p.feature_dim))


def _followers(p: _Program, rng: random.Random, count: int) -> None:
    pointwise = [_activation, _activation, _scale, _bias, _clamp]
    for i in range(count):
        last = i == count - 1
        choices = pointwise + ([_softmax] if last else []) + ([_layernorm] if p.norm_dim and not last else [])
        rng.choice([_reduction] if last and rng.random() < 0.3 else choices)(p, rng)


def _build(level: int, rng: random.Random) -> _Program:
    p = _Program()
    if level == 1:
        if rng.random() < 0.5:
            rng.choice(HEADS)(p, rng)
        else:
            _elementwise_input(p, rng)
            rng.choice([_activation, _activation, _softmax, _layernorm, _reduction])(p, rng)
    else:
        rng.choice(HEADS)(p, rng)
        _followers(p, rng, rng.choice([1, 2, 2, 3]))
    return p


def generate_problems(n: int = DEFAULT_COUNT, seed: int = 0, level: int | None = None) -> list[Problem]:
    """``n`` synthetic problems (about 30% level 1, the rest level 2), the same for the same seed.

    ``level`` keeps one level (still ``n`` problems). Ids run from 1 within each level; names
    read ``"<id>_Syn_<ops>"`` (``"7_Syn_Linear_GELU_Scale"``) so they never collide with official ones.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    rng = random.Random(seed)
    problems: list[Problem] = []
    next_id = {1: 1, 2: 1}
    while len(problems) < n:
        lvl = level or (1 if rng.random() < LEVEL1_SHARE else 2)
        program = _build(lvl, rng)
        name = f"{next_id[lvl]}_Syn_{'_'.join(program.parts)}"
        problems.append(Problem(id=next_id[lvl], name=name, level=lvl, code=program.source(seed),
                                source=f"synthetic:{n}:{seed}"))
        next_id[lvl] += 1
    return problems


def parse_spec(spec: str) -> tuple[int, int]:
    """``"synthetic"``, ``"synthetic:N"`` or ``"synthetic:N:SEED"`` -> (N, SEED)."""
    parts = spec.split(":")
    if parts[0] != "synthetic" or len(parts) > 3 or not all(x.isdigit() for x in parts[1:]):
        raise ValueError(f"expected 'synthetic', 'synthetic:N' or 'synthetic:N:SEED', got {spec!r}")
    n = int(parts[1]) if len(parts) > 1 else DEFAULT_COUNT
    return n, int(parts[2]) if len(parts) > 2 else 0
