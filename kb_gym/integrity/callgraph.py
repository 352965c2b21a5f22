"""The call graph the behaviour checks walk: what each function, method, class attribute and module variable
refers to (names only, no data flow), which nodes reach a kernel, and which compute with PyTorch."""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Iterator

from kb_gym.integrity.analyzer import _Analyzer
from kb_gym.integrity.astutil import DEFS, arithmetic, short, stmt_blocks, walk
from kb_gym.integrity.names import EXT_LOADERS, TENSOR_OPS, TORCH_NONCOMPUTE_EXACT, TORCH_NONCOMPUTE_PREFIX


class _CallGraph:
    """Graph state and the queries on it; :class:`_Structure` fills it from the tree.

    Nodes: ``f:name`` (functions), ``c:Class``, ``m:Class.method``, ``a:Class.attr`` (self attributes and
    class attributes), ``v:name`` (module variables), ``x:name`` (functions of a load_inline extension).
    """

    def __init__(self, an: _Analyzer):
        self.an = an
        self.func_defs: dict[str, list[ast.AST]] = {}  # key -> FunctionDef nodes
        self.func_class: dict[int, tuple[str | None, str | None]] = {}  # id(def) -> (class, self name)
        self.class_defs: dict[str, ast.ClassDef] = {}
        self.class_methods: dict[str, set[str]] = {}
        self.class_bases: dict[str, list[str]] = {}
        self.class_attrs: dict[str, set[str]] = {}
        self.module_vars: set[str] = set()
        self.values: dict[str, list[ast.AST]] = {}  # v:/a: node -> value expressions
        self.kernels: dict[str, tuple[str, int]] = {}  # node -> (display name, line)
        self.opaque: set[str] = {"op:*"}  # nodes that launch unknown extension functions or custom ops
        self.custom_ops: dict[str, str] = {}  # "ns.name" -> function node registered for torch.ops.ns.name
        self.extra_edges: dict[str, set[str]] = {}
        self.ext_funcs: set[str] = set()
        self.edges: dict[str, set[str]] = {}
        self.reach_kernel: set[str] = set()
        self.compute_nodes: set[str] = set()
        self.avail_names: set[str] = set()
        self._summary_memo: dict[int, tuple[bool, str | None, str | None]] = {}
        self._mro_memo: dict[str, list[str]] = {}  # filled once the classes are collected (mro)
        self._bound_by: dict[int, list[str]] | None = None  # id(value expression) -> nodes bound to it (structure)

    def mro(self, cls: str) -> list[str]:
        """``cls`` and its bases defined in the source, nearest first; memoised, linear in their number (a list
        searched for each class seen, recomputed for every ``self.x`` resolved, made the checks cubic in the depth
        of an inheritance chain: minutes for 75 KB of one-line classes, in the caller's thread; round 12)."""
        cached = self._mro_memo.get(cls)
        if cached is not None:
            return cached
        out: list[str] = []
        seen: set[str] = set()
        todo = deque([cls])
        while todo:
            c = todo.popleft()
            if c in seen or c not in self.class_defs:
                continue
            seen.add(c)
            out.append(c)
            todo.extend(self.class_bases.get(c, ()))
        self._mro_memo[cls] = out
        return out

    # ----------------------------------------------------------------- references

    def lookup(self, cls: str, attr: str) -> list[str]:
        out = []
        for c in self.mro(cls):
            if attr in self.class_methods.get(c, ()):
                out.append(f"m:{c}.{attr}")
            if f"a:{c}.{attr}" in self.values or attr in self.class_attrs.get(c, ()):
                out.append(f"a:{c}.{attr}")
        return out

    def refs(self, nodes: Iterable[ast.AST], cls: str | None, self_name: str | None) -> set[str]:
        """Graph nodes that ``nodes`` read (names, ``self.x``, ``Class.x``, literal names for getattr)."""
        out: set[str] = set()
        for n in self.walk_code(nodes):
            self.node_refs(n, cls, self_name, out)
        return out

    def walk_code(self, nodes: Iterable[ast.AST], skip: ast.AST | None = None) -> Iterator[ast.AST]:
        """Like ``_walk``, but not into extension builds (their ``functions=[...]`` names are no launch) or ``skip``."""
        stack = list(nodes)
        while stack:
            node = stack.pop()
            if node is skip:
                continue
            yield node
            if isinstance(node, DEFS):
                continue
            if isinstance(node, ast.Call) and self.an.qual(node.func) in EXT_LOADERS:
                continue
            stack.extend(ast.iter_child_nodes(node))

    def _name_refs(self, name: str, out: set[str], *, classes: bool = False, extensions: bool = False) -> None:
        """What a bare name (or a string naming one, as in getattr) may refer to."""
        if f"f:{name}" in self.func_defs:
            out.add(f"f:{name}")
        if classes and name in self.class_defs:
            out.add(f"c:{name}")
        if extensions and name in self.ext_funcs:
            out.add(f"x:{name}")
        if name in self.module_vars:
            out.add(f"v:{name}")

    def node_refs(self, n: ast.AST, cls: str | None, self_name: str | None, out: set[str]) -> None:
        if isinstance(n, ast.Name):
            if not isinstance(n.ctx, ast.Load):
                return
            self._name_refs(n.id, out, classes=True)
        elif isinstance(n, ast.Attribute):
            if not isinstance(n.ctx, ast.Load):
                return
            base = n.value
            if n.attr in self.ext_funcs:
                out.add(f"x:{n.attr}")
            if isinstance(base, ast.Attribute):
                q = self.an.qual(n)
                parts = q.split(".") if q and q.startswith("torch.ops.") else []
                if len(parts) >= 4 and parts[2] not in ("aten", "prims", "quantized"):
                    out.add(self.custom_ops.get(f"{parts[2]}.{parts[3]}", "op:*"))
            if isinstance(base, ast.Name):
                if cls and base.id in (self_name, "cls", "self"):
                    out.update(self.lookup(cls, n.attr))
                elif base.id in self.class_defs:
                    out.update(self.lookup(base.id, n.attr))
            elif (isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"
                  and cls):
                for c in self.mro(cls)[1:]:
                    out.update(self.lookup(c, n.attr))
        elif isinstance(n, DEFS):
            if isinstance(n, ast.ClassDef):
                out.add(f"c:{n.name}")
            elif f"f:{n.name}" in self.func_defs:
                out.add(f"f:{n.name}")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and len(n.value) < 200:
            self._name_refs(n.value, out, extensions=True)
            if cls:
                out.update(self.lookup(cls, n.value))

    def _propagate(self) -> None:
        reverse: dict[str, set[str]] = {}
        for src, dsts in self.edges.items():
            for d in dsts:
                reverse.setdefault(d, set()).add(src)
        todo = list(set(self.kernels) | self.opaque)
        seen = set(todo)
        while todo:
            node = todo.pop()
            for src in reverse.get(node, ()):
                if src not in seen:
                    seen.add(src)
                    todo.append(src)
        self.reach_kernel = seen
        # functions whose own body computes with PyTorch, then whatever calls them
        direct = set()
        for key, defs in self.func_defs.items():
            if key in self.kernels:
                continue
            for d in defs:
                cls, sname = self.func_class.get(id(d), (None, None))
                if self.direct_compute(d.body, cls, sname):
                    direct.add(key)
        todo = list(direct)
        seen = set(direct)
        while todo:
            node = todo.pop()
            for src in reverse.get(node, ()):
                if src not in seen and (src.startswith(("f:", "m:", "c:"))):
                    seen.add(src)
                    todo.append(src)
        self.compute_nodes = seen

    def reach(self, roots: Iterable[str]) -> set[str]:
        todo = list(roots)
        seen = set(todo)
        while todo:
            node = todo.pop()
            for nxt in self.edges.get(node, ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    # ----------------------------------------------------------------- launch / compute predicates

    def direct_compute(self, nodes: Iterable[ast.AST], cls: str | None, self_name: str | None) -> str | None:
        """The first PyTorch (or NumPy) computation in ``nodes`` as text, else None."""
        an = self.an
        for n in walk(nodes):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult):
                return short(n, 40)
            if not isinstance(n, ast.Call):
                continue
            func = n.func
            q = an.qual(func)
            if q is not None:
                root = q.split(".")[0]
                if root == "torch":
                    if q in TORCH_NONCOMPUTE_EXACT or q.startswith(TORCH_NONCOMPUTE_PREFIX):
                        continue
                    if q.startswith("torch.ops.") and not q.startswith(("torch.ops.aten.", "torch.ops.prims.")):
                        continue
                    return q
                if root in ("numpy", "scipy"):
                    return q
                continue
            if isinstance(func, ast.Attribute):
                base = func.value
                if func.attr in TENSOR_OPS and func.attr not in self.ext_funcs:
                    return f".{func.attr}()"
                if (isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"
                        and func.attr in ("forward", "__call__")):
                    return "super().forward()"
                if cls and isinstance(base, ast.Name) and base.id == self_name:
                    nodes_ = self.lookup(cls, func.attr)
                    if not any(k.startswith("m:") for k in nodes_) and not any(k in self.reach_kernel for k in nodes_):
                        return f"self.{func.attr}()"
                if (cls and isinstance(base, ast.Attribute) and func.attr == "forward"
                        and isinstance(base.value, ast.Name) and base.value.id == self_name):
                    nodes_ = self.lookup(cls, base.attr)
                    if not any(k in self.reach_kernel for k in nodes_):
                        return f"self.{base.attr}.forward()"
            elif isinstance(func, ast.Name) and func.id in ("Model",) and "Model" not in self.class_defs:
                return "Model"
        return None

    def compute(self, nodes: list[ast.AST], cls: str | None, self_name: str | None, loose: bool = False) -> str | None:
        """PyTorch computation in ``nodes`` (direct or through a helper); ``loose`` also counts returned arithmetic."""
        if all(isinstance(n, ast.stmt) for n in nodes):
            summaries = [self.summary(s, cls, self_name) for s in nodes]
            found = next((c for _, c, _ in summaries if c), None)
            if found or not loose:
                return found
            return next((lo for _, _, lo in summaries if lo), None)
        found = self.direct_compute(nodes, cls, self_name)
        if found:
            return found
        for key in self.refs(nodes, cls, self_name):
            if key in self.compute_nodes and key not in self.reach_kernel:
                return key.split(":", 1)[1] + "()"
        if loose:
            for n in walk(nodes):
                if isinstance(n, ast.Return) and n.value is not None:
                    found = arithmetic(n.value)
                    if found:
                        return found
        return None

    def launches(self, nodes: Iterable[ast.AST], cls: str | None, self_name: str | None,
                 skip: ast.AST | None = None, ignore: frozenset[str] = frozenset()) -> bool:
        """Whether ``nodes`` launch a kernel: reach one through the graph, call a custom op or replay a graph."""
        nodes = list(nodes)
        if skip is None and not ignore and all(isinstance(n, ast.stmt) for n in nodes):
            return any(self.summary(s, cls, self_name)[0] for s in nodes)
        out: set[str] = set()
        for n in self.walk_code(nodes, skip):
            if self.launch_call(n):
                return True
            self.node_refs(n, cls, self_name, out)
        return any(k in self.reach_kernel and k not in ignore for k in out)

    def launch_call(self, n: ast.AST) -> bool:
        if not isinstance(n, ast.Call):
            return False
        q = self.an.qual(n.func)
        if q and q.startswith("torch.ops.") and not q.startswith(("torch.ops.aten.", "torch.ops.prims.")):
            return True
        return q is None and isinstance(n.func, ast.Attribute) and n.func.attr == "replay" and not n.args

    def summary(self, stmt: ast.stmt, cls: str | None, self_name: str | None) -> tuple[bool, str | None, str | None]:
        """(launches, PyTorch computation, returned arithmetic) of one statement and those nested in it; memoised."""
        key = id(stmt)
        cached = self._summary_memo.get(key)
        if cached is not None:
            return cached
        out: set[str] = set()
        loose = None
        if isinstance(stmt, DEFS):  # a definition in a branch counts as a use of it
            self.node_refs(stmt, cls, self_name, out)
            launch, comp = any(k in self.reach_kernel for k in out), None
        else:
            own = [c for c in ast.iter_child_nodes(stmt)
                   if not isinstance(c, (ast.stmt, ast.excepthandler, ast.match_case))]
            launch = False
            for n in self.walk_code(own):
                launch = launch or self.launch_call(n)
                self.node_refs(n, cls, self_name, out)
            launch = launch or any(k in self.reach_kernel for k in out)
            helpers = sorted(k for k in out if k in self.compute_nodes and k not in self.reach_kernel)
            comp = self.direct_compute(own, cls, self_name) or (helpers[0].split(":", 1)[1] + "()" if helpers else None)
            if isinstance(stmt, ast.Return) and stmt.value is not None:
                loose = arithmetic(stmt.value)
            for block in stmt_blocks(stmt):
                for inner in block:
                    l2, c2, lo2 = self.summary(inner, cls, self_name)
                    launch, comp, loose = launch or l2, comp or c2, loose or lo2
        result = (launch, comp, loose)
        self._summary_memo[key] = result
        return result
