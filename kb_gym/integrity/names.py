"""Tables the static checks read: modules (allowed, known, reachable), qualified names and attributes that
are findings, and the names the behaviour analysis treats as launches, computation or availability tests."""

from __future__ import annotations

import builtins as _builtins
import re as _re

MAX_PARSE_CHARS = 100_000  # about 25k tokens: far above a policy's completion, small enough to parse in time
MAX_PER_FLAG = 6
ENV_ALLOW = frozenset({"TORCH_CUDA_ARCH_LIST", "MAX_JOBS"})
# Ways from a C++ source (load_inline) into the interpreter that runs it, read in the source with its comments and
# line splices taken out (native_source): pybind11's evaluation, imports, namespaces and attribute access under any
# namespace name (`py::`, `pybind11::`, an alias), CPython's entry points as identifiers (called, aliased by a
# `#define`, taken by address, or named in an `__asm__` label), and the dynamic linker. Round 20: `py::exec` ran round
# 4's time lie from an extension's source under `strict` (60-81x); round 21 spelled it ten ways past the first
# pattern. A kernel's binding needs none of them (`PYBIND11_MODULE`, `m.def`, `py::arg`, `py::object`, `py::none`
# stay clean). Read by the static checks in every string, and by the runner in what a build is actually given
# (worker/native_guard.py).
INTO_PYTHON = _re.compile(
    r"\b\w+\s*::\s*(?:exec|eval|eval_file|globals|getattr|setattr|delattr|hasattr|reinterpret_borrow"
    r"|reinterpret_steal|import)\b"
    # `.attr(...)` but a module constant's assignment (`m.attr("BLOCK") = 128;`)
    r"|\bmodule_?\s*::\s*import\b|\.\s*attr\s*\((?!\s*\"(?!__)[A-Za-z_]\w*\"\s*\)\s*=(?!=))"
    r"|\busing\s+namespace\s+pybind11\b"
    r"|\b_?Py(?:Run|Eval|Import|Sys|Frame|ThreadState|InterpreterState|Code|Function|Marshal|GC|Capsule_Import"
    r"|Object_(?:Generic)?[GS]etAttr|Object_Call|Module_GetDict|Dict_GetItem)\w*"
    r"|\b_Py\w+|\bPy_(?:CompileString|Initialize|Finalize|Exit|Main|RunMain|NewInterpreter|EndInterpreter"
    r"|BytesMain)\w*"
    r"|\bdl(?:sym|vsym|open|mopen|info)\b"
    r"|^[ \t]*#[ \t]*include[ \t]+[A-Za-z_]\w*[ \t]*$", _re.MULTILINE)  # an include named by a macro
_COMMENTS = _re.compile(r"//[^\n]*|/\*.*?\*/", _re.DOTALL)


def native_source(text: str) -> str:
    """C or C++ source as the compiler reads its tokens: line splices joined and comments taken out (a name split
    by either reads whole there: round 21)."""
    return _COMMENTS.sub(" ", text.replace("\\\n", "").replace("\\\r\n", ""))


def into_python(text: str) -> str | None:
    """The first way into the interpreter ``INTO_PYTHON`` finds in C or C++ ``text`` (read as ``native_source``), or
    None."""
    hit = INTO_PYTHON.search(native_source(text))
    return hit.group(0).strip() if hit else None

BUILTIN_NAMES = frozenset(dir(_builtins))
DEFAULT_ALIASES = {"F": "torch.nn.functional", "nn": "torch.nn", "np": "numpy", "tl": "triton.language"}
KNOWN_MODULES = frozenset({
    "torch", "triton", "numpy", "builtins", "sys", "os", "time", "gc", "inspect", "importlib", "imp",
    "kb_gym", "functools", "math", "random", "ctypes", "_ctypes", "cffi", "threading", "_thread",
    "multiprocessing", "subprocess", "asyncio", "concurrent", "socket", "signal", "shutil", "pathlib",
    "tempfile", "io", "types", "operator", "warnings", "logging", "einops", "cupy", "timeit", "traceback",
    "weakref", "contextlib", "pickle", "marshal", "codecs", "json", "urllib", "urllib3", "requests", "http",
    "httpx", "psutil", "resource", "unittest", "mock", "pytest", "numba", "scipy", "atexit", "pty", "joblib",
    "typing", "dataclasses", "collections", "itertools", "copy", "struct", "mmap", "site", "platform",
    "faulthandler", "tracemalloc", "posix", "_posixsubprocess", "_signal", "_socket", "_io", "_weakref",
    "_operator", "copyreg", "dill", "cloudpickle", "shelve", "pdb", "bdb", "dis", "linecache", "sqlite3", "ssl",
    "zipimport", "pkgutil", "runpy", "fcntl", "_pickle", "selectors",
})

# Deny by default: the modules (and their submodules) a candidate may import. Everything else is a finding:
# the flag of the module's family below (all reject under ``strict``), else ``unlisted_import`` (no speed
# credit: ``time``, ``random``, ``json``, ``tempfile``, ``pathlib``, unknown packages...; file-system modules
# are no family: what they do at absolute paths is ``io_escape`` by the path rules). Allowed modules still go
# through the rules on qualified names (torch.multiprocessing, os.system, ...).
ALLOWED_MODULES = frozenset({
    "__future__", "torch", "triton", "numpy", "cupy", "numba", "einops",
    "math", "cmath", "numbers", "functools", "itertools", "collections", "typing", "typing_extensions",
    "dataclasses", "enum", "abc", "warnings", "textwrap", "os",
})
# The flag an import of a module outside the allowlist gets, by the module's root (``unlisted_import`` if none).
MODULE_FAMILIES: dict[str, str] = {
    **dict.fromkeys(("sys", "gc", "inspect", "traceback", "types", "weakref", "_weakref", "operator", "_operator",
                     "faulthandler", "tracemalloc", "dis", "linecache", "pdb", "bdb", "ctypes", "_ctypes",
                     "cffi", "mmap", "marshal", "pickle", "_pickle", "shelve", "copyreg", "dill", "cloudpickle",
                     "objgraph", "pympler", "guppy"), "introspection"),
    **dict.fromkeys(("threading", "_thread", "multiprocessing", "subprocess", "_posixsubprocess", "asyncio",
                     "concurrent", "joblib", "pty", "sched"), "concurrency"),
    **dict.fromkeys(("socket", "_socket", "ssl", "signal", "_signal", "atexit", "resource", "psutil", "posix",
                     "nt", "fcntl", "select", "selectors", "urllib", "urllib3", "requests", "http", "httpx",
                     "aiohttp", "ftplib", "smtplib", "telnetlib", "paramiko", "websocket", "websockets"),
                    "io_escape"),
    **dict.fromkeys(("builtins", "importlib", "imp", "zipimport", "pkgutil", "site", "unittest", "mock",
                     "pytest", "kb_gym"), "harness_patch"),
}

# Qualified names (exact or a dotted prefix) whose use is a finding, most specific first.
REF_RULES: tuple[tuple[str, str], ...] = (
    ("torch.multiprocessing", "concurrency"),
    ("torch.overrides", "tensor_subclass"),
    ("torch.utils._python_dispatch", "tensor_subclass"),
    ("torch._C._dispatch*", "tensor_subclass"),
    ("torch._C._set_python_dispatch*", "tensor_subclass"),
    ("torch.Tensor._make_subclass", "tensor_subclass"),
    ("torch.Tensor._make_wrapper_subclass", "tensor_subclass"),
    ("ctypes", "introspection"), ("_ctypes", "introspection"), ("cffi", "introspection"),
    ("mmap", "introspection"), ("numpy.ctypeslib", "introspection"),
    ("inspect.currentframe", "introspection"), ("inspect.stack", "introspection"),
    ("inspect.getouterframes", "introspection"), ("inspect.getinnerframes", "introspection"),
    ("inspect.trace", "introspection"), ("inspect.getframeinfo", "introspection"),
    ("sys._getframe", "introspection"), ("sys._current_frames", "introspection"),
    ("sys.settrace", "introspection"), ("sys.setprofile", "introspection"),
    ("sys.addaudithook", "introspection"), ("sys.monitoring", "introspection"),
    ("sys.modules", "introspection"),
    ("gc.get_objects", "introspection"), ("gc.get_referrers", "introspection"),
    ("gc.get_referents", "introspection"), ("traceback.extract_stack", "introspection"),
    ("traceback.walk_stack", "introspection"),
    ("threading", "concurrency"), ("_thread", "concurrency"), ("multiprocessing", "concurrency"),
    ("subprocess", "concurrency"), ("asyncio", "concurrency"), ("concurrent", "concurrency"),
    ("joblib", "concurrency"), ("pty", "concurrency"),
    ("os.fork", "concurrency"), ("os.forkpty", "concurrency"), ("os.system", "concurrency"),
    ("os.popen", "concurrency"), ("os.posix_spawn", "concurrency"), ("os.posix_spawnp", "concurrency"),
    ("os.exec*", "concurrency"), ("os.spawn*", "concurrency"), ("os.register_at_fork", "concurrency"),
    ("socket", "io_escape"), ("urllib", "io_escape"), ("urllib3", "io_escape"), ("requests", "io_escape"),
    ("http", "io_escape"), ("httpx", "io_escape"), ("aiohttp", "io_escape"), ("ftplib", "io_escape"),
    ("smtplib", "io_escape"), ("telnetlib", "io_escape"), ("paramiko", "io_escape"),
    ("websocket", "io_escape"), ("websockets", "io_escape"), ("signal", "io_escape"),
    ("psutil", "io_escape"), ("resource", "io_escape"),
    ("os.kill", "io_escape"), ("os.killpg", "io_escape"), ("os.chdir", "io_escape"),
    ("os.fchdir", "io_escape"), ("os.chroot", "io_escape"), ("os.putenv", "io_escape"),
    ("os.unsetenv", "io_escape"), ("os.setsid", "io_escape"), ("os.setpgid", "io_escape"),
    ("os.setpgrp", "io_escape"), ("os.nice", "io_escape"), ("os.setpriority", "io_escape"),
    ("os.sched_setaffinity", "io_escape"), ("os.getppid", "io_escape"),
    ("os.write", "io_escape"), ("os.writev", "io_escape"), ("os.pwrite", "io_escape"), ("os.pwritev", "io_escape"),
    ("os.sendfile", "io_escape"), ("os.dup", "io_escape"), ("os.dup2", "io_escape"), ("os.fdopen", "io_escape"),
    ("importlib.reload", "harness_patch"), ("imp.reload", "harness_patch"),
    ("unittest.mock", "harness_patch"), ("mock", "harness_patch"), ("pytest", "harness_patch"),
    ("kb_gym", "harness_patch"), ("site", "harness_patch"),
    ("marshal.loads", "dynamic_code"), ("types.FunctionType", "dynamic_code"),
    ("types.CodeType", "dynamic_code"), ("pickle.loads", "dynamic_code"),
    ("torch.compile", "pytorch_compiler"), ("torch._dynamo.optimize", "pytorch_compiler"),
    ("torch._inductor.compile*", "pytorch_compiler"), ("torch._inductor.aot_compile", "pytorch_compiler"),
    ("torch.jit.script", "pytorch_compiler"),
    ("torch.jit.trace", "pytorch_compiler"), ("torch.export", "pytorch_compiler"),
    # library functions that import, evaluate or read a frame for their caller (round 21): a string or a depth in,
    # a module, a value or a frame out, with no import or eval in the candidate's own code
    ("torch._utils._import_dotted_name", "introspection"), ("torch.package", "introspection"),
    ("torch._jit_internal", "introspection"), ("torch.fx.graph_module._exec_with_source", "dynamic_code"),
    ("torch.fx.graph_module._forward_from_src", "dynamic_code"),
    ("torch.fx.graph_module._method_from_src", "dynamic_code"), ("typing.get_type_hints", "dynamic_code"),
    ("typing.ForwardRef", "dynamic_code"), ("typing._eval_type", "dynamic_code"),
    ("inspect.get_annotations", "dynamic_code"), ("importlib.import_module", "harness_patch"),
    ("typing_extensions.get_type_hints", "dynamic_code"), ("typing_extensions.get_annotations", "dynamic_code"),
    ("typing_extensions.evaluate_forward_ref", "dynamic_code"), ("typing_extensions.ForwardRef", "dynamic_code"),
    # unpickling runs what the bytes name (round 23: a pickle built at run time calling builtins.eval), and a kernel
    # loads no file: its answer comes from its inputs
    ("torch.load", "dynamic_code"), ("torch.serialization.load", "dynamic_code"),
    ("torch.serialization._load", "dynamic_code"),
    ("torch.storage._load_from_bytes", "dynamic_code"), ("numpy.load", "dynamic_code"),
    ("numpy.lib.npyio", "dynamic_code"), ("numpy.lib.format", "dynamic_code"), ("numpy.f2py", "introspection"),
)
# Builtins that evaluate text or read and write by a name: judged where they are called (checks.check_call), and
# ``dynamic_code`` wherever they are used as a value instead (round 22: ``next(map(eval, [s]))``, ``functools.reduce(
# getattr, [n], f)``, ``dict(e=eval)["e"](s)`` on a string built at run time: no call of them to judge)
EVALUATING_BUILTINS = frozenset({"eval", "exec", "compile", "getattr", "setattr", "delattr", "vars", "globals",
                                 "locals", "__import__", "breakpoint"})
# Allowed standard modules whose private names (``dataclasses._create_fn``: an ``exec`` of lines it is given;
# ``typing._eval_type``) no kernel needs: ``dynamic_code`` (round 22)
PRIVATE_DENIED = frozenset({"functools", "itertools", "collections", "typing", "typing_extensions", "dataclasses",
                            "enum", "abc", "warnings", "textwrap", "os", "math", "cmath", "numbers"})
# Names a class body may not define: positional class patterns read the attributes ``__match_args__`` names, and an
# ``__instancecheck__`` makes any subject match (round 21: ``case _C(G)`` read a function's ``__globals__``)
CLASS_NAMES_DENIED = frozenset({"__match_args__", "__instancecheck__", "__subclasscheck__"})
# Standard modules whose use the rules above restrict, as attributes of another module.
# (Not ``signal``, ``types`` or ``random``: torch has submodules of those names.)
REACHABLE_STDLIB = frozenset({
    "sys", "gc", "inspect", "ctypes", "builtins", "importlib", "os", "subprocess", "threading", "socket",
    "marshal", "pickle", "traceback", "time", "multiprocessing", "weakref", "operator", "io", "pathlib",
    "shutil", "tempfile", "atexit", "copyreg", "faulthandler", "tracemalloc", "_thread", "asyncio", "mmap",
    "posix", "_pickle", "linecache",
})
REF_EXACT: dict[str, str] = {}
REF_PREFIX: list[tuple[str, str]] = []
for _name, _flag in REF_RULES:
    if _name.endswith("*"):
        REF_PREFIX.append((_name[:-1], _flag))
    else:
        REF_EXACT.setdefault(_name, _flag)

# Attributes of frames, tracebacks, generators, coroutines, code objects and cells: no kernel reads them.
FRAME_ATTRS = frozenset({
    "f_back", "f_locals", "f_globals", "f_builtins", "f_code", "f_trace", "f_lasti", "f_lineno",
    "tb_frame", "tb_next", "tb_lasti", "tb_lineno", "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code",
    "cr_await", "ag_frame", "ag_code", "ag_await", "co_code", "co_consts", "co_names", "co_varnames",
    "co_freevars", "co_cellvars", "co_filename", "cell_contents",
})
ATTR_RULES: dict[str, str] = {
    **dict.fromkeys(FRAME_ATTRS, "introspection"),
    "__globals__": "introspection", "__subclasses__": "introspection",
    "__torch_function__": "tensor_subclass", "__torch_dispatch__": "tensor_subclass",
    "_make_subclass": "tensor_subclass", "_make_wrapper_subclass": "tensor_subclass",
    "py_impl": "tensor_subclass",
    # a Triton JIT function's captured scope: its module's globals, `builtins` and `inspect` among them (round 23)
    "get_capture_scope": "introspection",
    # modules that libraries keep as attributes of their objects, reached off a call's result (round 23:
    # `tl.sigmoid.get_capture_scope()["core"].builtins.eval`); no kernel reads these names off anything
    **dict.fromkeys(("builtins", "bltns", "_sys", "importlib"), "introspection"),
    # the dispatcher's modes, turned off or read: the dataflow trace (worker/dataflow.py) is one (round 15)
    **dict.fromkeys(("_DisableTorchDispatch", "_disable_current_modes", "_get_current_dispatch_mode",
                     "_get_current_dispatch_mode_stack", "_pop_mode", "_pop_mode_temporarily", "_push_mode",
                     "_len_torch_dispatch_stack", "_get_dispatch_stack_at", "_pop_torch_dispatch_stack",
                     "_push_on_torch_dispatch_stack", "_unset_dispatch_mode", "_set_dispatch_mode",
                     "_get_dispatch_mode", "_python_dispatch", "_ExcludeDispatchKeyGuard",
                     "_DisablePythonDispatcher", "_disabled_torch_dispatch_impl"), "tensor_subclass"),
    "__builtins__": "harness_patch",
}
# Dunder attributes kernel code may touch: the data model's methods (``super().__init__()``, operators,
# containers, context managers), metadata reads (``__name__``, ``__version__``, ``__file__``, reading
# ``__class__``; assigning it stays ``tensor_subclass``) and the array-exchange protocols. Any other dunder
# (``__dict__``, ``__code__``, ``__closure__``, ``__mro__``, ``__bases__``, ``__self__``, ``__wrapped__``,
# ``__getattribute__``, ``__import__``, ``__loader__``, ``__spec__``, ``__reduce__``, ...) is ``introspection``.
_OPERATORS = ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "divmod", "pow", "lshift", "rshift",
              "and", "xor", "or")
DUNDER_OK = frozenset({
    "__init__", "__new__", "__call__", "__post_init__", "__repr__", "__str__", "__format__", "__hash__",
    "__bool__", "__len__", "__iter__", "__next__", "__reversed__", "__contains__", "__getitem__", "__setitem__",
    "__delitem__", "__missing__", "__enter__", "__exit__", "__aenter__", "__aexit__", "__eq__", "__ne__",
    "__lt__", "__le__", "__gt__", "__ge__", "__neg__", "__pos__", "__abs__", "__invert__", "__int__", "__float__",
    "__complex__", "__index__", "__round__", "__trunc__", "__floor__", "__ceil__", "__copy__", "__deepcopy__",
    "__setattr__", "__delattr__",  # on modules and classes these are harness_patch by the store rules
    *(f"__{op}__" for op in _OPERATORS), *(f"__r{op}__" for op in _OPERATORS),
    *(f"__i{op}__" for op in _OPERATORS),
    "__name__", "__qualname__", "__doc__", "__module__", "__version__", "__file__", "__path__", "__package__",
    "__all__", "__slots__", "__annotations__", "__class__",
    "__array__", "__array_interface__", "__cuda_array_interface__", "__dlpack__", "__dlpack_device__",
})
# Names that are introspection wherever a string spells them (dotted parts count: ``"f_back.f_globals"``).
DANGEROUS_NAMES = FRAME_ATTRS | frozenset({
    "__globals__", "__code__", "__closure__", "__subclasses__", "__mro__", "__bases__", "__base__", "__dict__",
    "__getattribute__", "__import__", "__builtins__", "__loader__", "__spec__", "__self__", "__func__",
    "__wrapped__", "__reduce__", "__reduce_ex__", "__defaults__", "__kwdefaults__", "__traceback__",
    "__objclass__", "__getattr__",
})
# Attribute getters whose string arguments name attributes (dotted for attrgetter).
ATTR_GETTERS = frozenset({"operator.attrgetter", "operator.methodcaller", "operator.itemgetter"})
# Builtins that may take a module object as an argument without it escaping the checks.
MODULE_ARG_OK = frozenset({
    "getattr", "hasattr", "setattr", "delattr", "vars", "dir", "isinstance", "issubclass", "id", "type", "print",
    "repr", "str", "callable", "__import__",
})
# Module objects the checks know by name besides imported and known ones (``[torch.nn][0]``).
KNOWN_SUBMODULES = frozenset({
    "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.cuda", "torch.library", "torch._C", "torch.utils",
    "torch.utils.cpp_extension", "torch.ops", "torch.backends", "torch.testing", "torch.fx", "torch.jit",
    "torch.autograd", "torch._dynamo", "torch._inductor", "torch._utils", "torch.overrides", "torch.linalg",
    "torch.fft", "torch.special", "torch.distributed", "torch.multiprocessing", "triton.language",
    "triton.testing", "triton.runtime", "triton.compiler", "os.path", "numpy.linalg", "numpy.random",
    "numpy.ctypeslib",
})

TIMER_PREFIXES = (
    "time", "timeit", "torch.cuda.Event", "torch.cuda.event", "torch.cuda.synchronize", "torch.cuda.Stream",
    "torch.cuda.streams", "torch.cuda.current_stream", "torch.cuda.default_stream", "torch.Event",
    "torch.cuda.elapsed_time", "torch.synchronize", "triton.testing", "torch.utils.benchmark",
    "torch._C._cuda_synchronize",
)
PRECISION_PREFIXES = ("torch.backends", "torch._dynamo.config", "torch._inductor.config")
PRECISION_CALLS = frozenset({
    "torch.set_float32_matmul_precision", "torch.set_default_dtype", "torch.set_default_tensor_type",
    "torch.set_flush_denormal", "torch.set_num_threads", "torch.set_num_interop_threads",
    "torch.use_deterministic_algorithms", "torch.set_default_device",
})
TENSOR_BASES = frozenset({
    "torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase", "torch.nn.Parameter",
    "torch.nn.parameter.Parameter", "torch.nn.Buffer", "torch.nn.parameter.Buffer",
    "torch.nn.parameter.UninitializedParameter", "torch.utils._python_dispatch.TorchDispatchMode",
    "torch.overrides.TorchFunctionMode", "torch.overrides.BaseTorchFunctionMode",
})
KERNEL_DECORATORS = frozenset({
    "triton.jit", "triton.autotune", "triton.heuristics", "triton.language.jit", "triton.runtime.jit.jit",
    "triton.runtime.autotune", "triton.runtime.autotuner.autotune", "numba.cuda.jit",
})
EXT_LOADERS = frozenset({
    "torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load",
})
RAW_KERNELS = frozenset({
    "cupy.RawKernel", "cupy.ElementwiseKernel", "cupy.ReductionKernel", "cupy.RawModule",
})
CACHE_DECORATORS = frozenset({"functools.lru_cache", "functools.cache"})

OPEN_CALLS = frozenset({"open", "builtins.open", "io.open", "codecs.open", "os.open", "os.fdopen"})
PATH_CALLS = frozenset({
    "os.remove", "os.unlink", "os.rmdir", "os.removedirs", "os.rename", "os.renames", "os.replace",
    "os.truncate", "os.chmod", "os.chown", "os.lchown", "os.symlink", "os.link", "os.utime", "os.mkfifo",
    "shutil.rmtree", "shutil.move", "shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree",
    "shutil.copymode", "shutil.copystat", "shutil.chown",
    "torch.save", "torch.load", "numpy.save", "numpy.savez", "numpy.savez_compressed", "numpy.load",
    "numpy.savetxt", "numpy.loadtxt", "numpy.fromfile", "numpy.memmap",
})
PATH_METHODS = frozenset({
    "write_text", "write_bytes", "unlink", "rmdir", "rename", "replace", "touch", "chmod", "symlink_to",
    "hardlink_to", "open",
})
PATH_CTORS = frozenset({"pathlib.Path", "pathlib.PurePath", "pathlib.PosixPath", "os.path.join",
                         "os.path.expanduser", "os.path.abspath", "os.path.realpath", "os.path.normpath"})
MUTATORS = frozenset({"update", "setdefault", "__setitem__", "__delitem__", "pop", "popitem", "clear",
                       "append", "extend", "insert", "add", "appendleft", "remove"})

# Calls into torch that build or describe tensors without computing the operator (not a fallback).
TORCH_NONCOMPUTE_EXACT = frozenset({
    "torch.empty", "torch.empty_like", "torch.empty_strided", "torch.zeros", "torch.zeros_like", "torch.ones",
    "torch.ones_like", "torch.full", "torch.full_like", "torch.tensor", "torch.as_tensor", "torch.from_numpy",
    "torch.arange", "torch.device", "torch.Size", "torch.is_tensor", "torch.is_floating_point", "torch.numel",
    "torch.finfo", "torch.iinfo", "torch.get_default_dtype", "torch.no_grad", "torch.inference_mode",
    "torch.enable_grad", "torch.set_grad_enabled", "torch.is_grad_enabled", "torch.manual_seed",
    "torch.Generator", "torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.nn.Module",
    "torch.autograd.Function", "torch.get_device", "torch.is_complex",
})
TORCH_NONCOMPUTE_PREFIX = ("torch.cuda.", "torch.utils.", "torch.library.", "torch.backends.", "torch.version",
                            "torch.jit.", "torch.testing.", "torch._dynamo.", "torch.nn.init.")
# Tensor methods that compute (x.relu(), x.sum(), ...); layout and dtype methods are left out.
TENSOR_OPS = frozenset({
    "abs", "abs_", "acos", "add", "add_", "addcmul", "addcdiv", "addmm", "addmv", "amax", "amin", "argmax",
    "argmin", "asin", "atan", "atan2", "baddbmm", "bmm", "ceil", "clamp", "clamp_", "clamp_min", "clamp_max",
    "clip", "cos", "cosh", "cross", "cumprod", "cumsum", "div", "div_", "dot", "erf", "exp", "exp_", "expm1",
    "floor", "gather", "gelu", "hardtanh", "index_add", "index_select", "kron", "leaky_relu", "lerp", "log",
    "log1p", "log2", "log_softmax", "logsumexp", "masked_fill", "matmul", "max", "maximum", "mean", "min",
    "minimum", "mish", "mm", "mul", "mul_", "mv", "neg", "norm", "outer", "pow", "prod", "reciprocal", "relu",
    "relu_", "round", "rsqrt", "scatter", "scatter_add", "sigmoid", "sigmoid_", "sign", "silu", "sin", "sinh",
    "softmax", "softplus", "sort", "sqrt", "square", "std", "sub", "sub_", "sum", "tanh", "tanh_", "topk",
    "tril", "triu", "var", "conv1d", "conv2d", "conv3d", "linear", "layer_norm", "batch_norm", "einsum",
})
PASSTHROUGH = frozenset({
    "clone", "detach", "to", "view", "view_as", "reshape", "reshape_as", "contiguous", "cuda", "cpu", "float",
    "half", "bfloat16", "double", "get", "setdefault", "pop", "copy", "expand", "expand_as", "squeeze",
    "unsqueeze", "flatten", "t", "__getitem__", "requires_grad_", "type_as",
})
# Names that say "the kernel is available" in a condition: HAS_TRITON, cuda_ok, use_custom_kernel, ext_loaded...
AVAIL_STRONG = frozenset({"triton", "cuda", "compiled", "available", "availability", "avail", "fallback",
                           "supported", "extension"})
AVAIL_VERBS = frozenset({"has", "use", "ok", "loaded", "built", "enabled", "can", "have"})
AVAIL_NOUNS = frozenset({"kernel", "kernels", "ext", "custom", "triton", "cuda", "fast", "fused", "native", "jit"})
SIZE_WORDS = frozenset({"size", "sizes", "shape", "dim", "dims", "stride", "padding", "dilation", "groups",
                         "channels", "features", "len", "numel", "block"})
AVAIL_CALLS = frozenset({"torch.cuda.is_available", "torch.cuda.device_count", "torch.cuda.is_initialized"})
