"""What a dotted name is, by the object it names in this process, not by how it is spelled.

Modules keep what they import under names of their own: ``collections._sys`` is ``sys``, ``enum.bltns`` is
``builtins``, ``torch._dynamo.guards.currentframe`` is ``inspect.currentframe``, ``torch.xpu.cast`` is
``ctypes.cast``. The rules on names (names.py) read spellings, so each of these reached what its module is denied
with no finding (round 20: the runner's ``timed_call`` reached through ``collections._sys.modules`` under
``strict``, 53-90x for a 0.03x kernel). Here a name is resolved attribute by attribute from the module it starts
at, and each module, function or class met on the way is named as its home names it (a module's ``__name__``, a
function's or class's ``__module__`` and ``__qualname__``), for the same rules to judge.

Only modules under the allowlist's roots are imported to resolve a name (a submodule the candidate names, or one
its package loads lazily): library code, imported once per process, in the caller's process, so never an entry
point, a tool or a test suite (``_NOT_IMPORTED``: those are read only where something loaded them already).
Attributes of anything but a module are read with ``inspect.getattr_static``, so no property or ``__getattr__``
runs. A name that cannot be resolved so is judged by its spelling alone, as before.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from functools import lru_cache
from typing import Any

from kb_gym.integrity.names import ALLOWED_MODULES

# Modules and C modules whose names are another's public one (``os.getpid.__module__`` is ``posix``, ``os.path`` is
# ``posixpath``)
_PUBLIC_HOME = {"posix": "os", "nt": "os", "_operator": "operator", "_signal": "signal", "_socket": "socket",
                "_io": "io", "_weakref": "weakref", "_ctypes": "ctypes", "_pickle": "pickle",
                "_functools": "functools", "_collections": "collections", "_abc": "abc", "_warnings": "warnings",
                "posixpath": "os.path", "ntpath": "os.path", "genericpath": "os.path",
                "_collections_abc": "collections.abc",
                "_bisect": "bisect", "_heapq": "heapq", "_random": "random", "_struct": "struct", "_string": "string",
                "_weakrefset": "weakref", "_typing": "typing", "_contextvars": "contextvars", "_enum": "enum"}
_MISSING = object()
# Submodules never imported here, only read where loaded already: the checker runs in the caller's (trusted) process,
# and these are the parts of a library that act when imported (entry points, tools, test suites)
_NOT_IMPORTED = frozenset({"__main__", "main", "cli", "run", "tests", "test", "tools", "bottleneck", "benchmarks",
                           "setup", "conftest"})
_NAMED = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType,
          types.WrapperDescriptorType, types.ClassMethodDescriptorType, type)


def _public(module: str) -> str:
    root, _, rest = module.partition(".")
    return _PUBLIC_HOME.get(root, root) + (f".{rest}" if rest else "")


def home_name(obj: Any) -> str | None:
    """The name ``obj`` goes by where it is defined: a module's ``__name__``; a function's or class's module and
    qualified name (C modules' functions under their public module's name); None for anything else (an instance)."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if not isinstance(obj, _NAMED):
        return None
    if isinstance(obj, types.ModuleType):
        name = getattr(obj, "__name__", None)
        if not isinstance(name, str):
            return None
        return _public(name)
    module = getattr(obj, "__module__", None)
    if module is None and isinstance(obj, (types.MethodDescriptorType, types.WrapperDescriptorType,
                                           types.ClassMethodDescriptorType)):
        module = getattr(obj.__objclass__, "__module__", None)
        qualname = f"{obj.__objclass__.__qualname__}.{obj.__name__}"
    else:
        qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    return f"{_public(module)}.{qualname}"


def _importable(module_name: str) -> Any:
    """The module, imported where its root is on the allowlist; else what is loaded already, or _MISSING."""
    loaded = sys.modules.get(module_name)
    if loaded is not None:
        return loaded
    parts = module_name.split(".")
    if parts[0] not in ALLOWED_MODULES or _NOT_IMPORTED & set(parts):
        return _MISSING
    try:
        return importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - no such module, or one that fails to import here: unresolved
        return _MISSING


def _attribute(obj: Any, attr: str) -> Any:
    if isinstance(obj, types.ModuleType):
        value = vars(obj).get(attr, _MISSING)
        if value is _MISSING and isinstance(getattr(obj, "__name__", None), str):
            value = _importable(f"{obj.__name__}.{attr}")  # a submodule, loaded or loaded lazily by its package
        return value
    try:
        return inspect.getattr_static(obj, attr)
    except AttributeError:
        return _MISSING


@lru_cache(maxsize=4096)
def resolve(dotted: str) -> tuple[str | None, ...]:
    """For each prefix of ``dotted`` past its first part, the home name of the object it names (None where that is
    no module, function or class, or the name could not be followed that far)."""
    parts = dotted.split(".")
    obj = _importable(parts[0])
    names: list[str | None] = []
    for attr in parts[1:]:
        obj = _MISSING if obj is _MISSING else _attribute(obj, attr)
        names.append(None if obj is _MISSING else home_name(obj))
    return tuple(names)
