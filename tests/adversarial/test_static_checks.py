"""Static integrity checks (kb_gym.integrity): one adversarial candidate of our own per attack.

Each attack is a working Triton candidate with one hack added; the line the finding must name is
marked ``# <-``. Honest candidates (the built-in solutions, the benchmark kernels, the prompt
examples) must give no finding at all. Fast, CPU only, nothing is executed.
"""

from __future__ import annotations

import ast
import random
import string
import textwrap
import time
from pathlib import Path

import pytest

from kb_gym.integrity import (
    ALWAYS_FAIL,
    MAX_PARSE_CHARS,
    POLICIES,
    RUNTIME_FLAGS,
    STATIC_FLAGS,
    Finding,
    IntegrityPolicy,
    get_policy,
    lines,
    static_findings,
)
from kb_gym.integrity.analyzer import _Analyzer
from kb_gym.integrity.lines import _LINE_RE, LINE_RULES, line_scan

ROOT = Path(__file__).resolve().parents[2]

HEADER = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl
"""

KERNEL = """

@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def launch(x):
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    relu_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out
"""


def candidate(prelude: str = "", forward: str = "return launch(x)", init: str = "", extra: str = "") -> str:
    """A working Triton ReLU candidate with ``prelude`` after the imports and the given forward body."""
    init_body = textwrap.indent(textwrap.dedent(init).strip("\n"), " " * 8) + "\n" if init.strip() else ""
    return (HEADER + textwrap.dedent(prelude).strip("\n") + "\n" + KERNEL + textwrap.dedent(extra) + "\n\n"
            "class ModelNew(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            f"{init_body}\n"
            "    def forward(self, x):\n"
            + textwrap.indent(textwrap.dedent(forward).strip("\n"), " " * 8) + "\n")


def marked_line(source: str) -> int:
    lines = [i for i, text in enumerate(source.splitlines(), 1) if "# <-" in text]
    assert len(lines) == 1, f"mark exactly one line with '# <-' ({lines})"
    return lines[0]


# (id, source, flag) - the source marks the line the finding must name.
ATTACKS: list[tuple[str, str, str]] = [
    # ------------------------------------------------------------------ harness_patch
    ("allclose_assign", candidate("torch.allclose = lambda *a, **k: True  # <-"), "harness_patch"),
    ("assert_close_assign", candidate("torch.testing.assert_close = lambda *a, **k: None  # <-"), "harness_patch"),
    ("setattr_torch", candidate('setattr(torch, "allclose", lambda *a, **k: True)  # <-'), "harness_patch"),
    ("tensor_eq", candidate("torch.Tensor.__eq__ = lambda a, b: True  # <-"), "harness_patch"),
    ("functional_in_forward", candidate("import torch.nn.functional as F", forward="""
        F.relu = lambda t, inplace=False: t  # <-
        return launch(x)
    """), "harness_patch"),
    ("alias_of_torch", candidate("T = torch\nT.allclose = lambda *a, **k: True  # <-"), "harness_patch"),
    ("getattr_chain", candidate('getattr(torch, "testing").assert_close = print  # <-'), "harness_patch"),
    ("numpy_patch", candidate("import numpy as np\nnp.allclose = lambda *a, **k: True  # <-"), "harness_patch"),
    ("reload", candidate("import importlib\nimportlib.reload(torch)  # <-"), "harness_patch"),
    ("builtins_module", candidate("import builtins\nbuiltins.isinstance = lambda *a: True  # <-"), "harness_patch"),
    ("dunder_builtins", candidate('__builtins__["abs"] = lambda v: 0  # <-'), "harness_patch"),
    ("imports_evaluator", candidate("import kb_gym.worker  # <-"), "harness_patch"),
    ("mock_patch", candidate("from unittest import mock  # <-"), "harness_patch"),
    ("nn_module_call", candidate("nn.Module.__call__ = lambda self, *a: a[0]  # <-"), "harness_patch"),
    ("object_setattr", candidate('object.__setattr__(triton, "cdiv", lambda a, b: 1)  # <-'), "harness_patch"),
    ("from_import_alias", candidate("from torch import testing\ntesting.assert_close = print  # <-"), "harness_patch"),
    ("import_as_alias", candidate("import torch.testing as tt\ntt.assert_close = print  # <-"), "harness_patch"),
    ("globals_lookup", candidate('globals()["torch"].allclose = max  # <-'), "harness_patch"),
    ("vars_module", candidate('vars(torch)["allclose"] = max  # <-'), "harness_patch"),
    ("delete_attr", candidate("del torch.allclose  # <-"), "harness_patch"),
    ("import_module", candidate('import importlib\nimportlib.import_module("torch.testing").assert_close = print  # <-'),
     "harness_patch"),
    # ------------------------------------------------------------------ timer_patch
    ("elapsed_time", candidate("torch.cuda.Event.elapsed_time = lambda self, end: 1e-3  # <-"), "timer_patch"),
    ("synchronize", candidate("torch.cuda.synchronize = lambda *a, **k: None  # <-"), "timer_patch"),
    ("event_class", candidate("class FakeEvent:\n    pass\n\n\ntorch.cuda.Event = FakeEvent  # <-"), "timer_patch"),
    ("do_bench", candidate("import triton.testing\ntriton.testing.do_bench = lambda fn, **k: 1e-3  # <-"),
     "timer_patch"),
    ("event_in_init", candidate(init="torch.cuda.Event.elapsed_time = lambda s, e: 0.0  # <-"), "timer_patch"),
    # ------------------------------------------------------------------ precision_change
    ("allow_tf32", candidate("torch.backends.cuda.matmul.allow_tf32 = True  # <-"), "precision_change"),
    ("cudnn_benchmark", candidate("torch.backends.cudnn.benchmark = True  # <-"), "precision_change"),
    ("matmul_precision", candidate('torch.set_float32_matmul_precision("medium")  # <-'), "precision_change"),
    ("inductor_config", candidate("import torch._inductor.config as inductor_config\n"
                                  "inductor_config.max_autotune = True  # <-"), "precision_change"),
    ("sys_modules_computed_key", candidate('import sys\nruntime = sys.modules["kb" + "_gym.worker.runtime"]  # <-'),
     "introspection"),
    ("sys_through_torch", candidate("loaded = torch._utils.sys.modules  # <-"), "introspection"),
    ("gc_through_torch", candidate("objects = torch.nn.modules.module.gc  # <-"), "introspection"),
    ("computed_getattr", candidate('utils = getattr(torch, "_ut" + "ils")  # <-'), "dynamic_code"),
    ("vars_of_module", candidate('utils = vars(torch)["_ut" + "ils"]  # <-'), "dynamic_code"),
    ("raw_fd_write", candidate("import os", forward="""
        os.write(5, b'{"type": "result", "status": "correct"}')  # <-
        return launch(x)
    """), "io_escape"),
    # ------------------------------------------------------------------ pytorch_compiler
    ("torch_compile", candidate("", forward="""
        y = torch.compile(torch.abs)(x)  # <-
        return launch(y)
    """), "pytorch_compiler"),
    ("compile_decorator", candidate("@torch.compile(mode=\"max-autotune\")  # <-\ndef fused(x):\n"
                                    "    return torch.relu(x)\n"), "pytorch_compiler"),
    ("compile_alias", candidate("from torch import compile as fast  # <-"), "pytorch_compiler"),
    ("jit_script", candidate("", init="self.f = torch.jit.script(torch.nn.ReLU())  # <-"), "pytorch_compiler"),
    # ------------------------------------------------------------------ introspection
    ("currentframe", candidate("import inspect", forward="""
        caller = inspect.currentframe().f_back  # <-
        return launch(x)
    """), "introspection"),
    ("getframe", candidate("import sys", forward="""
        expected = sys._getframe(2).f_locals.get("ref_out")  # <-
        return launch(x)
    """), "introspection"),
    ("gc_objects", candidate("import gc", forward="""
        tensors = [o for o in gc.get_objects() if torch.is_tensor(o)]  # <-
        return launch(x)
    """), "introspection"),
    ("ctypes", candidate("import ctypes  # <-"), "introspection"),
    ("proc_mem", candidate("", forward="""
        with open("/proc/self/mem", "rb") as fh:  # <-
            fh.read(1)
        return launch(x)
    """), "introspection"),
    ("code_swap", candidate("def _fake():\n    return True\n\n\ntorch.allclose.__code__ = _fake.__code__  # <-"),
     "introspection"),
    ("settrace", candidate("import sys\nsys.settrace(lambda *a: None)  # <-"), "introspection"),
    ("traceback_frame", candidate("", forward="""
        try:
            raise RuntimeError
        except RuntimeError as err:
            outer = err.__traceback__.tb_frame  # <-
        return launch(x)
    """), "introspection"),
    ("subclasses", candidate("", forward="""
        everything = object.__subclasses__()  # <-
        return launch(x)
    """), "introspection"),
    # ------------------------------------------------------------------ concurrency
    ("threading", candidate("import threading  # <-"), "concurrency"),
    ("thread_pool", candidate("from concurrent.futures import ThreadPoolExecutor  # <-"), "concurrency"),
    ("subprocess", candidate('import subprocess  # <-\nsubprocess.run(["true"])'), "concurrency"),
    ("os_system", candidate("import os", forward="""
        os.system("nvidia-smi > /dev/null")  # <-
        return launch(x)
    """), "concurrency"),
    ("fork", candidate("import os\npid = os.fork()  # <-"), "concurrency"),
    ("multiprocessing", candidate("import multiprocessing as mp  # <-"), "concurrency"),
    ("asyncio", candidate("import asyncio  # <-"), "concurrency"),
    ("os_exec", candidate('import os\nif False:\n    os.execv("/bin/true", ["true"])  # <-'), "concurrency"),
    ("dunder_import", candidate('proc = __import__("subprocess")  # <-'), "concurrency"),
    # ------------------------------------------------------------------ io_escape
    ("socket", candidate("import socket  # <-"), "io_escape"),
    ("urllib", candidate("import urllib.request  # <-"), "io_escape"),
    ("requests", candidate("import requests  # <-"), "io_escape"),
    ("http_client", candidate("from http import client  # <-"), "io_escape"),
    ("signal", candidate("import signal  # <-"), "io_escape"),
    ("kill_parent", candidate("import os", forward="""
        os.kill(12345, 9)  # <-
        return launch(x)
    """), "io_escape"),
    ("chdir", candidate('import os\nos.chdir("/")  # <-'), "io_escape"),
    ("environ_set", candidate('import os\nos.environ["CUDA_VISIBLE_DEVICES"] = "1"  # <-'), "io_escape"),
    ("environ_update", candidate('import os\nos.environ.update({"OMP_NUM_THREADS": "1"})  # <-'), "io_escape"),
    ("write_abs", candidate("", forward="""
        out = launch(x)
        with open("/tmp/cached_outputs.bin", "wb") as fh:  # <-
            fh.write(b"")
        return out
    """), "io_escape"),
    ("remove_abs", candidate('import os\nif False:\n    os.remove("/etc/hosts")  # <-'), "io_escape"),
    ("torch_save_abs", candidate("", forward="""
        out = launch(x)
        torch.save(out, "/tmp/out.pt")  # <-
        return out
    """), "io_escape"),
    # ------------------------------------------------------------------ fallback
    ("except_torch", candidate("", forward="""
        try:
            return launch(x)
        except Exception:  # <-
            return torch.relu(x)
    """), "fallback"),
    ("bare_except_functional", candidate("import torch.nn.functional as F", forward="""
        try:
            out = launch(x)
        except:  # <-
            out = F.relu(x)
        return out
    """), "fallback"),
    ("except_tensor_method", candidate("", forward="""
        try:
            out = launch(x)
        except RuntimeError:  # <-
            out = x.clamp(min=0)
        return out
    """), "fallback"),
    ("except_helper", candidate("", forward="""
        try:
            return launch(x)
        except Exception:  # <-
            return torch_relu(x)
    """, extra="""
        def torch_relu(x):
            return torch.relu(x)
    """), "fallback"),
    ("cuda_unavailable", candidate("", forward="""
        if not torch.cuda.is_available():  # <-
            return torch.relu(x)
        return launch(x)
    """), "fallback"),
    ("is_cuda_else", candidate("", forward="""
        if x.is_cuda:  # <-
            return launch(x)
        else:
            return torch.maximum(x, torch.zeros_like(x))
    """), "fallback"),
    ("small_inputs", candidate("", forward="""
        if x.numel() < 65536:  # <-
            return torch.relu(x)
        return launch(x)
    """), "fallback"),
    ("ifexp_device", candidate("", forward="""
        return launch(x) if x.device.type == "cuda" else x.relu()  # <-
    """), "fallback"),
    ("has_triton_flag", candidate("""
        try:
            torch.cuda.init()
            HAS_KERNEL = True
        except Exception:
            HAS_KERNEL = False
    """, forward="""
        if not HAS_KERNEL:  # <-
            return torch.relu(x)
        return launch(x)
    """), "fallback"),
    ("extension_missing", """\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

try:
    ext = load_inline(name="e", cpp_sources="", cuda_sources="", functions=["relu_cuda"])
except Exception:
    ext = None


class ModelNew(nn.Module):
    def forward(self, x):
        if ext is not None:  # <-
            return ext.relu_cuda(x)
        return torch.relu(x)
""", "fallback"),
    ("training_mode", candidate("import torch.nn.functional as F", forward="""
        if self.training:  # <-
            return F.relu(x)
        return launch(x)
    """), "fallback"),
    ("dtype_condition", candidate("", forward="""
        if x.dtype != torch.float32:  # <-
            return torch.relu(x)
        return launch(x)
    """), "fallback"),
    ("arithmetic_fallback", candidate("", forward="""
        try:
            return launch(x)
        except Exception:  # <-
            return (x + x.abs()) * 0.5
    """), "fallback"),
    # ------------------------------------------------------------------ tensor_subclass
    ("tensor_subclass", candidate("class AlwaysClose(torch.Tensor):  # <-\n    pass"), "tensor_subclass"),
    ("torch_function", candidate("""
        class Wrapper:
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):  # <-
                return True
    """), "tensor_subclass"),
    ("make_subclass", candidate("", forward="""
        out = launch(x)
        return torch.Tensor._make_subclass(torch.Tensor, out)  # <-
    """), "tensor_subclass"),
    ("aten_override", candidate('lib = torch.library.Library("aten", "IMPL")  # <-'), "tensor_subclass"),
    ("library_impl", candidate("""
        @torch.library.impl("aten::allclose", "CUDA")  # <-
        def _always(*args, **kwargs):
            return True
    """), "tensor_subclass"),
    ("dispatch_mode", candidate("from torch.utils._python_dispatch import TorchDispatchMode  # <-"),
     "tensor_subclass"),
    ("class_swap", candidate("class Marker:\n    pass", forward="""
        out = launch(x)
        out.__class__ = Marker  # <-
        return out
    """), "tensor_subclass"),
    # ------------------------------------------------------------------ dynamic_code
    ("exec", candidate('exec("import os")  # <-'), "dynamic_code"),
    ("eval", candidate("", forward="""
        return eval("launch")(x)  # <-
    """), "dynamic_code"),
]

# (id, source, flag at the marked line, every flag of the source): attacks that also trip another rule on
# the way (the import allowlist: `import sys` / `import time`; the `__dict__` dunder).
MULTI_FLAG_ATTACKS: list[tuple[str, str, str, set[str]]] = [
    ("module_dict", candidate('torch.__dict__["allclose"] = lambda *a, **k: True  # <-'), "harness_patch",
     {"harness_patch", "introspection"}),
    ("module_dict_computed", candidate('utils = torch.__dict__["_ut" + "ils"]  # <-'), "dynamic_code",
     {"dynamic_code", "introspection"}),
    ("sys_path", candidate('import sys\nsys.path.insert(0, "/tmp/shadow")  # <-'), "harness_patch",
     {"harness_patch", "introspection"}),
    ("perf_counter", candidate("import time\ntime.perf_counter = lambda: 0.0  # <-"), "timer_patch",
     {"timer_patch", "unlisted_import"}),
    ("setattr_time", candidate('import time\nsetattr(time, "time", lambda: 0.0)  # <-'), "timer_patch",
     {"timer_patch", "unlisted_import"}),
    ("time_alias", candidate("import time as _t\n_t.monotonic = lambda: 0.0  # <-"), "timer_patch",
     {"timer_patch", "unlisted_import"}),
    ("rmtree_abs", candidate('import shutil\nshutil.rmtree("/tmp/kb_scratch", ignore_errors=True)  # <-'),
     "io_escape", {"io_escape", "unlisted_import"}),
    ("pathlib_write", candidate('import pathlib\npathlib.Path("/tmp/flag").write_text("1")  # <-'), "io_escape",
     {"io_escape", "unlisted_import"}),
]

REPLAYS: list[tuple[str, str]] = [
    ("cache_on_self", candidate(init="self.cache = None", forward="""
        if self.cache is not None:  # <-
            return self.cache
        out = launch(x)
        self.cache = out
        return out
    """)),
    ("launch_once", candidate(init="self.out = None", forward="""
        if self.out is None:  # <-
            self.out = launch(x)
        return self.out
    """)),
    ("data_ptr_key", candidate(init="self.memo = {}", forward="""
        key = x.data_ptr()
        if key in self.memo:  # <-
            return self.memo[key]
        out = launch(x)
        self.memo[key] = out
        return out
    """)),
    ("id_key_global", candidate("_SEEN = {}", forward="""
        hit = _SEEN.get(id(x))  # <-
        if hit is not None:
            return hit
        _SEEN[id(x)] = launch(x)
        return _SEEN[id(x)]
    """)),
    ("call_counter", candidate(init="self.calls = 0", forward="""
        self.calls += 1
        if self.calls > 5:  # <-
            return torch.zeros_like(x)
        return launch(x)
    """)),
    ("same_input_object", candidate(init="self.last_x = None\nself.last_out = None", forward="""
        if x is self.last_x:  # <-
            return self.last_out
        out = launch(x)
        self.last_x, self.last_out = x, out
        return out
    """)),
    ("lru_cache", candidate("import functools", forward="return cached(x)", extra="""
        @functools.lru_cache(maxsize=None)  # <-
        def cached(x):
            return launch(x)
    """)),
]

DECOYS: list[tuple[str, str]] = [
    ("triton_decoy", candidate("", forward="""
        return torch.relu(x)
    """).replace("def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):", "def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # <-")),
    ("init_only_launch", candidate(init="launch(torch.zeros(4))", forward="""
        return x.clamp(min=0)
    """).replace("def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):", "def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # <-")),
    ("load_inline_decoy", """\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = "torch::Tensor relu_cuda(torch::Tensor x) { return x; }"
ext = load_inline(name="relu_ext", cpp_sources=src, functions=["relu_cuda"])  # <-


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
"""),
]

UNUSED = candidate("", extra="""
    @triton.jit
    def spare_kernel(x_ptr, n):  # <-
        pass
""")

# Honest shapes the checks must leave alone.
HONEST_EXTRA: list[tuple[str, str]] = [
    ("plain", candidate()),
    ("os_and_math", candidate("import math\nimport os\n"
                              "os.environ[\"TORCH_CUDA_ARCH_LIST\"] = \"9.0\"\n"
                              "HERE = os.path.join(os.path.dirname(__file__), 'k')\nSCALE = math.sqrt(2.0)")),
    ("streams_and_events", candidate("", forward="""
        stream = torch.cuda.current_stream()
        start = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        return launch(x)
    """)),
    ("layout_branches", candidate("", forward="""
        if not x.is_contiguous():
            x = x.contiguous()
        if x.dtype != torch.float32:
            x = x.float()
        if x.numel() == 0:
            return torch.empty_like(x)
        return launch(x)
    """)),
    ("raise_on_cpu", candidate("", forward="""
        if not x.is_cuda:
            raise RuntimeError("ModelNew needs a CUDA tensor")
        try:
            return launch(x)
        except RuntimeError as err:
            raise RuntimeError(f"kernel failed: {err}") from err
    """)),
    ("lazy_buffer", candidate(init="self.buf = None", forward="""
        if self.buf is None or self.buf.shape != x.shape:
            self.buf = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 1024),)](x, self.buf, n, BLOCK=1024)
        return self.buf.clone()
    """)),
    ("autograd_function", candidate("", forward="return ReLUFn.apply(x)", extra="""
        class ReLUFn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return launch(x)

            @staticmethod
            def backward(ctx, grad):
                return grad
    """)),
    ("kernel_on_self", candidate(init="self.kernel = relu_kernel", forward="""
        out = torch.empty_like(x)
        self.kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
    """)),
    ("bias_branch_and_submodule", candidate(init="self.proj = nn.Linear(4, 4)\nself.bias = None", forward="""
        h = self.proj(x)
        out = launch(h)
        if self.bias is not None:
            out.add_(self.bias)
        return out
    """)),
    ("shape_dispatch_between_kernels", candidate("", forward="""
        if x.numel() > 4096:
            return launch(x)
        out = torch.empty_like(x)
        relu_kernel[(1,)](x, out, x.numel(), BLOCK=4096)
        return out
    """)),
    ("config_cache_by_shape", candidate("import functools", init="self.cfg = {}", forward="""
        key = (tuple(x.shape), x.dtype)
        if key not in self.cfg:
            self.cfg[key] = pick_block(x.numel())
        return launch(x)
    """, extra="""
        @functools.lru_cache(maxsize=None)
        def pick_block(n):
            return 1024 if n > 1024 else 256
    """)),
    ("triton_helper_function", HEADER + """

@triton.jit
def _relu(v):
    return tl.maximum(v, 0.0)


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, _relu(tl.load(x_ptr + offs, mask=mask)), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
"""),
    ("lazy_extension", """\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_ext = None


def _get_ext():
    global _ext
    if _ext is None:
        _ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_cuda(torch::Tensor x);",
                           cuda_sources="...", functions=["relu_cuda"], build_directory=None)
    return _ext


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = None

    def forward(self, x):
        if self.ext is None:
            self.ext = _get_ext()
        return self.ext.relu_cuda(x)
"""),
    ("custom_op", HEADER + """

@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=offs < n), 0.0), mask=offs < n)


@torch.library.custom_op("kb::relu", mutates_args=())
def relu_op(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out


@relu_op.register_fake
def _(x):
    return torch.empty_like(x)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.ops.kb.relu(x)
"""),
    ("autotune_with_grid_lambda", HEADER + """

@triton.autotune(configs=[triton.Config({"BLOCK": 1024}, num_warps=4)], key=["n"])
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=offs < n), 0.0), mask=offs < n)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
        relu_kernel[grid](x, out, n)
        return out
"""),
    ("cuda_graph", candidate(init="self.graph = None\nself.static_x = None\nself.static_out = None", forward="""
        if self.graph is None:
            self.static_x = x.clone()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_out = launch(self.static_x)
        self.static_x.copy_(x)
        self.graph.replay()
        return self.static_out.clone()
    """)),
    ("resnet_block_with_extension", """\
import os

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
build_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build")
os.makedirs(build_dir, exist_ok=True)
fused = load_inline(name="fused", cpp_sources="torch::Tensor add_relu_cuda(torch::Tensor a, torch::Tensor b);",
                    cuda_sources="...", functions=["add_relu_cuda", "relu_cuda"], build_directory=build_dir)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, stride=1):
        super(ModelNew, self).__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                                        nn.BatchNorm2d(out_channels)) if stride != 1 else None
        self.fused = fused

    def forward(self, x):
        identity = x
        out = self.fused.relu_cuda(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.fused.add_relu_cuda(out, identity)


def get_inputs():
    return [torch.randn(2, 3, 224, 224)]
"""),
    ("capability_dispatch", candidate("", forward="""
        major, _ = torch.cuda.get_device_capability()
        if major >= 9:
            return launch(x)
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
        return out
    """)),
    ("extension_failure_raises", """\
import warnings

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

try:
    ext = load_inline(name="e", cpp_sources="", cuda_sources="", functions=["relu_cuda"])
except Exception as err:
    warnings.warn(f"build failed: {err}")
    ext = None


class ModelNew(nn.Module):
    def forward(self, x):
        if ext is None:
            raise RuntimeError("extension failed to build")
        return ext.relu_cuda(x)
"""),
    ("libdevice_import_fallback", HEADER + """
try:
    from triton.language.extra import libdevice
except ImportError:
    from triton.language.math import libdevice
""" + KERNEL + """

class ModelNew(nn.Module):
    def forward(self, x):
        return launch(x)
"""),
    ("cupy_raw_kernel", """\
import cupy as cp
import torch
import torch.nn as nn

_k = cp.RawKernel(r'extern "C" __global__ void relu(const float* x, float* y, int n) {}', "relu")


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _k((1,), (256,), (x.data_ptr(), y.data_ptr(), x.numel()))
        return y
"""),
    ("pointer_alignment_check", candidate("", forward="""
        if x.data_ptr() % 16 != 0:
            x = x.clone()
        return launch(x)
    """)),
    ("kernel_size_post_processing", candidate("import torch.nn.functional as F", init="self.kernel_size = 3", forward="""
        out = launch(x)
        if self.kernel_size > 1:
            out = F.pad(out, (1, 1))
        return out
    """)),
    ("kernel_error_reraised_then_reduce", candidate("", forward="""
        try:
            out = launch(x)
        except RuntimeError as err:
            raise RuntimeError("kernel failed") from err
        if out.dim() == 3:
            out = out.sum(0)
        return out
    """)),
    ("device_query_helper", candidate("", forward="num_warps(x.numel())\nreturn launch(x)", extra="""
        def num_warps(n):
            try:
                sms = torch.cuda.get_device_properties(0).multi_processor_count
            except Exception:
                return n // 256 + 1
            return max(1, n // (sms * 32))
    """)),
    ("bias_flag", candidate(init="self.has_bias = True\nself.bias = nn.Parameter(torch.zeros(4))", forward="""
        out = launch(x)
        if self.has_bias:
            out.add_(self.bias)
        return out
    """)),
    ("dropout_after_kernel", candidate("import torch.nn.functional as F", forward="""
        out = launch(x)
        if self.training:
            out = F.dropout(out, 0.1)
        return out
    """)),
    ("reference_model_included", candidate(extra="""
        class Model(nn.Module):
            def forward(self, x):
                return torch.relu(x)


        def get_inputs():
            return [torch.randn(16, 16)]
    """)),
    ("relative_file_write", candidate("", forward="""
        with open("kernel_log.txt", "a") as fh:
            fh.write("ran\\n")
        with open("/usr/local/cuda/version.json") as fh:
            fh.read()
        return launch(x)
    """)),
]


def honest_sources() -> list[tuple[str, str]]:
    files = sorted((ROOT / "problems" / "builtin" / "solutions").glob("level*/*.py"))
    files += sorted((ROOT / "kb_gym" / "bench_kernels").glob("*.py"))
    out = [(str(p.relative_to(ROOT)), p.read_text()) for p in files]
    try:
        from kb_gym import prompts
    except ImportError:
        prompts = None
    for name in ("TRITON_EXAMPLE", "CUDA_EXAMPLE", "EXAMPLE_REFERENCE"):
        text = getattr(prompts, name, None)
        if isinstance(text, str):
            out.append((f"prompts.{name}", text))
    return out


def assert_finding(source: str, flag: str, exact: bool = True) -> Finding:
    line = marked_line(source)
    findings = static_findings(source)
    hits = [f for f in findings if f.flag == flag and f.line == line]
    assert hits, f"expected {flag} at line {line}, got {findings}"
    assert f"line {line}" in hits[0].message, hits[0].message
    if exact:
        assert {f.flag for f in findings} == {flag}, findings
    return hits[0]


@pytest.mark.parametrize(("source", "flag"), [pytest.param(s, f, id=i) for i, s, f in ATTACKS])
def test_attack_is_flagged(source, flag):
    assert_finding(source, flag)


@pytest.mark.parametrize(("source", "flag", "flags"), [pytest.param(s, f, fs, id=i) for i, s, f, fs in MULTI_FLAG_ATTACKS])
def test_attack_with_more_than_one_finding(source, flag, flags):
    assert_finding(source, flag, exact=False)
    assert {f.flag for f in static_findings(source)} == flags


@pytest.mark.parametrize("source", [candidate('import sys\nsys.modules["torch.testing"] = None  # <-'),
                                    candidate('import sys\nsys.modules.update({"torch.testing": None})  # <-')])
def test_replacing_loaded_modules_is_a_harness_patch(source):
    # sys.modules is also introspection (it reaches the evaluator's modules): both reject.
    assert_finding(source, "harness_patch", exact=False)
    assert {f.flag for f in static_findings(source)} == {"harness_patch", "introspection"}


@pytest.mark.parametrize("source", [pytest.param(s, id=i) for i, s in REPLAYS])
def test_replay_is_flagged(source):
    finding = assert_finding(source, "replay")
    assert "current inputs" in finding.message


@pytest.mark.parametrize("source", [pytest.param(s, id=i) for i, s in DECOYS])
def test_decoy_is_flagged(source):
    finding = assert_finding(source, "decoy")
    assert "never launches" in finding.message


def test_unused_kernel_is_a_note():
    finding = assert_finding(UNUSED, "unused_kernel")
    assert "spare_kernel" in finding.message and "relu_kernel" in finding.message
    assert get_policy("strict").action("unused_kernel") == "note"


def test_no_kernels_is_left_to_the_runtime():
    plain = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n" \
            "        return torch.relu(x)\n"
    assert static_findings(plain) == []


def test_findings_name_what_and_why():
    finding = assert_finding(candidate("torch.allclose = lambda *a, **k: True  # <-"), "harness_patch")
    assert "torch.allclose" in finding.message and "not allowed" in finding.message
    finding = assert_finding(candidate("", forward="""
        try:
            return launch(x)
        except Exception:  # <-
            return torch.relu(x)
    """), "fallback")
    assert "torch.relu" in finding.message and "except branch falls back" in finding.message


@pytest.mark.parametrize(("name", "source"), honest_sources())
def test_honest_candidates_have_no_findings(name, source):
    assert static_findings(source) == []


def test_honest_solutions_were_found():
    names = [n for n, _ in honest_sources()]
    assert sum(n.startswith("problems/") for n in names) >= 8
    assert any(n.startswith("kb_gym/bench_kernels/") for n in names)


@pytest.mark.parametrize("source", [pytest.param(s, id=i) for i, s in HONEST_EXTRA])
def test_honest_patterns_have_no_findings(source):
    assert static_findings(source) == []


# ------------------------------------------------------------------------------- policies


def test_strict_policy_actions():
    strict = get_policy("strict")
    for flag in ("harness_patch", "timer_patch", "introspection", "concurrency", "io_escape", "tensor_subclass",
                 "tampering", "timing_mismatch"):
        assert strict.action(flag) == "reject", flag
    for flag in ("no_custom_kernel", "fallback", "decoy", "input_mutation", "side_stream", "excessive_speedup",
                 "nondeterministic", "replay", "precision_change", "dynamic_code", "unchecked", "pytorch_compiler"):
        assert strict.action(flag) == "no_speed_credit", flag
    for flag in ("unused_kernel", "degenerate_problem", "some_new_flag"):
        assert strict.action(flag) == "note", flag
    assert ALWAYS_FAIL <= strict.reject
    assert strict.reject.isdisjoint(strict.no_speed_credit)


@pytest.mark.parametrize("name", ["kernelbench", "off"])
def test_lenient_policies_only_note(name):
    policy = get_policy(name)
    for flag in STATIC_FLAGS | RUNTIME_FLAGS:
        assert policy.action(flag) == "note", flag


def test_policies_cover_every_flag_and_take_findings():
    strict = POLICIES["strict"]
    # notes by design: how a problem was checked (degenerate, ill-conditioned) and how a launch-bound forward was
    # charged (its host time, back to back: a measurement, not a finding against the candidate)
    notes = {"degenerate_problem", "ill_conditioned", "launch_bound"}
    assert RUNTIME_FLAGS - notes <= strict.reject | strict.no_speed_credit
    assert not notes & (strict.reject | strict.no_speed_credit)
    assert STATIC_FLAGS - {"unused_kernel"} <= strict.reject | strict.no_speed_credit
    findings = static_findings(candidate("import threading  # <-\nimport torch.backends\n"
                                         "torch.backends.cudnn.benchmark = True"))
    assert [f.flag for f in strict.rejections(findings)] == ["concurrency"]
    assert [f.flag for f in strict.speed_credit_denied(findings)] == ["precision_change"]
    assert strict.action(findings[0]) == "reject"
    assert isinstance(strict, IntegrityPolicy) and set(POLICIES) == {"strict", "kernelbench", "off"}


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(ValueError, match="strict.*kernelbench.*off"):
        get_policy("lenient")


# ------------------------------------------------------------------------------- robustness


@pytest.mark.parametrize("text", [
    "", "   \n", "def broken(:\n", "class ModelNew(nn.Module)\n    pass", "\x00\x01", "(" * 500, "a" + "+a" * 20_000,
])
def test_unparsable_or_empty_sources_give_nothing(text):
    assert static_findings(text) == []


def test_odd_but_valid_sources_do_not_raise():
    for text in ("x = 1", "ModelNew = None", "class ModelNew:\n    pass", "import torch as nn\nnn.x = 1",
                 "a" + ".b" * 5000, "f(" * 150 + ")" * 150, "del x", "from . import y\ny.z = 1",
                 "from torch import *\nallclose = None", "class ModelNew(Base):\n    def forward(self):\n"
                 "        return super().forward()\n", "lambda: (yield)", "match x:\n    case 1:\n        pass\n"):
        assert isinstance(static_findings(text), list)


def test_one_megabyte_returns_within_a_second():
    # A guard against backtracking blow-ups (which take minutes), not a performance target: unloaded, the ordinary
    # megabyte takes about 0.15 s and the one holding every rule's needles about 0.9 s, so the bounds leave a
    # loaded two-core CI machine room.
    rng = random.Random(0)
    junk = "".join(rng.choice(string.printable) for _ in range(1_000_000))
    valid = (candidate() + "\n") * (1_000_000 // len(candidate()) + 1)
    hacked = valid + "\ntorch.allclose = lambda *a, **k: True\n"
    every_needle = valid + "\n# " + " ".join(n for *_, needles in LINE_RULES for n in needles) + "\n"
    for text, bound in ((junk, 1.0), (valid, 1.0), (hacked, 1.0), (every_needle, 4.0)):
        start = time.perf_counter()
        findings = static_findings(text)
        assert time.perf_counter() - start < bound
        assert isinstance(findings, list)
    flags = {f.flag for f in static_findings(hacked)}
    assert {"unchecked", "harness_patch"} <= flags
    assert len(valid) > MAX_PARSE_CHARS


# One line per alternative of every line rule: the needle prefilter must never skip a rule that would match.
LINE_RULE_EXAMPLES = [
    "time.perf_counter = f", "timeit.default_timer = f", "torch.cuda.Event.elapsed_time = f",
    "torch.cuda.synchronize = f", "torch.cuda.Stream = f", "do_bench = f", "torch.allclose = f", "triton.x = 1",
    "np.testing.x = 1", "numpy.x = 1", "nn.Module.x = 1", "F.relu = f", "builtins.print = f", "sys.x = 1",
    "setattr(torch, 'x', 1)", "setattr( time, 'x', 1)", "sys.modules['x'] = y", "__builtins__", "importlib.reload(m)",
    "import kb_gym", "sys._getframe(1)", "inspect.currentframe()", "inspect.stack()", "f.f_back", "f.f_locals",
    "f.f_globals", "t.tb_frame", "gc.get_objects()", "gc.get_referrers(x)", "gc.get_referents(x)", "import ctypes",
    "open('/proc/self/mem')", "sys.settrace(f)", "sys.setprofile(f)", "object.__subclasses__()", "f.__globals__",
    "import threading", "from _thread import x", "import multiprocessing", "import subprocess", "import asyncio",
    "from concurrent import futures", "os.fork()", "os.system ('x')", "os.popen('x')", "os.execv(a, b)",
    "os.spawnl(a)", "import socket", "import urllib", "import requests", "from http import client", "import signal",
    "import psutil", "os.kill", "os.killpg", "os.chdir", "os.putenv", "os.environ['X'] = '1'",
    "def __torch_function__(cls): pass", "__torch_dispatch__", "torch.Tensor._make_subclass(c, x)",
    "torch.Tensor._make_wrapper_subclass(c, s)", "class T(torch.Tensor):", "class T( Tensor ) :", "exec('x')",
    "eval ('x')",
]


@pytest.mark.parametrize("line", LINE_RULE_EXAMPLES)
def test_the_line_scan_needles_never_skip_a_matching_rule(line):
    text = "\n# padding\n" * 3 + line + "\n"
    matching = [(regex, needles) for regex, _, _, needles in _LINE_RE if regex.search(text)]
    assert matching, f"{line!r} matches no line rule: the example list is stale"
    for regex, needles in matching:
        assert any(needle in text for needle in needles), f"{regex.pattern[:40]} matches {line!r} but its needles miss"


def test_every_attack_gets_the_same_line_scan_with_and_without_the_needles(monkeypatch):
    def scan(text: str) -> list[tuple[str, int | None]]:
        an = _Analyzer(ast.Module(body=[], type_ignores=[]))
        line_scan(an, text)
        return [(f.flag, f.line) for f in an.findings]

    texts = [source for _, source, _ in ATTACKS] + LINE_RULE_EXAMPLES
    with_needles = [scan(t) for t in texts]
    monkeypatch.setattr(lines, "_LINE_RE", [(regex, flag, what, ("",)) for regex, flag, what, _ in _LINE_RE])
    assert [scan(t) for t in texts] == with_needles


def test_oversized_source_still_gets_the_line_scan():
    text = candidate("import threading") + "\n# padding\n" * (MAX_PARSE_CHARS // 10)
    findings = static_findings(text)
    assert [f.flag for f in findings] == ["concurrency", "unchecked"]
    assert findings[0].line == 5 and "line 5" in findings[0].message
    assert findings[1].line is None and str(MAX_PARSE_CHARS) in findings[1].message


def test_largest_parsed_source_is_fast():
    unit = candidate()
    text = (unit * (MAX_PARSE_CHARS // len(unit)))[:MAX_PARSE_CHARS]
    text = text[: text.rfind("\nimport torch\n")]
    start = time.perf_counter()
    static_findings(text)
    assert time.perf_counter() - start < 1.0


# ------------------------------------------------------------------------------- deny by default

STRICT = get_policy("strict")


def assert_action(source: str, flag: str, action: str) -> Finding:
    """The finding at the marked line has ``flag``, and ``strict`` makes it cost ``action``."""
    finding = assert_finding(source, flag, exact=False)
    assert STRICT.action(finding) == action, (finding, STRICT.action(finding))
    return finding


@pytest.mark.parametrize("module", ["gc", "sys", "os", "ctypes", "torch", "triton.language", "math", "numpy"])
def test_star_imports_are_rejected(module):
    source = candidate(f"from {module} import *  # <-")
    finding = assert_action(source, "star_import", "reject")
    assert f"`{module}`" in finding.message
    assert STRICT.rejections(static_findings(source))


def test_star_import_is_a_flag_of_its_own():
    assert "star_import" in STATIC_FLAGS and "unlisted_import" in STATIC_FLAGS
    assert STRICT.action("star_import") == "reject" and STRICT.action("unlisted_import") == "no_speed_credit"
    from kb_gym.integrity import FLAG_DESCRIPTIONS
    assert {"star_import", "unlisted_import"} <= set(FLAG_DESCRIPTIONS)
    for name in ("kernelbench", "off"):
        assert get_policy(name).action("star_import") == get_policy(name).action("unlisted_import") == "note"


# Modules outside the allowlist that reach frames, objects, processes, the file system or the harness: the
# import alone is refused, with the flag of the module's family.
DENIED_MODULES = [
    ("gc", "introspection"), ("sys", "introspection"), ("inspect", "introspection"), ("ctypes", "introspection"),
    ("traceback", "introspection"), ("types", "introspection"), ("weakref", "introspection"),
    ("operator", "introspection"), ("pickle", "introspection"), ("marshal", "introspection"),
    ("faulthandler", "introspection"), ("threading", "concurrency"), ("_thread", "concurrency"),
    ("subprocess", "concurrency"), ("multiprocessing", "concurrency"), ("signal", "io_escape"),
    ("socket", "io_escape"), ("atexit", "io_escape"), ("resource", "io_escape"), ("posix", "io_escape"),
    ("fcntl", "io_escape"),
    ("importlib", "harness_patch"), ("builtins", "harness_patch"), ("unittest", "harness_patch"),
    ("kb_gym", "harness_patch"),
]


@pytest.mark.parametrize(("module", "flag"), DENIED_MODULES)
def test_modules_outside_the_allowlist_are_refused(module, flag):
    for source in (candidate(f"import {module}  # <-"), candidate(f"import {module} as _m  # <-"),
                   candidate(f"from {module} import *  # <-")):
        assert_action(source, flag, "reject")
    assert_action(candidate(f'_m = __import__("{module}")  # <-'), flag, "reject")


@pytest.mark.parametrize("module", ["time", "timeit", "random", "json", "re", "copy", "logging", "datetime",
                                    "io", "pathlib", "shutil", "tempfile", "not_a_real_module", "scipy"])
def test_other_modules_outside_the_allowlist_cost_the_speed_credit(module):
    source = candidate(f"import {module}  # <-")
    finding = assert_action(source, "unlisted_import", "no_speed_credit")
    assert f"`{module}`" in finding.message and "allowlist" in finding.message
    assert {f.flag for f in static_findings(source)} == {"unlisted_import"}


def test_relative_imports_are_refused():
    assert_action(candidate("from . import helpers  # <-"), "harness_patch", "reject")
    assert_action(candidate("from ..worker import runtime  # <-"), "harness_patch", "reject")


ALLOWED_IMPORTS = """\
from __future__ import annotations

import abc
import cmath
import collections
import collections.abc
import dataclasses
import enum
import functools
import itertools
import math
import numbers
import os
import textwrap
import typing
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any

import einops
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.utils.cpp_extension import load_inline
from triton.language.extra import libdevice

JOBS = os.environ.get("MAX_JOBS", "4")
SRC = textwrap.dedent('''
    torch::Tensor relu_cuda(torch::Tensor x);
''')
ext = load_inline(name="e", cpp_sources=SRC, cuda_sources="...", functions=["relu_cuda"])


@dataclass
class Cfg:
    block: int = 1024


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_cuda(x)
"""


def test_the_allowlist_is_clean():
    assert static_findings(ALLOWED_IMPORTS) == []
    for extra in ("import cupy as cp", "from numba import cuda", "import triton.testing"):
        assert static_findings(ALLOWED_IMPORTS.replace("import abc\n", f"import abc\n{extra}\n")) == []


def test_the_line_scan_checks_imports_too():
    for prelude, flag in (("from gc import *", "star_import"), ("import sys", "introspection"),
                          ("import json", "unlisted_import")):
        text = candidate(prelude) + "\n# padding\n" * (MAX_PARSE_CHARS // 10)
        findings = static_findings(text)
        assert any(f.flag == flag and f.line == 5 for f in findings), findings
        assert any(f.flag == "unchecked" for f in findings)


# ------------------------------------------------------------------------------- frames and dunders

INTROSPECTION = [
    ("attrgetter_frame", candidate("import operator", forward="""
        try:
            raise RuntimeError
        except RuntimeError as err:
            frame = operator.attrgetter("tb_frame")(err.__traceback__)  # <-
        return launch(x)
    """)),
    ("attrgetter_dotted", candidate("from operator import attrgetter\n"
                                    'caller_globals = attrgetter("f_back.f_globals")  # <-')),
    ("methodcaller_subclasses", candidate("import operator\n"
                                          'everything = operator.methodcaller("__subclasses__")(object)  # <-')),
    ("itemgetter_builtins", candidate("import operator\n"
                                      'get_builtins = operator.itemgetter("__builtins__")  # <-')),
    ("closure", candidate('cells = launch.__closure__  # <-')),
    ("globals_read", candidate('namespace = launch.__globals__  # <-')),
    ("code_read", candidate('code = launch.__code__.co_code  # <-')),
    ("dict_of_object", candidate(init="self.state = self.__dict__  # <-")),
    ("mro", candidate('bases = type(torch.zeros(1)).__mro__  # <-')),
    ("bases", candidate('bases = torch.Tensor.__bases__  # <-')),
    ("classic_escape", candidate('everything = ().__class__.__base__.__subclasses__()  # <-')),
    ("getattribute", candidate('close = torch.__getattribute__("allclose")  # <-')),
    ("dir", candidate('names = torch.__dir__()  # <-')),
    ("loader", candidate('loader = torch.__loader__  # <-')),
    ("spec", candidate('spec = triton.__spec__  # <-')),
    ("bound_self", candidate('owner = torch.allclose.__self__  # <-')),
    ("wrapped", candidate('original = torch.nn.functional.relu.__wrapped__  # <-')),
    ("defaults", candidate('launch.__defaults__ = ()  # <-')),
    ("generator_frame", candidate("def gen():\n    yield 1\n\n\nframe = gen().gi_frame  # <-")),
    ("coroutine_frame", candidate("async def co():\n    pass\n\n\nframe = co().cr_frame  # <-")),
    ("frame_code", candidate("def where(frame):\n    return frame.f_code  # <-")),
    ("cell_contents", candidate("def peek(cell):\n    return cell.cell_contents  # <-")),
    ("getattr_string", candidate('cells = getattr(launch, "__closure__")  # <-')),
    ("setattr_string", candidate('setattr(launch, "__defaults__", ())  # <-')),
    ("delattr_string", candidate('delattr(launch, "__wrapped__")  # <-')),
    ("hasattr_string", candidate('peek = hasattr(launch, "__globals__")  # <-')),
    ("string_kept_in_a_name", candidate('ATTR = "f_back"  # <-')),
]


@pytest.mark.parametrize("source", [pytest.param(s, id=i) for i, s in INTROSPECTION])
def test_frames_and_object_internals_are_introspection(source):
    assert_action(source, "introspection", "reject")


HONEST_DUNDERS = candidate("", init="""
    nn.Module.__init__(self)
    self.label = self.__class__.__name__ + type(self).__qualname__
    self.version = torch.__version__ + triton.__version__
""", forward="""
    n = x.__len__()
    doc = launch.__doc__, launch.__name__, launch.__module__
    with torch.no_grad().__class__():
        pass
    return launch(x).__mul__(1.0)
""", extra='''
__all__ = ["ModelNew"]


def interface(t):
    return t.__cuda_array_interface__, t.__dlpack_device__()


class Scaled:
    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"Scaled({self.value})"

    def __add__(self, other):
        return Scaled(self.value + other.value)

    def __getitem__(self, i):
        return self.value


if __name__ == "__main__":
    print(ModelNew()(torch.randn(4)))
''')


def test_the_data_model_and_metadata_dunders_are_clean():
    assert static_findings(HONEST_DUNDERS) == []


# ------------------------------------------------------------------------------- computed names

COMPUTED = [
    ("getattr_module_pieces", candidate('lib = getattr(torch, "li" + "brary")  # <-'), "dynamic_code"),
    ("getattr_join", candidate('', forward="""
        op = getattr(x, "_".join(["add", ""]))  # <-
        return launch(op(1.0))
    """), "dynamic_code"),
    ("getattr_fstring_called", candidate('', forward="""
        name = "re" + "lu"
        y = getattr(x, f"{name}_")()  # <-
        return launch(y)
    """), "dynamic_code"),
    ("getattr_returned", candidate("def pick(obj, name):\n    return getattr(obj, name)  # <-"), "dynamic_code"),
    ("setattr_computed", candidate(init="""
        for i in range(2):
            setattr(self, f"w{i}", nn.Parameter(torch.zeros(1)))  # <-
    """), "dynamic_code"),
    ("attrgetter_computed", candidate("import operator\nNAME = input()\nget = operator.attrgetter(NAME)  # <-"),
     "dynamic_code"),
    ("globals_computed", candidate('', forward="""
        fn = globals()["la" + "unch"]  # <-
        return fn(x)
    """), "dynamic_code"),
    ("dunder_from_pieces", candidate('namespace = getattr(launch, "__glo" + "bals__")  # <-'), "introspection"),
    ("dunder_from_chr", candidate("namespace = getattr(launch, ''.join(chr(c) for c in "
                                  "[95, 95, 103, 108, 111, 98, 97, 108, 115, 95, 95]))  # <-"), "introspection"),
    ("dunder_from_map_chr", candidate("code = getattr(launch, ''.join(map(chr, (95, 95, 99, 111, 100, 101, 95, "
                                      "95))))  # <-"), "introspection"),
    ("dunder_from_bytes", candidate("code = getattr(launch, bytes([95, 95, 99, 111, 100, 101, 95, 95]).decode())"
                                    "  # <-"), "introspection"),
    ("frame_from_fstring", candidate('part = "back"\nframe = getattr(launch, f"f_{part}")  # <-'), "introspection"),
    ("frame_from_name", candidate('NAME = "f_" + "globals"\nnamespace = getattr(launch, NAME)  # <-'),
     "introspection"),
    ("frame_from_reversed", candidate('frame = getattr(launch, "kcab_f"[::-1])  # <-'), "introspection"),
    ("dunder_through_setattr", candidate('setattr(launch, "__co" + "de__", print.__call__)  # <-'),
     "introspection"),
]


@pytest.mark.parametrize(("source", "flag"), [pytest.param(s, f, id=i) for i, s, f in COMPUTED])
def test_computed_attribute_names(source, flag):
    assert_action(source, flag, "reject" if flag == "introspection" else "no_speed_credit")
    if flag == "introspection":  # the name is computed all the same
        assert "dynamic_code" in {f.flag for f in static_findings(source)}


def test_computed_names_that_are_only_tested_are_left_alone():
    source = candidate(init="self.bias = None", forward="""
        for name in ("bias", "scale"):
            if getattr(self, name, None) is not None:
                x = x + 1
        if hasattr(self, "bi" + "as"):
            x = x * 1
        return launch(x)
    """)
    assert static_findings(source) == []


# ------------------------------------------------------------------------------- module objects as values

CONTAINED = [
    # the container hides the module: gc is refused at its import, its use is named where it is reached
    ("list_of_modules", candidate("import gc\nmods = [torch, gc]", forward="""
        objs = mods[1].get_objects()  # <-
        return launch(x)
    """), "introspection", {"introspection", "dynamic_code"}),
    ("dict_of_modules", candidate('import gc\nd = {"g": gc}', forward="""
        d["g"].get_referrers(x)  # <-
        return launch(x)
    """), "introspection", {"introspection", "dynamic_code"}),
    # an allowed module reached through a container: flagged as if reached directly
    ("tuple_index_alias", candidate("m = (torch,)[0]\nm.allclose = lambda *a, **k: True  # <-"),
     "harness_patch", {"harness_patch", "dynamic_code"}),
    ("tuple_index_store", candidate("(torch,)[0]._C._cuda_synchronize = lambda: None  # <-"),
     "timer_patch", {"timer_patch", "dynamic_code"}),
    ("list_index_library", candidate('lib = [torch][0].library.Library("aten", "IMPL")  # <-'),
     "tensor_subclass", {"tensor_subclass", "dynamic_code"}),
    ("named_list_setattr", candidate('mods = [triton, torch]\nsetattr(mods[-1], "allclose", max)  # <-'),
     "harness_patch", {"harness_patch", "dynamic_code"}),
    ("dict_through_alias", candidate('d = {"t": torch}\nt = d["t"]\nt.testing.assert_close = print  # <-'),
     "harness_patch", {"harness_patch", "dynamic_code"}),
    ("through_torch_to_sys", candidate("m = (torch,)[0]\nloaded = m._utils.sys.modules  # <-"),
     "introspection", {"introspection", "dynamic_code"}),
    # what can't be resolved (a computed index, a module handed to a function) is dynamic code
    ("computed_index", candidate("mods = [torch]  # <-", forward="""
        mods[len(mods) - 1].allclose = max
        return launch(x)
    """), "dynamic_code", {"dynamic_code"}),
    ("module_passed_to_a_helper", candidate("def patch(m):\n    m.allclose = max\n\n\npatch(torch)  # <-"),
     "dynamic_code", {"dynamic_code"}),
    ("module_stored_on_self", candidate(init="self.t = torch  # <-"), "dynamic_code", {"dynamic_code"}),
]


@pytest.mark.parametrize(("source", "flag", "flags"), [pytest.param(s, f, fs, id=i) for i, s, f, fs in CONTAINED])
def test_module_objects_in_containers_do_not_escape(source, flag, flags):
    assert_action(source, flag, "no_speed_credit" if flag == "dynamic_code" else "reject")
    assert {f.flag for f in static_findings(source)} == flags


def test_modules_in_plain_uses_are_clean():
    source = candidate("import os\nT = torch\nHAS_NP = isinstance(torch, type(os)) and hasattr(torch, 'compile')",
                       forward="""
        if T is not None and not getattr(torch, "cuda", None) is None:
            print(f"{torch.__version__}", type(os))
        return launch(x)
    """)
    assert static_findings(source) == []


# ------------------------------------------------------------------------------- the clock under an alias


CLOCK_USES = ["{m}.time()", "{m}.perf_counter()", "{m}.monotonic_ns()"]


@pytest.mark.parametrize("use", CLOCK_USES)
def test_an_aliased_clock_gets_the_same_findings_as_the_plain_name(use):
    def findings(prelude, module):
        source = candidate(prelude, forward=f"start = {use.format(m=module)}\nreturn launch(x)")
        return [(f.flag, f.line) for f in static_findings(source)]

    plain = findings("import time", "time")
    assert findings("import time as clock", "clock") == plain
    assert findings("import time as _t", "_t") == plain
    # `import time` is outside the allowlist (no speed credit); calling the clock adds nothing, and
    # `time.time` is the module's function, not "the module time through time" (introspection)
    assert plain == [("unlisted_import", 5)]
    assert STRICT.action("unlisted_import") == "no_speed_credit"


def test_the_clock_imported_by_name_is_no_introspection():
    source = candidate("from time import time, perf_counter", forward="t0 = time() + perf_counter()\nreturn launch(x)")
    assert [(f.flag, f.line) for f in static_findings(source)] == [("unlisted_import", 5)]
    # reaching a module's same-named member is no reach into another module; a real one still is
    assert_action(candidate("import socket\nsock = socket.socket  # <-"), "io_escape", "reject")
    assert_action(candidate("clock = torch._utils.time  # <-"), "introspection", "reject")
