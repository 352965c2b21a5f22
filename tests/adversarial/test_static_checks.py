"""Static integrity checks (kb_gym.integrity): one adversarial candidate of our own per attack.

Each attack is a working Triton candidate with one hack added; the line the finding must name is
marked ``# <-``. Honest candidates (the built-in solutions, the benchmark kernels, the prompt
examples) must give no finding at all. Fast, CPU only, nothing is executed.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kb_gym.integrity import (
    Finding,
    get_policy,
    static_findings,
)

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
