"""The analyzer every check shares: findings (with a cap per flag), names (imports, aliases, module objects
reached through literal containers, ``getattr`` with literal names) and the import allowlist.

Names built from pieces (``"li" + "brary"``) are folded only to check the attribute name itself (dunders,
frame attributes); a module path reached through one stays unresolved, ``dynamic_code`` as any computed name."""

from __future__ import annotations

import ast

from kb_gym.integrity.astutil import DEFS, const_int, const_str, const_strings, fold_str, is_builtin
from kb_gym.integrity.findings import WHY, Finding
from kb_gym.integrity.names import (
    ALLOWED_MODULES,
    BUILTIN_NAMES,
    DEFAULT_ALIASES,
    KNOWN_MODULES,
    KNOWN_SUBMODULES,
    MAX_PER_FLAG,
    MODULE_FAMILIES,
    PRIVATE_DENIED,
    REACHABLE_STDLIB,
    REF_EXACT,
    REF_PREFIX,
)
from kb_gym.integrity.resolve import resolve

_CONTAINERS = (ast.List, ast.Tuple, ast.Dict)
_MAX_QUAL_DEPTH = 50


class _Analyzer:
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.findings: list[Finding] = []
        self._seen: set[tuple[str, int | None]] = set()
        self.per_flag: dict[str, int] = {}
        self.alias: dict[str, str] = {}
        self.imported: set[str] = set()
        self.bound: set[str] = set()
        self.module_like: set[str] = set()
        self.module_names: set[str] = set(KNOWN_MODULES) | set(KNOWN_SUBMODULES) | set(DEFAULT_ALIASES.values())
        self.nodes: list[ast.AST] = []
        self.parents: dict[int, ast.AST] = {}
        self.docstrings: set[int] = set()
        self.const_indexed: set[int] = set()  # expressions indexed by a constant key (`vars(m)["name"]`)
        self.stores: dict[str, int] = {}  # how many times each name is bound
        self.values: dict[str, ast.expr] = {}  # the value of a name bound once by `name = value`
        self.classes: set[str] = set()  # names a `class` or `def` statement binds
        self.loop_names: dict[str, list[str]] = {}  # `for name in ("fc1", "fc2")`: the constants a name takes

    # ----------------------------------------------------------------- reporting

    def add(self, flag: str, line: int | None, what: str, why: str | None = None) -> None:
        key = (flag, line)
        if key in self._seen or self.per_flag.get(flag, 0) >= MAX_PER_FLAG:
            return
        self._seen.add(key)
        self.per_flag[flag] = self.per_flag.get(flag, 0) + 1
        where = f"line {line}: " if line is not None else ""
        reason = why if why is not None else WHY.get(flag, "")
        message = f"{where}{what}; {reason}." if reason else f"{where}{what}."
        self.findings.append(Finding(flag, message, line))

    # ----------------------------------------------------------------- names

    def collect(self) -> None:
        alias_candidates: list[tuple[str, ast.expr]] = []
        for node in ast.walk(self.tree):
            self.nodes.append(node)
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
            if isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    if a.asname:
                        self.alias[a.asname] = a.name
                        self.imported.add(a.asname)
                        self.module_names.add(a.name)
                    else:
                        top = parts[0]
                        self.alias[top] = top
                        self.imported.add(top)
                        self.module_names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0 and node.module:
                    for a in node.names:
                        if a.name != "*":
                            local = a.asname or a.name
                            self.alias[local] = f"{node.module}.{a.name}"
                            self.imported.add(local)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                self.bound.add(node.id)
                self.stores[node.id] = self.stores.get(node.id, 0) + 1
            elif isinstance(node, ast.arg):
                self.bound.add(node.arg)
                self.stores[node.arg] = self.stores.get(node.arg, 0) + 1
            elif isinstance(node, DEFS):
                self.classes.add(node.name)
                self.bound.add(node.name)
                self.stores[node.name] = self.stores.get(node.name, 0) + 1
                body = node.body
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    self.docstrings.add(id(body[0].value))
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self.bound.add(node.name)
            elif isinstance(node, ast.Subscript) and const_str(node.slice) is not None:
                self.const_indexed.add(id(node.value))
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                self.docstrings.add(id(node.value))
            elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None
                  and node.simple):  # `Grid: TypeAlias = Tuple[int, int]`
                self.values[node.target.id] = node.value
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.values[node.targets[0].id] = node.value
                if isinstance(node.value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
                    alias_candidates.append((node.targets[0].id, node.value))
        self.values = {k: v for k, v in self.values.items() if self.stores.get(k) == 1}
        for node in self.nodes:  # a loop variable bound nowhere else, over a literal tuple or list of strings
            if (isinstance(node, ast.For) and isinstance(node.target, ast.Name)
                    and self.stores.get(node.target.id) == 1 and isinstance(node.iter, (ast.Tuple, ast.List))
                    and (names := const_strings(node.iter))):
                self.loop_names[node.target.id] = names
        local = self.bound - self.imported
        for name, target in DEFAULT_ALIASES.items():
            if name not in self.imported and name not in local:
                self.alias[name] = target
        self.module_like = set(self.imported) | (set(KNOWN_MODULES) - local)
        for _ in range(3):
            changed = False
            for name, value in alias_candidates:
                if name in self.imported:
                    continue
                if isinstance(value, ast.Call) and not self.is_import_call(value):
                    continue
                q = self.qual(value)
                if q and q.split(".")[0] in self.module_like and self.alias.get(name) != q:
                    self.alias[name] = q
                    changed = True
            if not changed:
                break

    def is_import_call(self, call: ast.Call) -> bool:
        f = self.qual(call.func)
        return is_builtin(f, "getattr", "__import__") or f == "importlib.import_module"

    def value_of(self, name: str) -> ast.expr | None:
        """The expression a name is bound to, when it is bound exactly once, by ``name = value``."""
        return self.values.get(name)

    def fold(self, node: ast.AST | None) -> str | None:
        """The text of a string built from constant pieces (through names bound once), else None."""
        return fold_str(node, self.value_of)

    def attr_name(self, node: ast.AST | None) -> str | None:
        """An attribute name given as a literal or as a string built from constant pieces."""
        name = const_str(node)
        return name if name is not None else self.fold(node)

    def is_loop_name(self, node: ast.AST | None) -> bool:
        return isinstance(node, ast.Name) and node.id in self.loop_names

    def attr_names(self, node: ast.AST | None) -> list[str] | None:
        """The attribute names an argument can be: one as ``attr_name`` reads it, or each constant a loop variable
        over a literal tuple takes (``for name in ("fc1", "fc2"): getattr(self, name)``); None where unknown."""
        name = self.attr_name(node)
        if name is not None:
            return [name]
        return self.loop_names.get(node.id) if isinstance(node, ast.Name) else None

    def qual(self, node: ast.AST | None, depth: int = 0) -> str | None:
        """Dotted name of a module-rooted expression (``F.relu`` -> ``torch.nn.functional.relu``), else None."""
        if depth > _MAX_QUAL_DEPTH:
            return None
        attrs: list[str] = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        base: str | None = None
        if isinstance(node, ast.Name):
            name = node.id
            if name in self.alias:
                base = self.alias[name]
            elif name in self.module_like:
                base = name
            elif name in BUILTIN_NAMES and name not in self.bound:
                base = name
        elif isinstance(node, ast.Call):
            f = self.qual(node.func, depth + 1)
            args = node.args
            if is_builtin(f, "getattr") and len(args) >= 2 and const_str(args[1]) is not None:
                inner = self.qual(args[0], depth + 1)
                base = f"{inner}.{args[1].value}" if inner else None
            elif is_builtin(f, "__import__") and args and const_str(args[0]):
                base = args[0].value.split(".")[0]
            elif f == "importlib.import_module" and args and const_str(args[0]):
                base = args[0].value
        elif isinstance(node, ast.Subscript):
            key = const_str(node.slice)
            container = node.value
            if key and self.qual(container, depth + 1) == "sys.modules":
                base = key
            elif (key and isinstance(container, ast.Call) and not container.args
                  and is_builtin(self.qual(container.func, depth + 1), "globals", "locals", "vars")):
                base = self.qual(ast.Name(id=key, ctx=ast.Load()), depth + 1)
            elif (key and isinstance(container, ast.Call) and len(container.args) == 1
                  and is_builtin(self.qual(container.func, depth + 1), "vars")):
                inner = self.qual(container.args[0], depth + 1)  # `vars(torch)["sys"]` is `torch.sys` (round 20)
                base = f"{inner}.{key}" if inner else None
            elif key and isinstance(container, ast.Attribute) and container.attr == "__dict__":
                inner = self.qual(container.value, depth + 1)  # `torch.__dict__["sys"]` likewise
                base = f"{inner}.{key}" if inner else None
            else:
                item = self.container_item(node)
                base = self.qual(item, depth + 1) if item is not None else None
        if base is None:
            return None
        return ".".join([base, *reversed(attrs)])

    def container_item(self, node: ast.Subscript) -> ast.expr | None:
        """The element ``node`` picks from a literal list, tuple or dict (directly or by a name bound once)."""
        container = node.value
        if isinstance(container, ast.Name):
            container = self.values.get(container.id)
        index = const_int(node.slice)
        if not isinstance(container, _CONTAINERS) or not (isinstance(node.slice, ast.Constant) or index is not None):
            return None
        key = index if index is not None else node.slice.value
        if isinstance(container, ast.Dict):
            for k, v in zip(container.keys, container.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == key and type(k.value) is type(key):
                    return v
            return None
        elts = container.elts
        if not isinstance(key, int) or isinstance(key, bool) or any(isinstance(e, ast.Starred) for e in elts):
            return None
        return elts[key] if -len(elts) <= key < len(elts) else None

    def is_module(self, node: ast.AST) -> str | None:
        """The module's name when ``node`` evaluates to a module object the checks know, else None."""
        if not isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
            return None
        if isinstance(node, ast.Call) and not self.is_import_call(node):
            return None
        q = self.qual(node)
        return q if q in self.module_names else None

    # ----------------------------------------------------------------- module names

    def ref_flag(self, q: str) -> str | None:
        parts = q.split(".")
        for i in range(len(parts), 0, -1):
            flag = REF_EXACT.get(".".join(parts[:i]))
            if flag:
                return flag
        for prefix, flag in REF_PREFIX:
            if q.startswith(prefix):
                return flag
        return None

    def check_module_name(self, name: str, line: int, verb: str) -> None:
        flag = self.ref_flag(name)
        if flag:
            self.add(flag, line, f"{verb} `{name}`")
            return
        # Modules keep the modules they imported as attributes (`torch._utils.sys`): a way to reach
        # sys, gc or inspect that no import statement shows. A module's own member of the same name
        # (`time.time`, `socket.socket`) is a function or class, not the module.
        parts = name.split(".")
        for i in range(1, len(parts)):
            if parts[i] in REACHABLE_STDLIB and parts[i] != parts[i - 1]:
                rest = ".".join(parts[i:])
                self.add(self.ref_flag(rest) or "introspection", line,
                         f"{verb} `{name}`: the module `{parts[i]}` through `{'.'.join(parts[:i])}`")
                return
        self.check_home(name, line, verb)
        if parts[0] in PRIVATE_DENIED and any(p.startswith("_") and not p.startswith("__") for p in parts[1:]):
            self.add("dynamic_code", line, f"{verb} `{name}`, a private name of `{parts[0]}` (its internals "
                     "evaluate and import for their caller)")

    def check_home(self, name: str, line: int, verb: str) -> None:
        """The rules again on what each step of ``name`` is (resolve.py): a module or function of a denied module
        kept by an allowed one under another name (``collections._sys``, ``torch._dynamo.guards.currentframe``)."""
        parts = name.split(".")
        for i, home in enumerate(resolve(name), start=2):
            spelled = ".".join(parts[:i])
            if home is None or home == spelled:
                continue
            root = home.split(".")[0]
            # a home outside the allowlist costs what importing it would (round 23: `sympy.parse_expr` through
            # torch's `torch.utils._sympy`, an eval)
            flag = self.ref_flag(home) or (MODULE_FAMILIES.get(root, "unlisted_import")
                                           if root not in ALLOWED_MODULES else None)
            if flag:
                self.add(flag, line, f"{verb} `{name}`: `{spelled}` is `{home}`")
                return

    def check_import(self, name: str, line: int) -> None:
        """An imported module: the rules on qualified names, then the allowlist (deny by default)."""
        self.check_module_name(name, line, "imports")
        if self.ref_flag(name):
            return
        root = name.split(".")[0]
        if root in ALLOWED_MODULES:
            return
        flag = MODULE_FAMILIES.get(root, "unlisted_import")
        self.add(flag, line, f"imports `{name}`, a module outside the allowlist of kernel modules",
                 WHY["unlisted_import"])
