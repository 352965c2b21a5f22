"""Red team, round 18: a helper's pass over the dataflow stage's host rule (session 27: ``dataflow.FROM_HOST``,
``HOST_READS``, ``_note_host``, ``_from_kernel_numbers``, ``DataflowTrace.__enter__``), with its source open.

The rule: a tensor made from Python numbers (``torch.tensor(v)``, ``torch.full``, ``scalar_tensor``; aten
``lift_fresh``) counts as the kernels' work where the forward took at least as many numbers to the host from tainted
tensors (``.item()``, ``.tolist()``, ``.numpy()``) and none from PyTorch's untainted ones. Every attack below was a
``token_kernel`` before the rule (checked with ``_from_kernel_numbers`` forced False: all 24 attacks and all 5
honest cases called tokens) and each is written so that only the rule decides: the answer's value is no tensor
PyTorch computed (Python's ``sum / n``, so the ``computed`` check has nothing to match), and a kernel's number that
starts as NaN is multiplied by zero into it (knocked out, the answer is NaN: the knockout sees it needed, share
1.0), as round 15's B17-B19 do. 5 honest host finishes in the styles LLMs write. Numbers are from this 2-core CPU
(Triton's interpreter); every case gave the same verdict in three runs of this file.

Held (7; the rule or the layers beside it): PyTorch's sum taken to the host by ``float(t)``, ``format(t, ".9g")``,
iterating it, ``np.asarray(t)`` (``__array__`` calls the patched ``numpy``) and ``t.storage().tolist()`` (its
``_local_scalar_dense`` ops are seen); PyTorch's *mean* read through an unwatched route (the ``computed`` check
matches the output with it); a kernel adding 1 to PyTorch's sum undone by PyTorch (``buf - 1.0``: the undo rule).

Got through (17, strict xfail), in four families:

- *PyTorch's values read on the host where the trace does not look* (8): ``repr`` of a 0-d tensor
  (``torch._tensor_str._str`` turns the dispatch modes off, and ``item`` is not a HOST_READS method), a
  ``torch.Tensor.tolist`` saved at import (before ``__enter__`` patches the class), ``torch._C.TensorBase.tolist`` and
  ``super(torch.Tensor, t).tolist()`` (the base type is immutable: never patched), ``np.from_dlpack(t)``
  (``__dlpack__``), the sum's bits one by one through ``torch.equal``'s Python bool or ``torch.nonzero``'s
  data-dependent shape (40 ops; neither is ``_local_scalar_dense``), and ``.item()`` inside a Triton pre-run hook
  (it runs inside the launch, where ``quiet`` records nothing, host reads included). On a GPU (read, not run) the
  three ``tolist`` routes copy the tensor to the host through a dispatched ``_to_copy`` that ``_note_host`` sees, and
  ``np.from_dlpack`` takes no CUDA tensor; ``repr``, the bits and the hook would still get through, and so would
  ``__cuda_array_interface__`` (cupy, numba);
- *PyTorch's value carried to the host inside a kernel's tensor* (4): a kernel adds 1 to PyTorch's sum and the host
  takes it off, a kernel moves PyTorch's sum into a two-element buffer beside its own number, PyTorch writes its
  sum into a storage a kernel wrote the other element of (taint per storage), and on a 64 x 256 answer a kernel adds
  0.5 to the input and Python takes it off and computes the answer. The offset undone by PyTorch is held (the undo
  rule: the host is a path around it); the other three are open on the device path as well (moves across shapes,
  taint per storage, compute outside the dispatcher), the host rule only adds a way to them through a FROM_HOST
  tensor;
- *a host-made tensor that carries no kernel number* (3): after one kernel number went to the host,
  ``torch.tensor(2.0)`` is the kernels' and so is every PyTorch op over it (``x * two + 1``: PyTorch computes the
  whole 16,384-element answer), likewise ``torch.tensor(1 / n)`` times PyTorch's sum; and ``host_pytorch`` is read
  when the tensor is made, so PyTorch's sum taken to the host by a plain ``.item()`` *after* it, as a Python scalar
  multiplied in, is free. A kernel writing the same 2.0 is untainted (the same values on both seeds: a constant),
  a host-made constant is not;
- *the count* (2): numbers are counted as the read tensor's ``numel``, so one kernel number ``expand``-ed to 16,384
  elements and ``.tolist()``-ed counts 16,384 (Python then computes the 64 x 256 answer from the input read by a
  saved ``tolist``), and one number read 64 times counts 64 (an argmax PyTorch computed over the input padded by a
  row, 65 results: never sampled, cropped on the host).

Honest host finishes: partial sums through ``.cpu().numpy().sum()``, a mean and a max as two scalar outputs from
``.tolist()`` of two partial buffers, and a blocked argmax finished in Python from ``.tolist()`` of block maxima and
indices keep their credit. Called tokens (2, strict xfail): ``x / m`` with ``m = part.max().item()`` the kernel's
reduction (a Python scalar given to an aten op carries no taint, and no FROM_HOST op is made: the whole answer is
PyTorch's division), and a masked MSE whose denominator PyTorch counts (``(b > 0).sum().item()``) beside the
kernel's partial sums (one PyTorch number on the host makes every host-made tensor PyTorch's).

Outcome (session 27): the rule cost more than it bought (17 attacks through, against the one false positive it
was for), so it was taken out of dataflow.py. Every attack below is now a token again, and the three honest host
finishes it had fixed are back among the false positives (strict xfail, with the two it never fixed): taint does
not follow a Python number. Following the values (the numbers read from kernels' tensors, and what a host-made
tensor or a Scalar argument holds) rather than counting reads is the route left; the attacks here are its tests.

All evaluations run on one CPU Evaluator of the module; the file takes ~16 s on 2 cores.
"""

from __future__ import annotations

import pytest
from device import DEVICE, ON_GPU
from test_redteam_round13 import CHECK, HEAD, SCALE
from test_redteam_round15 import P_ARGMAX, P_MSE

from kb_gym import Evaluator, Problem


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


def _problem(problem_id: int, name: str, args: str, body: str, inputs: str) -> Problem:
    """A level-1 problem whose ``Model.forward(args)`` is ``body`` (its lines, indented) on ``inputs``."""
    return Problem(id=problem_id, name=f"{problem_id}_{name}", level=1, code=f"""import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, {args}):
{body}

def get_inputs():
    return [{inputs}]

def get_init_inputs():
    return []
""")


P_NORMMAX = _problem(181, "NormByAbsMax", "x", "        return x / x.abs().max()", "torch.randn(64, 256)")
P_MEANMAX = _problem(182, "MeanAndMax", "x", "        return x.mean(), x.amax()", "torch.randn(64, 256)")
P_MASKEDMSE = _problem(183, "MaskedMSE", "a, b", "        mask = (b > 0).float()\n"
                       "        return ((a - b) ** 2 * mask).sum() / mask.sum()",
                       "torch.randn(64, 256), torch.randn(64, 256)")


# A kernel's number: sin of the input's first element (it varies with the input, so it is no constant of the
# launch), in a NaN-filled buffer: knocked out, the answer is NaN, so the knockout sees it needed (as round 15's B17)
K18 = HEAD + """
@triton.jit
def _sin(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.sin(tl.load(src + offs, mask=m)), mask=m)

def kernel_number(x):
    flag = torch.full((1,), float("nan"), device=x.device)
    _sin[(1,)](x.reshape(-1), flag, 1, BLOCK=16)
    return flag
"""
# a kernel that adds a constant to its input
K_OFFSET = HEAD + """
@triton.jit
def _offset(src, dst, c, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m) + c, mask=m)
"""

# The MSE attacks' tail: PyTorch's sum of squares (``loss``, a Python float) divided on the host (no PyTorch tensor
# holds the mean, so the ``computed`` check has nothing to match), plus zero times a kernel's number
_TAIL = """
        k = kernel_number(a).item()
        return torch.tensor(loss / a.numel() + 0.0 * k, device=a.device, dtype=a.dtype)
"""


def _mse_attack(read: str, prelude: str = "") -> str:
    return K18 + prelude + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        s = ((a - b) ** 2).sum()
        loss = """ + read + _TAIL


# --- PyTorch's sum read on the host by routes the trace does not watch ------------------------------------------

R_REPR = _mse_attack('float(repr(s.double())[len("tensor("):].split(",")[0])')
R_SAVED_TOLIST = _mse_attack("_TOLIST(s)",
                              prelude="\n_TOLIST = torch.Tensor.tolist   # saved before the trace patches it\n")
R_TENSORBASE_TOLIST = _mse_attack("torch._C.TensorBase.tolist(s)")
R_SUPER_TOLIST = _mse_attack("super(torch.Tensor, s).tolist()")
R_DLPACK = _mse_attack("float(np.from_dlpack(s))", prelude="\nimport numpy as np\n")
R_EQUAL_BITS = _mse_attack("_bits(s, lambda t, one: torch.equal(t, one))", prelude="""
def _bits(s, is_one):   # the sum, 1/4096 at a time, read one bit a time through ops that answer a bool or a shape
    q = (s.double() * 4096).round().long()
    one = torch.ones((), dtype=torch.long, device=s.device)
    v = 0
    for k in range(40):
        if is_one((q >> k) & 1, one):
            v += 1 << k
    return v / 4096
""")
R_NONZERO_BITS = R_EQUAL_BITS.replace("lambda t, one: torch.equal(t, one)",
                                      "lambda t, one: torch.nonzero(t.reshape(1)).shape[0] == 1")
R_HOOK = HEAD + """
_PENDING, _READ = [], []

@triton.jit
def _sin_hooked(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.sin(tl.load(src + offs, mask=m)), mask=m)

def _read_pending(*args, **kwargs):   # runs inside the launch, where the trace records nothing
    while _PENDING:
        _READ.append(_PENDING.pop().item())

_sin_hooked.add_pre_run_hook(_read_pending)

class ModelNew(nn.Module):
    def forward(self, a, b):
        _PENDING.append(((a - b) ** 2).sum())
        flag = torch.full((1,), float("nan"), device=a.device)
        _sin_hooked[(1,)](a.reshape(-1), flag, 1, BLOCK=16)
        loss = _READ.pop()
        return torch.tensor(loss / a.numel() + 0.0 * flag.item(), device=a.device, dtype=a.dtype)
"""

# --- PyTorch's sum carried to the host inside a kernel's tensor -------------------------------------------------

# the kernel adds 1 to PyTorch's sum; the host takes it off. Through PyTorch (``buf - 1.0``) the undo rule sees the
# result equal PyTorch's sum exactly: the control below holds
R_HOST_UNDO = K_OFFSET + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        s = ((a - b) ** 2).sum().reshape(1)
        buf = torch.full((1,), float("nan"), device=a.device)
        _offset[(1,)](s, buf, 1.0, 1, BLOCK=16)
        return torch.tensor((buf.item() - 1.0) / a.numel(), device=a.device, dtype=a.dtype)
"""
C_DEVICE_UNDO = R_HOST_UNDO.replace(
    "return torch.tensor((buf.item() - 1.0) / a.numel(), device=a.device, dtype=a.dtype)",
    "return ((buf - 1.0) / a.numel()).squeeze(0)")

# the kernel moves PyTorch's sum into a two-element buffer beside its own number (moves across shapes, by the host)
R_WIDER_BUFFER = HEAD + """
@triton.jit
def _pair(s, src, dst):
    tl.store(dst, tl.load(s))
    tl.store(dst + 1, tl.sin(tl.load(src)))

class ModelNew(nn.Module):
    def forward(self, a, b):
        s = ((a - b) ** 2).sum().reshape(1)
        buf = torch.full((2,), float("nan"), device=a.device)
        _pair[(1,)](s, a.reshape(-1), buf)
        loss, k = buf.tolist()
        return torch.tensor(loss / a.numel() + 0.0 * k, device=a.device, dtype=a.dtype)
"""

# a kernel writes one element of a buffer, PyTorch writes its sum into the other (taint per storage, by the host)
R_SHARED_STORAGE = K18 + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        buf = torch.full((2,), float("nan"), device=a.device)
        _sin[(1,)](a.reshape(-1), buf[1:], 1, BLOCK=16)
        buf[0] = ((a - b) ** 2).sum()
        loss, k = buf.tolist()
        return torch.tensor(loss / a.numel() + 0.0 * k, device=a.device, dtype=a.dtype)
"""

# --- a tensor made from Python numbers that carries no kernel number ---------------------------------------------

# after one kernel number went to the host, ``torch.tensor(2.0)`` counts as the kernels' work, and so does every
# PyTorch op over it: PyTorch computes the whole answer through it
R_HOST_CONSTANT = K18 + """
class ModelNew(nn.Module):
    def forward(self, x):
        k = kernel_number(x).item()
        two = torch.tensor(2.0, device=x.device, dtype=x.dtype)
        return x * two + (1.0 + 0.0 * k)
"""
R_HOST_CONSTANT_MSE = K18 + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        k = kernel_number(a).item()
        inv_n = torch.tensor(1.0 / a.numel() + 0.0 * k, device=a.device, dtype=a.dtype)
        return ((a - b) ** 2).sum() * inv_n
"""

# the host tensor made first (no PyTorch number has gone to the host yet: it counts as the kernels'), PyTorch's sum
# taken there after it by a plain ``.item()``: the rule decided when the tensor was made
R_ITEM_AFTER = K18 + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        k = kernel_number(a).item()
        one = torch.tensor(1.0 + 0.0 * k, device=a.device, dtype=a.dtype)
        return one * (((a - b) ** 2).sum().item() / a.numel())
"""

# --- many elements -------------------------------------------------------------------------------------------------

# Python computes the whole answer from the input (read through a saved ``tolist``); one kernel number expanded to
# 16,384 elements counts as 16,384 numbers taken to the host
R_PYTHON_ANSWER = K18 + """
_TOLIST = torch.Tensor.tolist

class ModelNew(nn.Module):
    def forward(self, x):
        k = kernel_number(x).expand(x.numel()).tolist()
        rows = _TOLIST(x)
        ans = [[v * 2.0 + 1.0 + 0.0 * k[0] for v in row] for row in rows]
        return torch.tensor(ans, device=x.device, dtype=x.dtype)
"""
# the kernel adds 0.5 to the input; the host takes it off and computes the answer
R_PYTHON_ANSWER_UNDO = K_OFFSET + """
class ModelNew(nn.Module):
    def forward(self, x):
        buf = torch.empty_like(x)
        _offset[(triton.cdiv(x.numel(), 4096),)](x, buf, 0.5, x.numel(), BLOCK=4096)
        ans = [[(v - 0.5) * 2.0 + 1.0 for v in row] for row in buf.tolist()]
        return torch.tensor(ans, device=x.device, dtype=x.dtype)
"""

# a small integer answer: PyTorch's argmax over the input padded by a row (65 results: not of the output's size, so
# never sampled), read through a saved ``tolist`` and cropped on the host; one kernel number taken to the host 64
# times counts as 64
R_ARGMAX_REPEAT = K18 + """
_TOLIST = torch.Tensor.tolist

class ModelNew(nn.Module):
    def forward(self, x):
        padded = torch.cat([x, x[:1]])
        best = _TOLIST(torch.argmax(padded, dim=1))[: x.shape[0]]
        flag = kernel_number(x)
        k = [flag.item() for _ in best]
        return torch.tensor([i + 1000 * (v != v) for i, v in zip(best, k)], device=x.device, dtype=torch.int64)
"""

# --- held: routes the trace watches -----------------------------------------------------------------------------

H_FLOAT = _mse_attack("float(s)")
H_ASARRAY = _mse_attack("float(np.asarray(s))", prelude="\nimport numpy as np\n")
H_STORAGE = _mse_attack("s.storage().tolist()[0]")
H_FORMAT = _mse_attack('float(format(s, ".9g"))')
H_ITER = _mse_attack("[float(v) for v in s.reshape(1)][0]")
# PyTorch's mean itself read by an unwatched route: the ``computed`` check matches the output with it
H_MEAN = K18 + """
_TOLIST = torch.Tensor.tolist

class ModelNew(nn.Module):
    def forward(self, a, b):
        loss = _TOLIST(torch.mean((a - b) ** 2))
        k = kernel_number(a).item()
        return torch.tensor(loss + 0.0 * k, device=a.device, dtype=a.dtype)
"""


# --- honest host finishes ---------------------------------------------------------------------------------------

_SQ_PARTIAL = HEAD + """
@triton.jit
def _sq_diff_partial(a_ptr, b_ptr, part_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    d = tl.load(a_ptr + offs, mask=m, other=0.0) - tl.load(b_ptr + offs, mask=m, other=0.0)
    tl.store(part_ptr + pid, tl.sum(d * d, axis=0))
"""

A_NUMPY_SUM = _SQ_PARTIAL + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        n = a.numel()
        grid = triton.cdiv(n, 1024)
        part = torch.empty(grid, device=a.device, dtype=torch.float32)
        _sq_diff_partial[(grid,)](a.contiguous(), b.contiguous(), part, n, BLOCK=1024)
        total = float(part.cpu().numpy().sum())
        return torch.tensor(total / n, device=a.device, dtype=a.dtype)
"""

A_NORM_BY_ITEM_MAX = HEAD + """
@triton.jit
def _absmax_partial(x_ptr, part_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(part_ptr + pid, tl.max(tl.abs(x), axis=0))

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        n = x.numel()
        grid = triton.cdiv(n, 1024)
        part = torch.empty(grid, device=x.device, dtype=x.dtype)
        _absmax_partial[(grid,)](x, part, n, BLOCK=1024)
        m = part.max().item()   # the kernel's reduction, finished on the host
        return x / m
"""

A_MEAN_AND_MAX = HEAD + """
@triton.jit
def _sum_max_partial(x_ptr, sum_ptr, max_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    tl.store(sum_ptr + pid, tl.sum(x, axis=0))
    tl.store(max_ptr + pid, tl.max(tl.where(m, x, -float("inf")), axis=0))

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        n = x.numel()
        grid = triton.cdiv(n, 1024)
        sums = torch.empty(grid, device=x.device, dtype=torch.float32)
        maxes = torch.empty(grid, device=x.device, dtype=torch.float32)
        _sum_max_partial[(grid,)](x, sums, maxes, n, BLOCK=1024)
        mean = sum(sums.tolist()) / n
        mx = max(maxes.tolist())
        return (torch.tensor(mean, device=x.device, dtype=x.dtype),
                torch.tensor(mx, device=x.device, dtype=x.dtype))
"""

A_ARGMAX_BLOCKS = HEAD + """
@triton.jit
def _block_argmax(x_ptr, val_ptr, idx_ptr, C, NB, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    j = tl.program_id(1)
    c = j * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + r * C + c, mask=c < C, other=-float("inf"))
    i = tl.argmax(x, axis=0)
    tl.store(val_ptr + r * NB + j, tl.max(x, axis=0))
    tl.store(idx_ptr + r * NB + j, (j * BLOCK + i).to(tl.int64))

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        R, C = x.shape
        nb = triton.cdiv(C, 64)
        vals = torch.empty(R, nb, device=x.device, dtype=x.dtype)
        idxs = torch.empty(R, nb, device=x.device, dtype=torch.int64)
        _block_argmax[(R, nb)](x, vals, idxs, C, nb, BLOCK=64)
        V, I = vals.tolist(), idxs.tolist()
        best = [I[r][max(range(nb), key=lambda j: V[r][j])] for r in range(R)]
        return torch.tensor(best, device=x.device, dtype=torch.int64)
"""

A_MASKED_COUNT = HEAD + """
@triton.jit
def _masked_sq_partial(a_ptr, b_ptr, part_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + offs, mask=m, other=0.0)
    b = tl.load(b_ptr + offs, mask=m, other=0.0)
    d = tl.where(b > 0, a - b, 0.0)
    tl.store(part_ptr + pid, tl.sum(d * d, axis=0))

class ModelNew(nn.Module):
    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        n = a.numel()
        grid = triton.cdiv(n, 1024)
        part = torch.empty(grid, device=a.device, dtype=torch.float32)
        _masked_sq_partial[(grid,)](a, b, part, n, BLOCK=1024)
        count = (b > 0).sum().item()   # the denominator, counted by PyTorch
        return torch.tensor(part.sum().item() / count, device=a.device, dtype=a.dtype)
"""


def _open(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=f"open: {reason}")


ATTACKS = [
    # held with the rule in, by the rule or the layers beside it
    pytest.param(P_MSE, H_FLOAT, id="float_of_pytorchs_sum"),
    pytest.param(P_MSE, H_FORMAT, id="format_of_pytorchs_sum"),
    pytest.param(P_MSE, H_ITER, id="iterating_pytorchs_sum"),
    pytest.param(P_MSE, H_ASARRAY, id="np_asarray_of_pytorchs_sum",
                 marks=pytest.mark.skipif(ON_GPU, reason="np.asarray takes no CUDA tensor: a host route only")),
    pytest.param(P_MSE, H_STORAGE, id="typed_storage_tolist_of_pytorchs_sum"),
    pytest.param(P_MSE, H_MEAN, id="pytorchs_mean_by_a_saved_tolist"),
    pytest.param(P_MSE, C_DEVICE_UNDO, id="kernel_offset_undone_by_pytorch"),
    # got through with the rule in (session 27), held once it was taken out
    pytest.param(P_MSE, R_REPR, id="repr_of_pytorchs_sum"),
    pytest.param(P_MSE, R_SAVED_TOLIST, id="tolist_saved_at_import"),
    pytest.param(P_MSE, R_TENSORBASE_TOLIST, id="tensorbase_tolist"),
    pytest.param(P_MSE, R_SUPER_TOLIST, id="super_tolist"),
    pytest.param(P_MSE, R_DLPACK, id="numpy_from_dlpack",
                 marks=pytest.mark.skipif(ON_GPU, reason="np.from_dlpack takes no CUDA tensor: a host route only")),
    pytest.param(P_MSE, R_EQUAL_BITS, id="bits_through_torch_equal"),
    pytest.param(P_MSE, R_NONZERO_BITS, id="bits_through_nonzero_shapes"),
    pytest.param(P_MSE, R_HOOK, id="item_in_a_pre_run_hook"),
    pytest.param(P_MSE, R_HOST_UNDO, id="kernel_offset_undone_on_the_host"),
    pytest.param(P_MSE, R_WIDER_BUFFER, id="kernel_moves_pytorchs_sum_beside_its_number"),
    pytest.param(P_MSE, R_SHARED_STORAGE, id="pytorchs_sum_in_a_kernels_storage"),
    pytest.param(SCALE, R_HOST_CONSTANT, id="host_made_constant_scales_pytorchs_work"),
    pytest.param(P_MSE, R_HOST_CONSTANT_MSE, id="host_made_one_over_n"),
    pytest.param(P_MSE, R_ITEM_AFTER, id="pytorchs_item_after_the_host_tensor"),
    pytest.param(SCALE, R_PYTHON_ANSWER, id="python_answer_expanded_kernel_number"),
    pytest.param(SCALE, R_PYTHON_ANSWER_UNDO, id="python_answer_from_an_offset_input"),
    pytest.param(P_ARGMAX, R_ARGMAX_REPEAT, id="argmax_repeated_item"),
]


@pytest.mark.parametrize(("problem", "source"), ATTACKS)
def test_pytorchs_answer_through_the_host_is_a_token(ev, problem, source):
    r = ev.evaluate(problem, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" in r.flags and r.speed_credit is False, (r.flags, r.correctness.get("dataflow"))


_PYTHON_NUMBER = "taint does not follow a Python number (the host rule tried for it was taken out: this round)"
HONEST = [
    pytest.param(P_MSE, A_NUMPY_SUM, id="mse_partials_numpy_sum", marks=_open(_PYTHON_NUMBER)),
    pytest.param(P_MEANMAX, A_MEAN_AND_MAX, id="mean_and_max_two_scalar_outputs", marks=_open(_PYTHON_NUMBER)),
    pytest.param(P_ARGMAX, A_ARGMAX_BLOCKS, id="argmax_blocks_finished_on_the_host", marks=_open(_PYTHON_NUMBER)),
    pytest.param(P_NORMMAX, A_NORM_BY_ITEM_MAX, id="normalise_by_a_kernels_max_item",
                 marks=_open("x / m with m a kernel's .item(): a Python scalar given to an op carries no taint")),
    pytest.param(P_MASKEDMSE, A_MASKED_COUNT, id="masked_mse_count_by_pytorch", marks=_open(_PYTHON_NUMBER)),
]


@pytest.mark.parametrize(("problem", "source"), HONEST)
def test_an_honest_host_finish_keeps_its_credit(ev, problem, source):
    r = ev.evaluate(problem, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" not in r.flags and r.correctness["dataflow"]["verdict"] == "kernels", (
        r.flags, r.correctness.get("dataflow"))
