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

Two sizes. The seed's random stream draws each problem's operators and its CPU shapes, as it always
has; ``size="gpu"`` keeps those operators (so a key names the same computation at both sizes) and
draws the shapes again from a stream of the problem's own, from larger ranges, rescaling the batch
until the roofline model of problems/cost_model.py puts the eager fp32 forward on an H200 at 1-15 ms
with under 8 GB in use. The estimate is written into the code, read back by :func:`recorded_estimate`:
``# estimated eager time on an H200: 3.21 ms; memory 1.05 GB (kb_gym cost model, not measured)``.
At the GPU size the dimension a softmax, LayerNorm or reduction runs over stays at most 4096 (the
CPU size's largest), and within the CPU size's range where a softmax or reduction ends the program
(see FEATURE_DIM), so mostly the number of rows and the contracted dimensions grow. Codes within
a set are distinct: a problem whose code repeats an earlier one's draws its shapes again (from wider
CPU ranges at the CPU size), so every problem that was not such a repeat is exactly as before.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kb_gym.problems import cost_model as cm
from kb_gym.problems.problem import Problem, ProblemError

DEFAULT_COUNT = 100
LEVEL1_SHARE = 0.3
SIZES = ("cpu", "gpu")

GPU_MS = (1.0, 15.0)  # the estimated eager forward at the GPU size lands here
GPU_TARGET_MS = (1.5, 12.0)  # the batch is rescaled towards a time drawn log-uniformly from here
GPU_MEMORY_BYTES = 8e9  # inputs, parameters and every tensor the forward allocates
MAX_ATTEMPTS = 1000  # shape draws for one problem before giving up
ESTIMATE_RE = re.compile(r"^# estimated eager time on an H200: (?P<ms>[0-9.]+) ms; memory (?P<gb>[0-9.]+) GB",
                         re.MULTILINE)

# The CPU shapes the seed's stream draws, per head ("side" sets height and width).
CPU_CHOICES: dict[str, dict[str, tuple[int, ...]]] = {
    "linear": {"batch_size": (64, 128, 256), "in_features": (256, 512, 1024), "out_features": (256, 512, 1024)},
    "conv2d": {"batch_size": (8, 16), "in_channels": (3, 8, 16), "out_channels": (16, 32), "kernel_size": (3, 5),
               "side": (32, 64)},
    "bmm": {"batch_size": (8, 16), "m": (128, 256, 512), "k": (128, 256, 512), "n": (128, 256, 512)},
    "input": {"batch_size": (256, 1024, 4096), "dim": (1024, 4096)},
}
# Shapes drawn again, per head: a problem whose CPU code repeats an earlier one's, or any problem at the
# GPU size. "side" sets height and width. At the CPU size they stay within today's CPU extremes; at the GPU
# size the batch is then rescaled (up to GPU_MAX_BATCH) for the time. A CPU redraw takes at least one value
# outside CPU_CHOICES, so it never repeats a problem the seed's stream draws later.
CPU_RANGES: dict[str, dict[str, Sequence[int]]] = {
    "linear": {"batch_size": range(64, 257, 8), "in_features": range(256, 1025, 32),
               "out_features": range(256, 1025, 32)},
    "conv2d": {"batch_size": range(8, 17), "in_channels": range(3, 17), "out_channels": range(16, 33, 2),
               "kernel_size": (3, 5), "side": range(32, 65, 4)},
    "bmm": {"batch_size": range(8, 17), "m": range(128, 513, 16), "k": range(128, 513, 16), "n": range(128, 513, 16)},
    "input": {"batch_size": range(256, 4097, 16), "dim": range(1024, 4097, 128)},
}
GPU_RANGES: dict[str, dict[str, Sequence[int]]] = {
    "linear": {"in_features": range(1024, 8193, 256), "out_features": range(1024, 4097, 128)},
    "conv2d": {"in_channels": (3, 8, 16, 32, 64), "out_channels": (16, 32, 48, 64, 96, 128),
               "kernel_size": (3, 5), "side": range(64, 257, 16)},
    "bmm": {"m": range(256, 2049, 64), "k": range(256, 2049, 64), "n": range(256, 4097, 64)},
    "input": {"dim": range(1024, 4097, 128)},
}
GPU_MAX_BATCH = {"linear": 1 << 20, "conv2d": 512, "bmm": 4096, "input": 1 << 22}
# The dimension a softmax or reduction runs over. Where one ends the program, the GPU size draws it from
# CPU_RANGES: over a longer row a softmax's values sink towards the absolute tolerance and a logsumexp
# of bounded values moves less between inputs (flagged near-constant in a scan of 1,000 problems at
# GPU_RANGES' sizes, none at the CPU size's), so it keeps the rows the CPU size's audit passed.
FEATURE_DIM = {"linear": "out_features", "conv2d": "out_channels", "bmm": "n", "input": "dim"}


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
    head: str = "input"  # which head made the main tensor: a key of CPU_RANGES
    steps: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) of each operator after the head

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

    def sizes(self) -> dict[str, int]:
        """The head's shape constants as drawn (the CPU size)."""
        return {name: value for name, value in self.constants if name in _head_names(self.head)}

    def source(self, seed: int, sizes: Mapping[str, int] | None = None, note: str | None = None) -> str:
        """The problem's code, with the head's shape constants ``sizes`` (default: as drawn) and a
        comment ``note`` above the constants."""
        sizes = self.sizes() if sizes is None else sizes
        bias = _bias_shape(self.head, sizes)
        params = ", ".join(self.init_args)
        lines = ["import torch", "import torch.nn as nn", "", "",
                 "class Model(nn.Module):",
                 f'    """Synthetic problem (kb_gym, seed {seed}): {" -> ".join(self.parts)}."""', "",
                 f"    def __init__(self{', ' + params if params else ''}):",
                 "        super().__init__()"]
        lines += [f"        {m}" for m in self.members]
        lines += ["", f"    def forward(self, {', '.join(self.args)}):"]
        lines += [f"        {f}" for f in self.forward] + ["        return x", "", ""]
        lines += [f"# {note}"] if note else []
        lines += [f"{name} = {_sized(name, value, sizes, bias)!r}" for name, value in self.constants]
        lines += ["", "", "def get_inputs():", f"    return [{', '.join(self.inputs)}]", "", "",
                  "def get_init_inputs():", f"    return [{', '.join(self.init_args)}]", ""]
        return "\n".join(lines)


def _head_names(head: str) -> tuple[str, ...]:
    names = tuple(CPU_RANGES[head])
    return tuple(n for n in names if n != "side") + (("height", "width") if "side" in names else ())


def _bias_shape(head: str, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The shape a BiasAdd's parameter takes: one value per feature or channel of the head's output."""
    if head == "linear":
        return (sizes["out_features"],)
    if head == "conv2d":
        return (sizes["out_channels"], 1, 1)
    if head == "bmm":
        return (sizes["n"],)
    return (1,)


def _sized(name: str, value: object, sizes: Mapping[str, int], bias: tuple[int, ...]) -> object:
    if name in sizes:
        return sizes[name]
    if name == "bias_shape" or name.startswith("bias_shape_"):
        return bias
    return value  # a scale: the same at both sizes


# --- heads: the operator that makes the main tensor -------------------------------------------------

def _linear(p: _Program, rng: random.Random) -> None:
    p.parts.append("Linear")
    p.head = "linear"
    c = CPU_CHOICES["linear"]
    p.constant("batch_size", rng.choice(c["batch_size"]))
    p.constant("in_features", rng.choice(c["in_features"]), init=True)
    out_features = rng.choice(c["out_features"])
    p.constant("out_features", out_features, init=True)
    p.members.append("self.linear = nn.Linear(in_features, out_features)")
    p.forward.append("x = self.linear(x)")
    p.inputs.append("torch.randn(batch_size, in_features)")
    p.bias_shape, p.norm_dim = (out_features,), "out_features"


def _conv2d(p: _Program, rng: random.Random) -> None:
    p.parts.append("Conv2d")
    p.head = "conv2d"
    c = CPU_CHOICES["conv2d"]
    p.constant("batch_size", rng.choice(c["batch_size"]))
    p.constant("in_channels", rng.choice(c["in_channels"]), init=True)
    out_channels = rng.choice(c["out_channels"])
    p.constant("out_channels", out_channels, init=True)
    p.constant("kernel_size", rng.choice(c["kernel_size"]), init=True)
    side = rng.choice(c["side"])
    p.constant("height", side)
    p.constant("width", side)
    p.members.append("self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)")
    p.forward.append("x = self.conv(x)")
    p.inputs.append("torch.randn(batch_size, in_channels, height, width)")
    p.bias_shape = (out_channels, 1, 1)


def _bmm(p: _Program, rng: random.Random) -> None:
    p.parts.append("BatchedMatmul")
    p.head = "bmm"
    c = CPU_CHOICES["bmm"]
    p.constant("batch_size", rng.choice(c["batch_size"]))
    sizes = {name: rng.choice(c[name]) for name in ("m", "k", "n")}
    for name, value in sizes.items():
        p.constant(name, value)
    p.args = ["x", "y"]
    p.forward.append("x = torch.bmm(x, y)")
    p.inputs += ["torch.randn(batch_size, m, k)", "torch.randn(batch_size, k, n)"]
    p.feature_dim, p.norm_dim, p.bias_shape = "2", "n", (sizes["n"],)


def _elementwise_input(p: _Program, rng: random.Random) -> None:
    p.head = "input"
    c = CPU_CHOICES["input"]
    p.constant("batch_size", rng.choice(c["batch_size"]))
    p.constant("dim", rng.choice(c["dim"]))
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
# The eager kernels of each activation's forward line: (op, tensors of the full size it reads).
ACTIVATION_OPS: dict[str, tuple[tuple[str, int], ...]] = {
    "ReLU": (("relu", 1),),
    "GELU": (("gelu", 1),),
    "SiLU": (("sigmoid", 1), ("mul", 2)),
    "Tanh": (("tanh", 1),),
    "Sigmoid": (("sigmoid", 1),),
    "LeakyReLU": (("leaky_relu", 1),),
    "Mish": (("softplus", 1), ("tanh", 1), ("mul", 2)),
    "HardSwish": (("add", 1), ("clamp", 1), ("mul", 2), ("div", 1)),
}


SATURATING = ("Tanh", "Sigmoid")


def _activation(p: _Program, rng: random.Random) -> None:
    name = rng.choice(sorted(ACTIVATIONS))
    p.parts.append(name)
    p.steps.append(("activation", name))
    p.forward.append(ACTIVATIONS[name])
    p.saturated |= name in SATURATING  # and stays so: an elementwise op after a bound keeps a bound
    p.zero_sum = False


def _scale(p: _Program, rng: random.Random) -> None:
    p.parts.append("Scale")
    p.steps.append(("scale", "Scale"))
    name = p.constant(p.unique("scale"), rng.choice([0.5, 1.5, 2.0]), init=True)
    p.members.append(f"self.{name} = {name}")
    p.forward.append(f"x = x * self.{name}")


def _bias(p: _Program, rng: random.Random) -> None:
    p.parts.append("BiasAdd")
    p.steps.append(("bias", "BiasAdd"))
    shape = p.constant(p.unique("bias_shape"), p.bias_shape, init=True)
    member = shape.replace("_shape", "")
    p.members.append(f"self.{member} = nn.Parameter(torch.randn({shape}) * 0.1)")
    p.forward.append(f"x = x + self.{member}")


def _clamp(p: _Program, rng: random.Random) -> None:
    p.parts.append("Clamp")
    p.steps.append(("clamp", "Clamp"))
    bound = rng.choice([0.5, 1.0])
    p.forward.append(f"x = torch.clamp(x, min={-bound}, max={bound})")
    p.saturated, p.zero_sum = True, False


def _softmax(p: _Program, rng: random.Random) -> None:
    p.parts.append("Softmax")
    p.steps.append(("softmax", "Softmax"))
    p.forward.append(f"x = torch.softmax(x, dim={p.feature_dim})")


def _layernorm(p: _Program, rng: random.Random) -> None:
    p.parts.append("LayerNorm")
    p.steps.append(("layernorm", "LayerNorm"))
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
    p.steps.append(("reduction", name))
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


# --- the cost of the eager forward (problems/cost_model.py) and the shapes drawn for a size ----------

def eager_ops(p: _Program, sizes: Mapping[str, float]) -> tuple[list[cm.Op], float]:
    """The eager kernels of ``p``'s forward with the head's shape constants ``sizes``, and the bytes
    resident before it runs (inputs, parameters)."""
    s, f = sizes, cm.FP32_BYTES
    b = s["batch_size"]
    if p.head == "linear":
        rows, feats, k = b, s["out_features"], s["in_features"]
        ops = [cm.matmul("addmm", 1, rows, k, feats, bias=feats, shared_rhs=True)]
        resident = (rows * k + k * feats + feats) * f
    elif p.head == "conv2d":
        cin, feats, kernel, hw = s["in_channels"], s["out_channels"], s["kernel_size"], s["height"] * s["width"]
        rows = b * hw
        ops = [cm.conv2d("convolution", b, cin, feats, kernel, s["height"], s["width"]),
               cm.pointwise("add_", rows * feats, extra_read=feats, inplace=True)]  # the conv's bias, added after
        resident = (b * cin * hw + feats * cin * kernel * kernel + feats) * f
    elif p.head == "bmm":
        rows, feats = b * s["m"], s["n"]
        ops = [cm.matmul("bmm", b, s["m"], s["k"], feats)]
        resident = (b * s["m"] * s["k"] + b * s["k"] * feats) * f
    else:
        rows, feats = b, s["dim"]
        ops, resident = [], rows * feats * f
    numel = rows * feats
    for kind, name in p.steps:
        if kind == "activation":
            ops += [cm.pointwise(op, numel, reads=reads) for op, reads in ACTIVATION_OPS[name]]
        elif kind in ("scale", "clamp", "softmax"):
            ops.append(cm.pointwise(kind, numel))
        elif kind == "bias":
            ops.append(cm.pointwise("add", numel, extra_read=feats))
            resident += feats * f
        elif kind == "layernorm":  # reads the rows and the affine parameters, writes rows, mean and rstd
            ops.append(cm.Op("native_layer_norm", (2 * numel + 2 * feats + 2 * rows) * f, flops=8 * numel,
                             alloc=(numel + 2 * rows) * f))
            resident += 2 * feats * f
        elif name == "LogSumExp":
            ops += _logsumexp_ops(numel, rows)
            numel, feats = rows, 1
        else:
            ops.append(cm.reduction("sum" if name == "Sum" else "amax", numel, rows))
            numel, feats = rows, 1
    return ops, resident


def _logsumexp_ops(numel: float, rows: float) -> list[cm.Op]:
    """torch.logsumexp's eager kernels: the max, the max cleaned of infinities, exp(x - max), its sum,
    log and the max added back."""
    return [cm.reduction("amax", numel, rows), cm.pointwise("abs", rows), cm.pointwise("eq", rows),
            cm.pointwise("masked_fill_", rows, inplace=True), cm.pointwise("sub", numel, extra_read=rows),
            cm.pointwise("exp_", numel, inplace=True), cm.reduction("sum", numel, rows),
            cm.pointwise("log_", rows, inplace=True), cm.pointwise("add_", rows, reads=2, inplace=True)]


def estimate(p: _Program, sizes: Mapping[str, float]) -> tuple[float, float]:
    """(estimated eager ms on an H200, bytes in use) of ``p``'s forward at ``sizes``."""
    ops, resident = eager_ops(p, sizes)
    return cm.eager_ms(ops), cm.memory_bytes(ops, resident)


def _draw(ranges: Mapping[str, Sequence[int]], rng: random.Random) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for name, choices in ranges.items():
        value = rng.choice(choices)
        if name == "side":
            sizes["height"] = sizes["width"] = value
        else:
            sizes[name] = value
    return sizes


def _cpu_redraw(head: str, rng: random.Random) -> dict[str, int]:
    """CPU shapes from CPU_RANGES with at least one value outside CPU_CHOICES."""
    while True:
        sizes = _draw(CPU_RANGES[head], rng)
        if any(sizes[name] not in CPU_CHOICES[head]["side" if name in ("height", "width") else name]
               for name in sizes):
            return sizes


def _gpu_batch(p: _Program, sizes: dict[str, int], target_ms: float) -> int | None:
    """The batch that brings the estimate to about ``target_ms``, kept under 99% of the memory limit
    and under ``GPU_MAX_BATCH`` (a multiple of 8 from 64 up); None when not even one fits."""
    launch_ms = 1e3 * cm.LAUNCH_S * len(eager_ops(p, {**sizes, "batch_size": 1})[0])
    batch = 64.0
    for _ in range(4):  # every op's bytes and flops grow about linearly with the batch
        ms = estimate(p, {**sizes, "batch_size": batch})[0]
        batch *= (target_ms - launch_ms) / (ms - launch_ms)
    one, two = (estimate(p, {**sizes, "batch_size": b})[1] for b in (1, 2))
    batch = min(batch, (0.99 * GPU_MEMORY_BYTES - (2 * one - two)) / (two - one), GPU_MAX_BATCH[p.head])
    if batch < 1:
        return None
    return int(batch) // 8 * 8 if batch >= 64 else int(batch)


def gpu_sizes(p: _Program, rng: random.Random) -> tuple[dict[str, int], float, float]:
    """Head shape constants for the GPU size: drawn from GPU_RANGES (a final softmax's or reduction's
    dimension from CPU_RANGES, see FEATURE_DIM), the batch rescaled for a time drawn from GPU_TARGET_MS,
    redrawn until the estimate is within GPU_MS and memory under GPU_MEMORY_BYTES.
    Returns (sizes, estimated ms, bytes)."""
    low, high = (math.log(t) for t in GPU_TARGET_MS)
    for _ in range(MAX_ATTEMPTS):
        sizes = _draw(GPU_RANGES[p.head], rng)
        if p.steps and p.steps[-1][0] in ("softmax", "reduction"):
            feature = FEATURE_DIM[p.head]
            sizes[feature] = rng.choice(CPU_RANGES[p.head][feature])
        batch = _gpu_batch(p, sizes, math.exp(rng.uniform(low, high)))
        if batch is None:
            continue
        sizes["batch_size"] = batch
        ms, memory = estimate(p, sizes)
        if GPU_MS[0] <= ms <= GPU_MS[1] and memory < GPU_MEMORY_BYTES:
            return sizes, ms, memory
    raise ProblemError(f"no GPU-size shapes for {' -> '.join(p.parts)} in {MAX_ATTEMPTS} draws")


def recorded_estimate(code: str) -> tuple[float, float] | None:
    """(ms, GB) a GPU-size synthetic problem's code records as its estimate; None in other code."""
    match = ESTIMATE_RE.search(code)
    return (float(match["ms"]), float(match["gb"])) if match else None


def _distinct_code(p: _Program, seed: int, index: int, size: str, seen: set[str]) -> str:
    """``p``'s code at ``size``, its shapes drawn again (from a stream of this problem's own) while the
    code repeats one in ``seen``. At the CPU size the first try is the shapes as drawn."""
    for attempt in range(MAX_ATTEMPTS):
        own = random.Random(f"kb_gym.synthetic:{seed}:{index}:{size}:{attempt}")
        if size == "gpu":
            sizes, ms, memory = gpu_sizes(p, own)
            code = p.source(seed, sizes, f"estimated eager time on an H200: {ms:.2f} ms; memory {memory / 1e9:.2f} GB "
                                         "(kb_gym cost model, not measured)")
        else:
            code = p.source(seed, None if attempt == 0 else _cpu_redraw(p.head, own))
        if code not in seen:
            return code
    raise ProblemError(f"no new shapes for {' -> '.join(p.parts)} in {MAX_ATTEMPTS} draws")


def generate_problems(n: int = DEFAULT_COUNT, seed: int = 0, level: int | None = None,
                      size: str = "cpu") -> list[Problem]:
    """``n`` synthetic problems (about 30% level 1, the rest level 2), the same for the same seed.

    ``level`` keeps one level (still ``n`` problems). Ids run from 1 within each level; names
    read ``"<id>_Syn_<ops>"`` (``"7_Syn_Linear_GELU_Scale"``) so they never collide with official ones.
    ``size`` is ``"cpu"`` (shapes for a forward well under 0.1 s on a CPU thread) or ``"gpu"`` (the
    same operators, shapes for 1-15 ms on an H200 by the cost model's estimate). The codes are distinct.
    """
    if size not in SIZES:
        raise ProblemError(f"size must be one of {', '.join(map(repr, SIZES))}, got {size!r}")
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    rng = random.Random(seed)
    problems: list[Problem] = []
    seen: set[str] = set()
    next_id = {1: 1, 2: 1}
    while len(problems) < n:
        lvl = level or (1 if rng.random() < LEVEL1_SHARE else 2)
        program = _build(lvl, rng)
        code = _distinct_code(program, seed, len(problems), size, seen)
        seen.add(code)
        name = f"{next_id[lvl]}_Syn_{'_'.join(program.parts)}"
        problems.append(Problem(id=next_id[lvl], name=name, level=lvl, code=code, source=f"synthetic:{n}:{seed}",
                                size=size))
        next_id[lvl] += 1
    return problems


def parse_spec(spec: str) -> tuple[int, int]:
    """``"synthetic"``, ``"synthetic:N"`` or ``"synthetic:N:SEED"`` -> (N, SEED)."""
    parts = spec.split(":")
    if parts[0] != "synthetic" or len(parts) > 3 or not all(x.isdigit() for x in parts[1:]):
        raise ValueError(f"expected 'synthetic', 'synthetic:N' or 'synthetic:N:SEED', got {spec!r}")
    n = int(parts[1]) if len(parts) > 1 else DEFAULT_COUNT
    return n, int(parts[2]) if len(parts) > 2 else 0
