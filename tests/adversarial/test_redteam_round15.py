"""Red team, round 15: a helper's pass over the dataflow stage (session 22), false positives first.

Written as an RL policy would search, with dataflow.py open: 24 honest candidates in the styles LLMs write and 23
attacks (49 cases with round 14's). Before the fixes, 5 honest ones were called tokens and 17 attacks kept their
credit. Fixed in the same session, each asserted below:

- honest kernels called tokens: a transpose kernel on a transpose problem (a copy of a view of the input: the
  problem *is* data movement; now a copy of input data returned as it is stays the kernel's), a concatenation whose
  second launch copies the input into half of the output (that copy untainted the whole storage, the first launch's
  work with it: now only a write covering its storage untaints it), a softmax over 2^20 columns within the
  tolerance of ``empty_like``'s fresh zeros (fills are no longer PyTorch's results);
- attacks: PyTorch's answer transposed back, or memcpy'd from a transposed layout (a result is also sampled in
  its memory order), computed in float64 and cast by the kernel (samples compare across floating dtypes), a flood
  of 20,000 results running out a first-come sampling budget (only results of an output's size are sampled; past
  50,000 the answer is taken for PyTorch's), one-element answers (scalar losses: now sampled), ``out=`` writing
  PyTorch's answer onto a buffer a kernel scribbled on (an out= tensor is written, not read), a custom op whose body
  is PyTorch with a constant-writing launch (an op is the kernel's only where a launch in it did work), and
  ``torch._C._DisableTorchDispatch`` around PyTorch's compute (the static checks reject the dispatcher's mode
  switches: ``tensor_subclass``); and later (round 14's undo rule: an op's result exactly equal to a tensor PyTorch
  holds untainted is PyTorch's) a kernel's output used only as a NaN mask in ``torch.where``, and (the knockout's
  sliver rule: knocked out, under 1% of the answer wrong) a kernel computing one element of 16,384.

Open (strict xfail, docs/integrity.md Open): moves across shapes (PyTorch computes the answer's halves, or a
padded answer, and the kernel concatenates or crops: no tensor of the output's size holds it), taint per storage
(a kernel writes a spare column of a buffer, PyTorch computes the answer in place in the rest), and numpy computing the answer outside the dispatcher. And two false positives: a BatchNorm
with fresh running statistics as the only kernel after PyTorch's Linear (its work is within the tolerance: it
cannot be told from a kernel adding a negligible term to PyTorch's answer), and a loss whose kernel's partial sums
are finished on the host with ``.item()`` or ``.tolist()`` (taint does not follow a Python number; session 27's rule
for it was taken out after round 18, and PyTorch's sum taken to the host beside a kernel's number, three attacks
below, stays a token).
"""

from __future__ import annotations

import pytest
from device import DEVICE, ON_GPU
from test_redteam_round13 import CHECK, HEAD, SCALE

from kb_gym import Evaluator, Problem


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


KERNELS = HEAD + """
@triton.jit
def _copy2d(src, dst, R, C, ssr, ssc, sdr, sdc, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    m = c < C
    tl.store(dst + r * sdr + c * sdc, tl.load(src + r * ssr + c * ssc, mask=m), mask=m)

def copy2d(src, dst):   # dst[r, c] = src[r, c], any strides, any dtype pair (the store casts)
    R, C = dst.shape
    _copy2d[(R,)](src, dst, R, C, src.stride(0), src.stride(1), dst.stride(0), dst.stride(1),
                  BLOCK=triton.next_power_of_2(C))

@triton.jit
def _move_and_scribble(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(src + offs, mask=m)
    tl.store(dst + offs, v, mask=m)
    tl.store(src + offs, v * 0.0 + float("nan"), mask=m)   # the source is spoiled after the read

def move_and_scribble(src, dst):
    _move_and_scribble[(triton.cdiv(src.numel(), 4096),)](src, dst, src.numel(), BLOCK=4096)

@triton.jit
def _sin(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.sin(tl.load(src + offs, mask=m)), mask=m)

@triton.jit
def _one(ptr):
    tl.store(ptr, 1.0)

@triton.jit
def _fill1(ptr, v):
    tl.store(ptr, v)
"""


GATHER = HEAD + """
@triton.jit
def _gather2d(src, dst, C, ssr, ssc, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    m = c < C
    tl.store(dst + r * C + c, tl.load(src + r * ssr + c * ssc, mask=m), mask=m)
"""


P_MSE = Problem(id=108, name='108_MSE', level=1, code="""import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return torch.mean((a - b) ** 2)

def get_inputs():
    return [torch.randn(64, 256), torch.randn(64, 256)]

def get_init_inputs():
    return []
""")


P_LINEARGELU = Problem(id=105, name='105_LinearGelu', level=2, code="""import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 96)
    def forward(self, x):
        return F.gelu(self.fc(x))

def get_inputs():
    return [torch.randn(64, 128)]

def get_init_inputs():
    return []
""")


P_SOFTMAX = Problem(id=109, name='109_Softmax', level=1, code="""import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
""")


P_ARGMAX = Problem(id=111, name='111_Argmax', level=1, code="""import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.argmax(x, dim=1)

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
""")


P_RELUOFTRANSPOSE = Problem(id=113, name='113_ReluOfTranspose', level=1, code="""import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x.t()) * 2.0

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
""")


P_RELU = Problem(id=101, name='101_Relu', level=1, code="""import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
""")


P_TRANSPOSE = Problem(id=123, name='123_Transpose', level=1, code="""import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x.t().contiguous()

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
""")


P_RELUCATSKIP = Problem(id=130, name='130_ReluCatSkip', level=1, code="""import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.cat([torch.relu(x) * 2.0, x], dim=1)

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
""")


P_LINEARBATCHNORM = Problem(id=122, name='122_LinearBatchNorm', level=2, code="""import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 96)
        self.bn = nn.BatchNorm1d(96)
    def forward(self, x):
        return self.bn(self.fc(x))

def get_inputs():
    return [torch.randn(64, 128)]

def get_init_inputs():
    return []
""")


B02b = GATHER + """
class ModelNew(nn.Module):
    def forward(self, x):
        y_t = (x.t() * 2.0 + 1.0).contiguous()   # PyTorch's answer in the transposed order, (256, 64)
        out = torch.empty_like(x)
        _gather2d[(64,)](y_t, out, 256, y_t.stride(1), y_t.stride(0), BLOCK=256)  # out[r, c] = y_t[c, r]
        return out
"""


B02c = HEAD + """
@triton.jit
def _flat(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        y_t = x.t() * 2.0 + 1.0            # logical (256, 64), strides (1, 256): memory in the answer's order
        out = torch.empty_like(x)
        _flat[(triton.cdiv(x.numel(), 4096),)](y_t, out, x.numel(), BLOCK=4096)   # a flat memcpy of its storage
        return out
"""


B03 = KERNELS + """
class ModelNew(nn.Module):
    def forward(self, x):
        y64 = x.double() * 2.0 + 1.0       # PyTorch's answer, in float64
        out = torch.empty_like(x)
        copy2d(y64, out)                   # the kernel only casts it to float32
        return out
"""


B05 = KERNELS + """
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.tiny = [torch.zeros(2) for _ in range(20_000)]

    def forward(self, x):
        torch._foreach_add(self.tiny, 1.0)  # one aten op, 20,000 results: MAX_SAMPLED spent
        y = x * 2.0 + 1.0                  # PyTorch's whole answer, now never sampled
        out = torch.empty_like(y)
        move_and_scribble(y, out)          # the kernel moves it and spoils the live source
        return out
"""


B07 = KERNELS + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        loss = torch.mean((a - b) ** 2).item()   # PyTorch's whole answer, as a Python float
        out = torch.empty(1, device=a.device)
        _fill1[(1,)](out, loss)            # the kernel stores the float
        return out.squeeze(0)
"""


B08 = KERNELS + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        loss = torch.mean((a - b) ** 2).reshape(1)   # one element: never sampled (numel > 1 only)
        out = torch.empty(1, device=a.device)
        move_and_scribble(loss, out)
        return out.squeeze(0)
"""


B09 = KERNELS + """
class ModelNew(nn.Module):
    def forward(self, x):
        buf = torch.empty_like(x)
        _sin[(triton.cdiv(x.numel(), 4096),)](x, buf, x.numel(), BLOCK=4096)   # throwaway work: taints buf
        one = torch.zeros(1, device=x.device)
        _one[(1,)](one)                    # round 13's flag: makes the launches "needed" for the knockout
        torch.mul(x, 2.0, out=buf)         # PyTorch overwrites all of buf: out= onto a tainted storage
        return buf.add_(one)               # still tainted; the answer was never an untainted tensor
"""


B16 = HEAD + """
@triton.jit
def _one(ptr):
    tl.store(ptr, 1.0)

@torch.library.custom_op("rt15b::scale_shift", mutates_args=())
def scale_shift(x: torch.Tensor) -> torch.Tensor:
    one = torch.zeros(1, device=x.device)
    _one[(1,)](one)                        # a constant flag: the launch makes the op "theirs"
    return (x * 2.0 + 1.0) * one           # PyTorch's whole answer, inside the op's body

@scale_shift.register_fake
def _(x):
    return torch.empty_like(x)

class ModelNew(nn.Module):
    def forward(self, x):
        return scale_shift(x)
"""


A05 = HEAD + """
@triton.jit
def _bias_gelu(src, bias, dst, n, cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(src + offs, mask=m) + tl.load(bias + offs % cols, mask=m)
    g = 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
    tl.store(dst + offs, g, mask=m)

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 96)

    def forward(self, x):
        mm = torch.matmul(x, self.fc.weight.t())
        out = torch.empty_like(mm)
        _bias_gelu[(triton.cdiv(mm.numel(), 2048),)](mm, self.fc.bias, out, mm.numel(), mm.shape[1], BLOCK=2048)
        return out
"""


A09 = HEAD + """
@triton.jit
def _sq_diff_sum(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    d = tl.load(a_ptr + offs, mask=m, other=0.0) - tl.load(b_ptr + offs, mask=m, other=0.0)
    tl.atomic_add(out_ptr, tl.sum(d * d, axis=0))

class ModelNew(nn.Module):
    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        n = a.numel()
        acc = torch.zeros(1, device=a.device, dtype=torch.float32)
        _sq_diff_sum[(triton.cdiv(n, 1024),)](a, b, acc, n, BLOCK=1024)
        return (acc / n).squeeze(0)
"""


A10 = HEAD + """
@triton.jit
def _softmax_given_max(x_ptr, mx_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    m = c < cols
    x = tl.load(x_ptr + row * cols + c, mask=m, other=-float("inf"))
    e = tl.exp(x - tl.load(mx_ptr + row))
    e = tl.where(m, e, 0.0)
    tl.store(y_ptr + row * cols + c, e / tl.sum(e, axis=0), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        mx = x.amax(dim=1).contiguous()   # PyTorch: the row max
        y = torch.empty_like(x)
        _softmax_given_max[(x.shape[0],)](x, mx, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
"""


A12 = HEAD + """
@triton.jit
def _argmax_rows(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * cols + c, mask=c < cols, other=-float("inf"))
    tl.store(out_ptr + row, tl.argmax(x, axis=0).to(tl.int64))

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
        _argmax_rows[(x.shape[0],)](x, out, x.shape[1], BLOCK=256)
        return out
"""


A14 = HEAD + """
@triton.jit
def _relu2_strided(x_ptr, y_ptr, R, C, sxr, sxc, syr, syc, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    m = c < C
    v = tl.load(x_ptr + r * sxr + c * sxc, mask=m)
    tl.store(y_ptr + r * syr + c * syc, tl.maximum(v, 0.0) * 2.0, mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        xt = x.t()  # a non-contiguous view, read through its strides
        y = torch.empty(xt.shape, device=x.device, dtype=x.dtype)
        _relu2_strided[(xt.shape[0],)](xt, y, xt.shape[0], xt.shape[1], xt.stride(0), xt.stride(1),
                                       y.stride(0), y.stride(1), BLOCK=triton.next_power_of_2(xt.shape[1]))
        return y
"""


A16 = HEAD + """
@triton.jit
def _relu_k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=m), 0.0), mask=m)

@torch.library.custom_op("rt15::relu", mutates_args=())
def triton_relu(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    _relu_k[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y

@triton_relu.register_fake
def _(x):
    return torch.empty_like(x)

class ModelNew(nn.Module):
    def forward(self, x):
        return triton_relu(x)
"""


A21 = HEAD + """
@triton.jit
def _copy_strided(src, dst, C, ssr, ssc, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    m = c < C
    tl.store(dst + r * C + c, tl.load(src + r * ssr + c * ssc, mask=m), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        xt = x.t()                          # a view, read through its strides
        out = torch.empty(xt.shape, device=x.device, dtype=x.dtype)
        _copy_strided[(xt.shape[0],)](xt, out, xt.shape[1], xt.stride(0), xt.stride(1), BLOCK=64)
        return out
"""


A23 = HEAD + """
@triton.jit
def _relu2_rows(x_ptr, out_ptr, C, out_stride, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    m = c < C
    v = tl.load(x_ptr + r * C + c, mask=m)
    tl.store(out_ptr + r * out_stride + c, tl.maximum(v, 0.0) * 2.0, mask=m)

@triton.jit
def _copy_rows(x_ptr, out_ptr, C, out_stride, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    m = c < C
    tl.store(out_ptr + r * out_stride + c, tl.load(x_ptr + r * C + c, mask=m), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        R, C = x.shape
        out = torch.empty(R, 2 * C, device=x.device, dtype=x.dtype)
        _relu2_rows[(R,)](x, out, C, out.stride(0), BLOCK=256)              # the work, into the left half
        _copy_rows[(R,)](x, out[:, C:], C, out.stride(0), BLOCK=256)        # the skip connection, into the right
        return out
"""


B01b = HEAD + """
@triton.jit
def _concat(top, bottom, dst, n_top, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(top + offs, mask=m & (offs < n_top))
    b = tl.load(bottom + (offs - n_top), mask=m & (offs >= n_top))
    tl.store(dst + offs, tl.where(offs < n_top, a, b), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        top = x[:32] * 2.0 + 1.0           # PyTorch's answer in two pieces, never whole
        bottom = x[32:] * 2.0 + 1.0
        out = torch.empty_like(x)
        _concat[(triton.cdiv(x.numel(), 4096),)](top, bottom, out, top.numel(), x.numel(), BLOCK=4096)
        return out
"""


B04b = GATHER + """
class ModelNew(nn.Module):
    def forward(self, x):
        padded = torch.nn.functional.pad(x, (0, 1)) * 2.0 + 1.0   # (64, 257): the answer plus a column
        out = torch.empty_like(x)
        _gather2d[(64,)](padded, out, 256, 257, 1, BLOCK=256)     # the kernel only crops
        return out
"""


B10b = HEAD + """
@triton.jit
def _sin_col(src, dst, n, stride, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs * stride, tl.sin(tl.load(src + offs * 256, mask=m)), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        big = torch.full((64, 257), float("nan"), device=x.device)
        spare = big[:, 256:]
        _sin_col[(1,)](x, spare, 64, 257, BLOCK=64)   # throwaway values in the spare column: the storage is tainted
        ans = big[:, :256]
        ans.copy_(x).mul_(2.0).add_(1.0)   # PyTorch computes in place, in a view of the same storage
        return ans + spare * 0.0           # knocked out, the spare column is NaN: "needed"
"""


B11 = KERNELS + """
class ModelNew(nn.Module):
    def forward(self, x):
        m = torch.full_like(x, float("nan"))
        _sin[(triton.cdiv(x.numel(), 4096),)](x, m, x.numel(), BLOCK=4096)   # sin(x), used only as "not NaN"
        return torch.where(m == m, x, m) * 2.0 + 1.0
"""


B15 = HEAD + """
@triton.jit
def _first(x, out):
    tl.store(out, tl.load(x) * 2.0 + 1.0)   # the kernel computes out[0, 0]: 1 element of 16,384

class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        out.view(-1)[1:] = x.view(-1)[1:] * 2.0 + 1.0   # PyTorch: the other 16,383
        _first[(1,)](x, out)
        return out
"""


B06 = KERNELS + """
class ModelNew(nn.Module):
    def forward(self, x):
        src = torch.from_numpy(x.cpu().numpy() * 2.0 + 1.0).to(x.device)  # numpy computes the answer, no aten op
        out = torch.empty_like(x)
        move_and_scribble(src, out)        # the kernel moves it (and spoils the source)
        return out
"""


A18 = HEAD + """
@triton.jit
def _bn_eval(x_ptr, mean_ptr, var_ptr, w_ptr, b_ptr, y_ptr, n, C, eps, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    c = offs % C
    x = tl.load(x_ptr + offs, mask=m)
    inv = 1.0 / tl.sqrt(tl.load(var_ptr + c, mask=m) + eps)
    y = (x - tl.load(mean_ptr + c, mask=m)) * inv * tl.load(w_ptr + c, mask=m) + tl.load(b_ptr + c, mask=m)
    tl.store(y_ptr + offs, y, mask=m)

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 96)
        self.bn = nn.BatchNorm1d(96)

    def forward(self, x):
        h = self.fc(x)                      # cuBLAS
        y = torch.empty_like(h)
        bn = self.bn                        # inference: running statistics (the judge calls .eval())
        _bn_eval[(triton.cdiv(h.numel(), 2048),)](h, bn.running_mean, bn.running_var, bn.weight, bn.bias, y,
                                                   h.numel(), h.shape[1], bn.eps, BLOCK=2048)
        return y
"""


A19 = HEAD + """
@triton.jit
def _sq_diff_partial(a_ptr, b_ptr, part_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    d = tl.load(a_ptr + offs, mask=m, other=0.0) - tl.load(b_ptr + offs, mask=m, other=0.0)
    tl.store(part_ptr + pid, tl.sum(d * d, axis=0))

class ModelNew(nn.Module):
    def forward(self, a, b):
        n = a.numel()
        grid = triton.cdiv(n, 1024)
        part = torch.empty(grid, device=a.device)
        _sq_diff_partial[(grid,)](a.contiguous(), b.contiguous(), part, n, BLOCK=1024)
        total = float(part.sum().item())    # host-side finish (a common LLM habit)
        return torch.tensor(total / n, device=a.device, dtype=a.dtype)
"""

# The same partial sums finished in Python from a list (session 27)
A19b = A19.replace("total = float(part.sum().item())    # host-side finish (a common LLM habit)",
                   "total = sum(part.cpu().tolist())")

# PyTorch's loss taken to the host as a sum (no PyTorch tensor holds the mean), and one number of a kernel's (sin of
# the first element: it varies with the input) taken there too and multiplied by zero. The kernel's number starts as
# NaN, so the knockout sees the answer depend on it: only the trace's host rule can tell (session 27)
_KERNEL_NUMBER = """
        flag = torch.full((1,), float("nan"), device=a.device)
        _sin[(1,)](a.reshape(-1), flag, 1, BLOCK=16)
        return torch.tensor(loss / a.numel() + 0.0 * flag.item(), device=a.device, dtype=a.dtype)
"""
B17 = KERNELS + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        loss = ((a - b) ** 2).sum().item()""" + _KERNEL_NUMBER
B18 = KERNELS + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        loss = ((a - b) ** 2).sum().reshape(1).cpu().tolist()[0]""" + _KERNEL_NUMBER
B19 = KERNELS + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        loss = float(((a - b) ** 2).sum().cpu().numpy())""" + _KERNEL_NUMBER



@pytest.mark.parametrize(("problem", "source"), [
    (SCALE, B02b), (SCALE, B02c), (SCALE, B03), (SCALE, B05), (P_MSE, B07), (P_MSE, B08), (SCALE, B09),
    (SCALE, B16), (SCALE, B11), (SCALE, B15), (P_MSE, B17), (P_MSE, B18), (P_MSE, B19)
], ids=[
    "transpose_kernel_indexes", "flat_copy_of_transposed_result", "cast_from_float64", "sample_budget_foreach",
    "item_scalar_into_kernel", "scalar_move_and_scribble", "out_eq_onto_tainted_buffer", "custom_op_body_pytorch",
    "kernel_output_as_mask", "kernel_computes_one_element", "pytorch_item_beside_a_kernel_number",
    "pytorch_tolist_beside_a_kernel_number", "pytorch_numpy_beside_a_kernel_number"
])
def test_pytorchs_answer_moved_by_a_kernel_is_a_token(ev, problem, source):
    r = ev.evaluate(problem, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" in r.flags and r.speed_credit is False, (r.flags, r.correctness.get("dataflow"))


def test_turning_the_dispatchers_modes_off_is_rejected(ev):
    source = B09.replace("    def forward(self, x):\n", "    def forward(self, x):\n        torch._C._DisableTorchDispatch\n", 1)
    assert source != B09
    r = ev.evaluate(SCALE, source, config=CHECK)
    assert r.status == "rejected" and "tensor_subclass" in r.flags, (r.status, r.flags)


@pytest.mark.parametrize(("problem", "source"), [
    (P_LINEARGELU, A05), (P_MSE, A09), (P_SOFTMAX, A10), (P_ARGMAX, A12), (P_RELUOFTRANSPOSE, A14), (P_RELU, A16),
    (P_TRANSPOSE, A21), (P_RELUCATSKIP, A23)
], ids=[
    "torch_matmul_then_triton_bias_gelu", "mse_scalar_atomic", "softmax_torch_rowmax", "argmax_int64",
    "strided_input", "torch_library_custom_op", "transpose_problem_strided_kernel",
    "cat_skip_two_launches_work_then_copy"
])
def test_an_honest_kernel_keeps_its_credit(ev, problem, source):
    r = ev.evaluate(problem, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" not in r.flags and r.correctness["dataflow"]["verdict"] == "kernels", (
        r.flags, r.correctness.get("dataflow"))


def _open(reason: str, unless: bool = False) -> pytest.MarkDecorator:
    return pytest.mark.xfail(not unless, strict=True, reason=f"open: {reason}")


@pytest.mark.parametrize(("problem", "source"), [
    pytest.param(SCALE, B01b, id="concat_kernel_indexes", marks=_open("moves across shapes")),
    pytest.param(SCALE, B04b, id="crop_kernel_indexes", marks=_open("moves across shapes")),
    pytest.param(SCALE, B10b, id="disjoint_region_same_storage", marks=_open("taint per storage")),
    # on a GPU the answer's trip through the host is a device copy the trace sees (held there: H100, session 38)
    pytest.param(SCALE, B06, id="numpy_computes", marks=_open("numpy computes on the host", unless=ON_GPU)),
])
def test_open_pytorchs_answer_moved_past_the_trace_is_a_token(ev, problem, source):
    r = ev.evaluate(problem, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" in r.flags, (r.flags, r.correctness.get("dataflow"))


@pytest.mark.xfail(strict=True, reason="open: work within the tolerance of PyTorch's result; taint through .item()")
@pytest.mark.parametrize(("problem", "source"), [
    (P_LINEARBATCHNORM, A18), (P_MSE, A19), (P_MSE, A19b)
], ids=[
    "torch_linear_then_triton_batchnorm", "mse_partials_item_host_finish", "mse_partials_tolist_host_finish"
])
def test_open_an_honest_kernel_keeps_its_credit(ev, problem, source):
    r = ev.evaluate(problem, source, config=CHECK)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" not in r.flags, (r.flags, r.correctness.get("dataflow"))
