"""Checks on what a candidate does to the process's shared state through calls: the environment,
``sys.modules`` / ``sys.path``, module namespaces changed in place, and files at absolute paths."""

from __future__ import annotations

import ast

from kb_gym.integrity.analyzer import _Analyzer
from kb_gym.integrity.astutil import const_str, is_builtin, short
from kb_gym.integrity.names import (
    ENV_ALLOW,
    PATH_CTORS,
    PATH_METHODS,
    PRECISION_PREFIXES,
    TIMER_PREFIXES,
)


class _StateChecks:
    """Stores into modules (harness, timer or precision), environment and ``sys`` changes, file writes."""

    def __init__(self, an: _Analyzer):
        self.an = an

    def module_store(self, q: str, line: int, verb: str) -> None:
        if any(q == p or q.startswith(p + ".") for p in TIMER_PREFIXES):
            self.an.add("timer_patch", line, f"{verb} `{q}`")
        elif any(q == p or q.startswith(p + ".") for p in PRECISION_PREFIXES):
            self.an.add("precision_change", line, f"sets `{q}`")
        else:
            self.an.add("harness_patch", line, f"{verb} `{q}`")

    def check_mutator(self, node: ast.Call, func: ast.Attribute) -> None:
        an = self.an
        line = node.lineno
        target = func.value
        vq = an.qual(target)
        if vq == "sys.modules":
            an.add("harness_patch", line, f"changes `sys.modules` with `.{func.attr}()`")
        elif vq in ("sys.path", "sys.meta_path", "sys.path_hooks"):
            an.add("harness_patch", line, f"changes `{vq}` with `.{func.attr}()`")
        elif vq == "os.environ":
            keys: list[str | None] = []
            if func.attr in ("update",):
                for a in node.args:
                    if isinstance(a, ast.Dict):
                        keys.extend(const_str(k) for k in a.keys)
                    else:
                        keys.append(None)
                keys.extend(k.arg for k in node.keywords)
            elif func.attr in ("setdefault", "pop", "__setitem__", "__delitem__"):
                keys.append(const_str(node.args[0]) if node.args else None)
            else:
                keys.append(None)
            if any(k not in ENV_ALLOW for k in keys):
                an.add("io_escape", line, f"changes the environment with `os.environ.{func.attr}()`")
        elif isinstance(target, ast.Attribute) and target.attr == "__dict__" and an.qual(target.value):
            self.module_store(an.qual(target.value), line, f"changes the namespace (`.__dict__.{func.attr}`) of")
        elif (isinstance(target, ast.Call) and is_builtin(an.qual(target.func), "vars")
              and target.args and an.qual(target.args[0])):
            self.module_store(an.qual(target.args[0]), line, f"changes the namespace (`vars().{func.attr}`) of")
        elif vq and func.attr in ("update", "setdefault", "__setitem__", "__delitem__"):
            self.module_store(vq, line, f"changes (`.{func.attr}`)")

    def is_abs_path(self, node: ast.AST | None, depth: int = 0) -> bool:
        if node is None or depth > 20:
            return False
        text = const_str(node)
        if text is not None:
            return text.startswith(("/", "~", "\\"))
        if isinstance(node, ast.JoinedStr):
            return bool(node.values) and self.is_abs_path(node.values[0], depth + 1)
        if isinstance(node, ast.BinOp):
            return self.is_abs_path(node.left, depth + 1)
        if isinstance(node, ast.Call):
            q = self.an.qual(node.func)
            if q in PATH_CTORS and node.args:
                return self.is_abs_path(node.args[0], depth + 1)
            if q in ("pathlib.Path.home", "os.path.expanduser", "os.getcwd"):
                return True
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("format", "joinpath"):
                return self.is_abs_path(node.func.value, depth + 1)
        return False

    def check_open(self, node: ast.Call, q: str) -> None:
        args = node.args
        path = args[0] if args else next((k.value for k in node.keywords if k.arg in ("file", "path")), None)
        if not self.is_abs_path(path):
            return
        if q == "os.open":
            self.an.add("io_escape", node.lineno, f"opens the absolute path `{short(path, 40)}` with os.open")
            return
        mode = args[1] if len(args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
        text = const_str(mode)
        if mode is not None and (text is None or any(c in text for c in "wax+")):
            self.an.add("io_escape", node.lineno, f"opens the absolute path `{short(path, 40)}` for writing")

    def check_path_call(self, node: ast.Call, q: str) -> None:
        args = node.args
        targets = args[1:2] if q in ("torch.save", "numpy.save", "numpy.savez", "numpy.savez_compressed",
                                     "numpy.savetxt") else args[:2]
        if q.startswith(("torch.", "numpy.")):
            targets = list(targets) + [k.value for k in node.keywords if k.arg in ("f", "file", "fname")]
        for t in targets:
            if self.is_abs_path(t):
                self.an.add("io_escape", node.lineno, f"calls `{q}` on the absolute path `{short(t, 40)}`")
                break

    def check_path_method(self, node: ast.Call) -> None:
        func = node.func
        if not isinstance(func, ast.Attribute) or func.attr not in PATH_METHODS:
            return
        if not self.is_abs_path(func.value):
            return
        if func.attr == "open":
            mode = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "mode"), None)
            text = const_str(mode)
            if mode is None or (text is not None and not any(c in text for c in "wax+")):
                return
        self.an.add("io_escape", node.lineno,
                    f"calls `.{func.attr}()` on the absolute path `{short(func.value, 40)}`")
