"""Collection for the call graph: definitions, classes and their bases, values bound to module variables
and self attributes, kernels (Triton, Numba, load_inline functions, custom ops) and opaque launchers."""

from __future__ import annotations

import ast

from kb_gym.integrity.astutil import FUNCS, const_str, stmt_blocks, walk
from kb_gym.integrity.callgraph import _CallGraph
from kb_gym.integrity.names import EXT_LOADERS, KERNEL_DECORATORS, RAW_KERNELS


class _Structure(_CallGraph):
    """Names-only call graph over module functions, classes, methods, module variables and self attributes."""

    # ----------------------------------------------------------------- collection

    def build(self) -> None:
        tree = self.an.tree
        self._scan_block(tree.body, cls=None, self_name=None, top=True)
        for node in self.an.nodes:
            if isinstance(node, ast.Global):
                self.module_vars.update(node.names)
        self._collect_values()
        self._collect_kernels()
        for key, defs in self.func_defs.items():
            refs: set[str] = set()
            for d in defs:
                cls, self_name = self.func_class.get(id(d), (None, None))
                refs |= self.refs([*d.body, *d.decorator_list], cls, self_name)
            self.edges.setdefault(key, set()).update(refs)
        for cls in self.class_defs:
            self.edges.setdefault(f"c:{cls}", set()).update(
                f"m:{c}.{m}" for c in self.mro(cls) for m in self.class_methods.get(c, ()))
        for key, exprs in self.values.items():
            cls = key[2:].split(".")[0] if key.startswith("a:") else None
            self.edges.setdefault(key, set()).update(self.refs(exprs, cls, "self"))
        for key, dsts in self.extra_edges.items():
            self.edges.setdefault(key, set()).update(dsts)
        self._propagate()

    def _scan_block(self, body: list[ast.stmt], cls: str | None, self_name: str | None, top: bool) -> None:
        stack = [(stmt, cls, top) for stmt in reversed(body)]
        while stack:
            stmt, c, is_top = stack.pop()
            if isinstance(stmt, FUNCS):
                key = f"m:{c}.{stmt.name}" if c else f"f:{stmt.name}"
                self.func_defs.setdefault(key, []).append(stmt)
                sname = None
                if c:
                    self.class_methods.setdefault(c, set()).add(stmt.name)
                    params = stmt.args.posonlyargs + stmt.args.args
                    static = any(self.an.qual(d) == "staticmethod" for d in stmt.decorator_list)
                    sname = params[0].arg if params and not static else None
                self.func_class[id(stmt)] = (c, sname)
                for inner in stmt.body:
                    stack.append((inner, None, False))
            elif isinstance(stmt, ast.ClassDef):
                self.class_defs[stmt.name] = stmt
                self.class_methods.setdefault(stmt.name, set())
                self.class_bases[stmt.name] = [b.id for b in stmt.bases if isinstance(b, ast.Name)]
                for inner in stmt.body:
                    stack.append((inner, stmt.name, False))
            else:
                if c is not None and isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    for t in targets:
                        if isinstance(t, ast.Name):
                            self.class_attrs.setdefault(c, set()).add(t.id)
                            if stmt.value is not None:
                                self.values.setdefault(f"a:{c}.{t.id}", []).append(stmt.value)
                elif is_top and isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    for t in targets:
                        for n in ast.walk(t):
                            if isinstance(n, ast.Name):
                                self.module_vars.add(n.id)
                for block in stmt_blocks(stmt):
                    for inner in reversed(block):
                        stack.append((inner, c, is_top))

    def _collect_values(self) -> None:
        """Values of module variables (any assignment to the name) and of self attributes (in methods)."""
        for key, defs in self.func_defs.items():
            if not key.startswith("m:"):
                continue
            for d in defs:
                cls, sname = self.func_class[id(d)]
                if not sname:
                    continue
                for node in walk(d.body):
                    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        for t in targets:
                            for n in ast.walk(t):
                                if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                                        and n.value.id == sname):
                                    self.class_attrs.setdefault(cls, set()).add(n.attr)
                                    self.values.setdefault(f"a:{cls}.{n.attr}", []).append(node.value)
        for node in self.an.nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name) and n.id in self.module_vars:
                            self.values.setdefault(f"v:{n.id}", []).append(node.value)

    def _binding_nodes(self, call: ast.Call) -> list[str]:
        """Graph nodes bound to the result of ``call`` (``x = call``, ``self.x = call``). Looked up in an index of
        the values by identity: a scan of every value for every such call took 8 s for 4,500 ``k = triton.jit(f)``
        lines (98 KB), in the caller's thread (round 12)."""
        if self._bound_by is None:
            self._bound_by = {}
            for key, exprs in self.values.items():
                for e in exprs:
                    keys = self._bound_by.setdefault(id(e), [])
                    if key not in keys:
                        keys.append(key)
        return list(self._bound_by.get(id(call), ()))

    def _collect_kernels(self) -> None:
        an = self.an
        for key, defs in self.func_defs.items():
            for d in defs:
                for dec in d.decorator_list:
                    target = dec.func if isinstance(dec, ast.Call) else dec
                    q = an.qual(target)
                    if q in KERNEL_DECORATORS:
                        self.kernels[key] = (d.name, d.lineno)
                    elif q and q.startswith("torch.library.") and isinstance(dec, ast.Call) and dec.args:
                        name = const_str(dec.args[0])  # @torch.library.custom_op("ns::name") and friends
                        if name and "::" in name:
                            self.custom_ops[name.replace("::", ".").split(".overload")[0]] = key
                    elif (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                          and target.attr.startswith("register_")):  # @op.register_kernel("cuda")
                        self.extra_edges.setdefault(f"f:{target.value.id}", set()).add(key)
        calls = [n for n in an.nodes if isinstance(n, ast.Call)]
        for call in calls:
            q = an.qual(call.func)
            if q in KERNEL_DECORATORS:  # kernel = triton.jit(fn)
                for key in self._binding_nodes(call):
                    self.kernels[key] = (key.split(".")[-1].split(":")[-1], call.lineno)
            elif q in RAW_KERNELS or (isinstance(call.func, ast.Attribute) and call.func.attr == "get_function"):
                for key in self._binding_nodes(call):
                    self.opaque.add(key)
            elif q in EXT_LOADERS:
                names = self._ext_function_names(call)
                bindings = self._binding_nodes(call)
                if names is None:
                    self.opaque.update(bindings)
                    continue
                for name in names:
                    self.ext_funcs.add(name)
                    self.kernels.setdefault(f"x:{name}", (name, call.lineno))

    def _ext_function_names(self, call: ast.Call) -> list[str] | None:
        value = next((k.value for k in call.keywords if k.arg == "functions"), None)
        if value is None and len(call.args) >= 5:  # load_inline(name, cpp, cuda, ..., functions)
            value = call.args[4] if self.an.qual(call.func).endswith("load_inline") else None
        if isinstance(value, ast.Name):
            vals = self.values.get(f"v:{value.id}", [])
            value = vals[0] if len(vals) == 1 else None
        if isinstance(value, (ast.List, ast.Tuple, ast.Set)):
            names = [const_str(e) for e in value.elts]
            if all(n is not None for n in names):
                return names
            return None
        text = const_str(value)
        if text is not None:
            return [text]
        if isinstance(value, ast.Dict):
            names = [const_str(k) for k in value.keys]
            return names if all(n is not None for n in names) else None
        return None
