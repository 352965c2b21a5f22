"""Fingerprints of what the check and the reference rely on, compared while a candidate runs.

The candidate runs in the worker's process, so it can reach the harness's modules and torch's
namespaces (``sys.modules`` is one attribute away from almost any module). Whatever path it takes,
a patch has to change one of them: a function rebound in a module or class, a function's code, a
name added that shadows a builtin, a global forward hook, a dispatch mode left on the stack. The
guard records those at the start of a job and compares before every reference call, so that a
patch that restores itself after fooling the reference is caught too.

Caches and flags that torch keeps in module globals (numbers, ``None``, containers) change in
normal use and are not compared, except in kb_gym's own modules, where nothing may change.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterable
from operator import attrgetter
from typing import Any

import torch

# Namespaces the reference and the check run through. Modules loaded later (by a candidate) are not
# the harness's and are not watched.
_WATCHED_PREFIXES = (
    "kb_gym", "torch.nn", "torch.functional", "torch._tensor", "torch.linalg", "torch.special", "torch.fft",
    "torch.cuda", "torch.autograd", "torch.backends", "torch.testing", "torch.utils.cpp_extension",
)
_WATCHED_EXACT = ("torch", "builtins", "math", "time", "json", "os", "select", "operator", "functools", "random")
_CODE, _DEFAULTS, _KWDEFAULTS = (attrgetter(a) for a in ("__code__", "__defaults__", "__kwdefaults__"))
_CALLABLE_KINDS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, property, staticmethod,
                   classmethod, types.MethodDescriptorType, types.WrapperDescriptorType, types.ModuleType)


def _watched_modules() -> list[types.ModuleType]:
    return [m for name, m in list(sys.modules.items()) if isinstance(m, types.ModuleType)
            and (name in _WATCHED_EXACT or name.startswith(_WATCHED_PREFIXES))]


def _namespaces(modules: list[types.ModuleType]) -> list[tuple[str, Any, bool]]:
    """(label, namespace mapping, strict) for each module and each class it defines; strict
    namespaces (kb_gym's, the reference's) compare every value, the others callables only."""
    out: list[tuple[str, Any, bool]] = []
    for module in modules:
        name = module.__name__
        strict = name.startswith("kb_gym") or name.startswith("kb_reference_")
        out.append((name, vars(module), strict))
        for key, value in list(vars(module).items()):
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                out.append((f"{name}.{key}", value.__dict__, strict))
    out.append(("torch.Tensor", torch.Tensor.__dict__, False))
    return out


def _snapshot(items: Iterable[tuple[Any, Any]], strict: bool,
              code: dict[int, tuple[Any, Any, Any]] | None = None) -> dict[str, tuple[int, ...]]:
    """The compared entries of a namespace: the id of each value, and of a function's code and defaults
    (taken from ``code`` when given: those recorded at the reference point)."""
    out: dict[str, tuple[int, ...]] = {}
    for key, value in items:
        if strict or isinstance(value, _CALLABLE_KINDS) or _is_hook_registry(key, value):
            if isinstance(value, types.FunctionType):
                parts = code[id(value)] if code is not None else (value.__code__, value.__defaults__,
                                                                   value.__kwdefaults__)
                out[key] = (id(value), *map(id, parts))
            else:
                out[key] = (id(value),)
    return out


def _is_hook_registry(key: Any, value: Any) -> bool:
    return isinstance(key, str) and key.startswith("_global_") and isinstance(value, dict)


def _registry_entry(value: dict) -> tuple[int, ...]:
    return tuple(id(v) for v in value.values())


def _tensor_prints(tensors: list[torch.Tensor]) -> list[tuple[float, ...]]:
    """Where each tensor lives, its sum and its norm: one transfer for all of them."""
    if not tensors:
        return []
    with torch.no_grad():
        stats = torch.stack([torch.stack([t.detach().sum(dtype=torch.float64),
                                          torch.linalg.vector_norm(t.detach()).double()]) for t in tensors])
    values = stats.cpu().tolist()
    return [(float(t.data_ptr()), *v) for t, v in zip(tensors, values, strict=True)]


def _interpreter_state() -> tuple[Any, ...]:
    """Trace and profile functions and torch's function/dispatch mode stacks: each reroutes every call."""
    c = torch._C
    function_modes = c._len_torch_function_stack() if hasattr(c, "_len_torch_function_stack") else 0
    dispatch_modes = c._len_torch_dispatch_stack() if hasattr(c, "_len_torch_dispatch_stack") else 0
    return sys.gettrace(), sys.getprofile(), function_modes, dispatch_modes


class HarnessGuard:
    """Records the watched namespaces (``rebase``) and says what changed since (``changes``)."""

    def __init__(self) -> None:
        self._spaces: list[tuple[str, Any, bool]] = []
        self._registry_keys: list[tuple[int, str]] = []  # (namespace index, name) of torch's global hook dicts
        self._registries: list[tuple[int, ...]] = []
        self._state: tuple[Any, ...] = ()
        self._quick: tuple[Any, ...] = ()
        self._functions: list[types.FunctionType] = []
        self._tensors: list[torch.Tensor] = []
        self._tensor_prints: list[tuple[float, ...]] = []
        self._threads: set[threading.Thread] = set()
        # Every object whose id is on record stays referenced here: a freed object's address could
        # otherwise be reused by a replacement, which would then carry the original's id.
        self._kept: list[Any] = []
        self.rebase()

    def rebase(self, *extra_modules: types.ModuleType, tensors: Iterable[torch.Tensor] = ()) -> None:
        """Take the current state as the reference point: at the start of a job, once the reference
        (a trusted module, passed here to be watched too) is loaded and before any candidate code.
        ``tensors`` (the reference model's parameters) are watched by value: an in-place edit through
        ``.data`` leaves their version counters alone."""
        self._tensors = list(tensors)
        self._tensor_prints = _tensor_prints(self._tensors)
        self._threads = set(threading.enumerate())
        self._spaces = _namespaces([*_watched_modules(), *extra_modules])
        self._registry_keys = [(i, key) for i, (_, ns, _) in enumerate(self._spaces)
                               for key in [k for k in ns if isinstance(k, str) and k.startswith("_global_")]
                               if _is_hook_registry(key, ns.get(key))]
        self._registries = self._registry_state()
        self._state = _interpreter_state()
        self._functions = [v for _, ns, _ in self._spaces for v in list(ns.values())
                           if isinstance(v, types.FunctionType)]
        # The detailed comparison is built from these objects only when the quick one differs.
        self._kept = [self._objects()]
        self._quick = self._quick_state()

    def new_threads(self) -> list[str]:
        """Threads started since the reference point that still run: they would go on into later jobs."""
        return sorted(t.name for t in threading.enumerate() if t not in self._threads and t.is_alive())

    def release(self) -> None:
        """Let go of the job's tensors (the reference's parameters) once the job is done."""
        self._tensors, self._tensor_prints = [], []

    def _objects(self) -> tuple[Any, ...]:
        keys = tuple(tuple(ns) for _, ns, _ in self._spaces)
        values = tuple(tuple(ns.values()) for _, ns, _ in self._spaces)
        hooks = tuple(tuple(self._spaces[i][1].get(key, {}).values()) for i, key in self._registry_keys)
        functions = tuple(tuple(map(get, self._functions)) for get in (_CODE, _DEFAULTS, _KWDEFAULTS))
        return keys, values, hooks, functions

    def _registry_state(self) -> list[tuple[int, ...]]:
        return [_registry_entry(self._spaces[i][1].get(key, {})) for i, key in self._registry_keys]

    def _quick_state(self) -> tuple[Any, ...]:
        # Every value's identity and every watched function's code: one C-speed pass (~2 ms). When it
        # matches, nothing changed; when not, the full comparison decides whether the change matters.
        values = tuple(tuple(map(id, ns.values())) for _, ns, _ in self._spaces)
        code = tuple(map(id, map(_CODE, self._functions)))
        defaults = tuple(map(id, map(_DEFAULTS, self._functions)))
        kwdefaults = tuple(map(id, map(_KWDEFAULTS, self._functions)))
        return values, code, defaults, kwdefaults, _interpreter_state()

    def changes(self, limit: int = 5) -> list[str]:
        """What differs from the reference point, as ``namespace.name`` strings (at most ``limit``)."""
        edited = [i for i, (a, b) in enumerate(zip(_tensor_prints(self._tensors), self._tensor_prints, strict=True))
                  if a != b]
        if edited:
            return [f"the reference's parameter {i} (edited in place)" for i in edited[:limit]]
        quick = self._quick_state()
        if quick == self._quick and self._registry_state() == self._registries:
            return []
        found = self._compare(limit)
        if not found:  # only harmless changes (caches, lazy imports): not worth a full pass again
            self._kept = [self._kept[0], self._objects()]  # the base's objects, and those of this state
            self._quick = quick
        return found

    def _compare(self, limit: int) -> list[str]:
        found: list[str] = []
        base_keys, base_values, _, base_code = self._kept[0]
        code = {id(f): parts for f, parts in zip(self._functions, zip(*base_code, strict=True), strict=True)}
        hooks_now = dict(zip(self._registry_keys, self._registry_state(), strict=True))
        hooks_base = dict(zip(self._registry_keys, self._registries, strict=True))
        for i, (label, ns, strict) in enumerate(self._spaces):
            base = _snapshot(zip(base_keys[i], base_values[i], strict=True), strict, code)
            now = _snapshot(list(ns.items()), strict)
            if now != base:
                for key in sorted(set(base) | set(now), key=str):
                    before, after = base.get(key), now.get(key)
                    if before == after:
                        continue
                    added = before is None
                    if added and not strict and isinstance(ns.get(key), types.ModuleType):
                        continue  # a submodule imported for the first time (torch binds lazily)
                    found.append(f"{label}.{key} ({'added' if added else 'removed' if after is None else 'replaced'})")
            found += [f"{label}.{key} (hooks registered)" for (j, key), entry in hooks_now.items()
                      if j == i and entry != hooks_base[(j, key)]]
            if len(found) >= limit:
                return found[:limit]
        state = _interpreter_state()
        if state != self._state:
            names = ("sys.settrace", "sys.setprofile", "torch function mode", "torch dispatch mode")
            found += [f"{n} (set)" for n, a, b in zip(names, self._state, state, strict=True) if a is not b and a != b]
        return found[:limit]
