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
_WATCHED_EXACT = ("torch", "builtins", "math", "time", "json", "os", "select", "operator", "functools")
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


def _entry(value: Any) -> tuple[int, ...]:
    if isinstance(value, types.FunctionType):
        return id(value), id(value.__code__), id(value.__defaults__), id(value.__kwdefaults__)
    return (id(value),)


def _snapshot(namespace: Any, strict: bool) -> dict[str, tuple[int, ...]]:
    return {key: _entry(value) for key, value in list(namespace.items())
            if strict or isinstance(value, _CALLABLE_KINDS) or _is_hook_registry(key, value)}


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
        self._base: list[dict[str, tuple[int, ...]]] = []
        self._registries: dict[tuple[int, str], tuple[int, ...]] = {}
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
        self._base = [_snapshot(ns, strict) for _, ns, strict in self._spaces]
        self._registries = {(i, key): _registry_entry(value) for i, (_, ns, _) in enumerate(self._spaces)
                            for key, value in list(ns.items()) if _is_hook_registry(key, value)}
        self._state = _interpreter_state()
        self._functions = [v for _, ns, _ in self._spaces for v in list(ns.values())
                           if isinstance(v, types.FunctionType)]
        self._kept = [self._objects()]
        self._quick = self._quick_state()

    def new_threads(self) -> list[str]:
        """Threads started since the reference point that still run: they would go on into later jobs."""
        return sorted(t.name for t in threading.enumerate() if t not in self._threads and t.is_alive())

    def release(self) -> None:
        """Let go of the job's tensors (the reference's parameters) once the job is done."""
        self._tensors, self._tensor_prints = [], []

    def _objects(self) -> tuple[Any, ...]:
        values = tuple(tuple(ns.values()) for _, ns, _ in self._spaces)
        hooks = tuple(tuple(v.values()) for _, ns, _ in self._spaces for k, v in list(ns.items())
                      if _is_hook_registry(k, v))
        functions = tuple((f.__code__, f.__defaults__, f.__kwdefaults__) for f in self._functions)
        return values, hooks, functions

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
        if quick == self._quick and not self._registries_changed():
            return []
        found = self._compare(limit)
        if not found:  # only harmless changes (caches, lazy imports): not worth a full pass again
            self._kept = [self._kept[0], self._objects()]  # the base's objects, and those of this state
            self._quick = quick
        return found

    def _registries_changed(self) -> bool:
        return any(_registry_entry(self._spaces[i][1].get(key, {})) != entry
                   for (i, key), entry in self._registries.items())

    def _compare(self, limit: int) -> list[str]:
        found: list[str] = []
        for i, ((label, ns, strict), base) in enumerate(zip(self._spaces, self._base, strict=True)):
            now = _snapshot(ns, strict)
            if now != base:
                for key in sorted(set(base) | set(now), key=str):
                    before, after = base.get(key), now.get(key)
                    if before == after:
                        continue
                    added = before is None
                    if added and not strict and isinstance(ns.get(key), types.ModuleType):
                        continue  # a submodule imported for the first time (torch binds lazily)
                    found.append(f"{label}.{key} ({'added' if added else 'removed' if after is None else 'replaced'})")
            for key, value in list(ns.items()):
                registry = self._registries.get((i, key))
                if registry is not None and isinstance(value, dict) and _registry_entry(value) != registry:
                    found.append(f"{label}.{key} (hooks registered)")
            if len(found) >= limit:
                return found[:limit]
        state = _interpreter_state()
        if state != self._state:
            names = ("sys.settrace", "sys.setprofile", "torch function mode", "torch dispatch mode")
            found += [f"{n} (set)" for n, a, b in zip(names, self._state, state, strict=True) if a is not b and a != b]
        return found[:limit]
