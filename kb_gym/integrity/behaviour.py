"""What ModelNew.forward does with its kernels: PyTorch fallbacks (except branches, device or availability
branches), decoy and unused kernels, and replays of results cached from earlier calls."""

from __future__ import annotations

import ast

from kb_gym.integrity.analyzer import _Analyzer
from kb_gym.integrity.astutil import (
    const_str,
    flat_targets,
    is_builtin,
    short,
    stmt_blocks,
    stmt_exprs,
    terminates,
    walk,
)
from kb_gym.integrity.names import (
    AVAIL_CALLS,
    AVAIL_NOUNS,
    AVAIL_STRONG,
    AVAIL_VERBS,
    CACHE_DECORATORS,
    EXT_LOADERS,
    MUTATORS,
    PASSTHROUGH,
    SIZE_WORDS,
)
from kb_gym.integrity.structure import _Structure


class _Behaviour:
    """Fallback, decoy / unused kernel and replay analysis over what ModelNew.forward reaches."""

    def __init__(self, an: _Analyzer, st: _Structure):
        self.an = an
        self.st = st

    def run(self) -> None:
        st = self.st
        self.try_fallbacks()
        if "ModelNew" not in st.class_defs:
            return
        roots = []
        for cls in st.mro("ModelNew"):
            for name in ("forward", "__call__"):
                if name in st.class_methods.get(cls, ()):
                    roots.append(f"m:{cls}.{name}")
            if roots:
                break
        if not roots:
            return
        reached = st.reach(roots)
        self.decoys(reached)
        funcs = [(key, d) for key in sorted(reached) if key in st.func_defs and key not in st.kernels
                 for d in st.func_defs[key]]
        for _key, d in funcs:
            cls, sname = st.func_class.get(id(d), (None, None))
            self.branch_fallbacks(d, cls, sname)
        self.replays(funcs)

    # ----------------------------------------------------------------- fallback

    def try_fallbacks(self) -> None:
        st = self.st
        owner: dict[int, tuple[str | None, str | None]] = {}
        for defs in st.func_defs.values():
            for d in defs:
                info = st.func_class.get(id(d), (None, None))
                for n in walk(d.body):
                    if isinstance(n, (ast.Try, ast.TryStar)):
                        owner[id(n)] = info
        for node in self.an.nodes:
            if not isinstance(node, (ast.Try, ast.TryStar)):
                continue
            if not any(isinstance(n, ast.Call) for n in walk(node.body)):
                continue
            st.avail_names |= _flag_names(node.body, self.an)
            cls, sname = owner.get(id(node), (None, None))
            launching = st.launches(node.body, cls, sname)
            for handler in node.handlers:
                st.avail_names |= _flag_names(handler.body, self.an)
                if terminates(handler.body) and isinstance(handler.body[-1], ast.Raise):
                    continue
                found = st.compute(handler.body, cls, sname, loose=launching)
                if found:
                    self.an.add("fallback", handler.lineno,
                                f"this except branch falls back to PyTorch (`{found}`)",
                                "a kernel that fails must fail, not be replaced by PyTorch, so the result gets "
                                "no speed credit")

    def is_marker(self, test: ast.AST, sname: str | None) -> str | None:
        """Text of a device or kernel-availability condition in ``test``, else None."""
        for n in ast.walk(test):
            name = None
            if isinstance(n, ast.Attribute):
                if n.attr in ("is_cuda", "is_cpu", "device"):
                    return short(test)
                if isinstance(n.value, ast.Name) and n.value.id == sname:
                    name = n.attr
            elif isinstance(n, ast.Call):
                if self.an.qual(n.func) in AVAIL_CALLS:
                    return short(test)
            elif isinstance(n, ast.Name):
                name = n.id
            if name and _availability_name(name, self.st.avail_names):
                return short(test)
        return None

    def branch_fallbacks(self, func: ast.AST, cls: str | None, sname: str | None) -> None:
        blocks = [func.body]
        while blocks:
            block = blocks.pop()
            for i, stmt in enumerate(block):
                blocks.extend(stmt_blocks(stmt))
                if isinstance(stmt, ast.If):
                    if stmt.orelse:
                        other = stmt.orelse
                    elif terminates(stmt.body):
                        other = block[i + 1:]
                    else:
                        other = []
                    self.judge(stmt, stmt.test, stmt.body, other, cls, sname)
                for n in stmt_exprs(stmt):
                    if isinstance(n, ast.IfExp):
                        self.judge(n, n.test, [n.body], [n.orelse], cls, sname)

    def judge(self, node: ast.AST, test: ast.AST, body: list, other: list, cls, sname) -> None:
        st = self.st
        marker = self.is_marker(test, sname)
        for branch, alt in ((body, other), (other, body)):
            if not branch:
                continue
            if terminates(branch) and isinstance(branch[-1], ast.Raise):
                continue
            if st.launches(branch, cls, sname):
                continue
            found = st.compute(branch, cls, sname, loose=True)
            if not found:
                continue
            if marker or (alt and st.launches(alt, cls, sname)):
                cond = marker or short(test)
                self.an.add("fallback", node.lineno,
                            f"depending on `{cond}`, forward runs PyTorch (`{found}`) instead of your kernel",
                            "a fallback path is not your kernel, so the result gets no speed credit; launch the "
                            "kernel on every path")
                return

    # ----------------------------------------------------------------- decoy

    def decoys(self, reached: set[str]) -> None:
        st = self.st
        if not st.kernels:
            return
        if any(_is_dynamic_dispatch(d, self.an) for key in reached if key in st.func_defs for d in st.func_defs[key]):
            return
        used = sorted(k for k in st.kernels if k in reached)
        unused = sorted((k for k in st.kernels if k not in reached), key=lambda k: st.kernels[k][1])
        if not unused:
            return
        names = ", ".join(f"`{st.kernels[k][0]}`" for k in unused[:6])
        line = st.kernels[unused[0]][1]
        if not used and not any(k in reached for k in st.opaque):
            self.an.add("decoy", line, f"defines kernels {names} but ModelNew.forward never launches them",
                        "the output must come from your kernels, so the result gets no speed credit")
        elif used:
            used_names = ", ".join(f"`{st.kernels[k][0]}`" for k in used[:6])
            self.an.add("unused_kernel", line,
                        f"kernels {names} are never launched from ModelNew.forward (it uses {used_names})",
                        "remove dead kernels")

    # ----------------------------------------------------------------- replay

    def replays(self, funcs: list[tuple[str, ast.AST]]) -> None:
        st = self.st
        an = self.an
        state: set[str] = set()
        for _key, d in funcs:
            _cls, sname = st.func_class.get(id(d), (None, None))
            globals_ = {name for n in walk(d.body) if isinstance(n, ast.Global) for name in n.names}
            for n in walk(d.body):
                targets: list[ast.AST] = []
                mutator = False
                if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None:
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS
                      and n.func.attr not in ("pop", "popitem", "remove", "clear")):
                    targets, mutator = [n.func.value], True
                for t in flat_targets(targets):
                    base = t
                    while isinstance(base, ast.Subscript):
                        base = base.value
                    if (sname and isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name)
                            and base.value.id == sname):
                        state.add(f"self.{base.attr}")
                    elif isinstance(base, ast.Name) and (
                            base.id in globals_ or ((base is not t or mutator) and base.id in st.module_vars)):
                        state.add(base.id)
        for _key, d in funcs:
            cls, sname = st.func_class.get(id(d), (None, None))
            self.replay_in(d, cls, sname, state)
            for dec in d.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if an.qual(target) in CACHE_DECORATORS:
                    key = f"m:{cls}.{d.name}" if cls else f"f:{d.name}"
                    if key in st.reach_kernel or key in st.compute_nodes or d.name == "forward":
                        an.add("replay", dec.lineno, f"`{d.name}` is memoised with `{short(target)}`",
                               "cached results are replayed instead of computed from the current inputs, so the "
                               "result gets no speed credit")

    def replay_in(self, func: ast.AST, cls, sname, state: set[str]) -> None:
        st = self.st
        an = self.an
        aliases = set(state)
        tainted: set[str] = set()
        nodes = list(walk(func.body))
        for _ in range(2):
            for n in nodes:
                if isinstance(n, ast.Assign):
                    bases = _returned_bases(n.value, sname)
                    key_call = _has_key_call(n.value, tainted)
                    for t in n.targets:
                        if isinstance(t, ast.Name):
                            if bases & aliases:
                                aliases.add(t.id)
                            if key_call:
                                tainted.add(t.id)
        for n in nodes:
            key_expr = None
            if isinstance(n, ast.Subscript):
                key_expr = n.slice
            elif isinstance(n, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in n.ops):
                key_expr = n.left
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr in ("get", "setdefault", "pop", "__contains__", "__getitem__") and n.args):
                key_expr = n.args[0]
            if key_expr is not None:
                found = _has_key_call(key_expr, tainted)
                if found:
                    an.add("replay", n.lineno, f"looks up a cache keyed by `{found}`",
                           "outputs must be computed from the current inputs on every call, so replayed results "
                           "get no speed credit")
        if not state:
            return
        # reading a cached value is no launch, even when the value came from one
        state_nodes = frozenset(
            key for target in state
            for key in ((st.lookup(cls, target[5:]) if cls else []) if target.startswith("self.") else [f"v:{target}"]))
        returned = set()
        for n in nodes:
            if isinstance(n, ast.Return):
                returned |= _returned_bases(n.value, sname) & aliases
        conditionals: list[tuple[ast.AST, ast.AST, list, list]] = []  # (node, test, branch, branch)
        for n in nodes:
            if isinstance(n, ast.If):
                conditionals.append((n, n.test, n.body, n.orelse))
            elif isinstance(n, ast.Return) and isinstance(n.value, ast.IfExp):
                conditionals.append((n, n.value.test, [n.value.body], [n.value.orelse]))
        examined = 0
        for n, test, body, orelse in conditionals:
            if not (_mentions(test, sname) & aliases):
                continue
            examined += 1
            if examined > 64:
                return
            for branch in (body, orelse):
                hits, early = _branch_returns(branch, sname, aliases)
                if early is None or st.launches(branch, cls, sname):
                    continue
                if hits:
                    what = f"returns `{sorted(hits)[0]}` saved by an earlier call when `{short(test)}` holds"
                else:
                    what = (f"returns `{short(early, 40)}` without running a kernel when `{short(test)}` "
                            "holds, a condition on state kept across calls")
                an.add("replay", n.lineno, what,
                       "outputs must be computed from the current inputs on every call, so replayed results get "
                       "no speed credit")
                return
            if (returned and st.launches(body, cls, sname) != st.launches(orelse, cls, sname)
                    and not st.launches(func.body, cls, sname, skip=n, ignore=state_nodes)):
                an.add("replay", n.lineno, f"launches the kernel only when `{short(test)}` holds and returns "
                       f"`{sorted(returned)[0]}` kept from an earlier call",
                       "outputs must be computed from the current inputs on every call, so replayed results "
                       "get no speed credit")
                return


def _branch_returns(branch: list, self_name: str | None, aliases: set[str]) -> tuple[set[str], ast.AST | None]:
    """(cached names returned, first value returned) by a branch: statements, or one expression of an IfExp."""
    if branch and not isinstance(branch[0], ast.stmt):
        value = branch[0]
        returned = None if isinstance(value, ast.Constant) and value.value is None else value
        return _returned_bases(value, self_name) & aliases, returned
    hits: set[str] = set()
    early = None
    for m in walk(branch):
        if isinstance(m, ast.Return):
            hits |= _returned_bases(m.value, self_name) & aliases
            if m.value is not None and not (isinstance(m.value, ast.Constant) and m.value.value is None):
                early = early or m.value
    return hits, early


def _returned_bases(expr: ast.AST | None, self_name: str | None, depth: int = 0) -> set[str]:
    """Names or ``self.attr`` that ``expr`` hands back unchanged (through indexing, clone, .get, ...)."""
    out: set[str] = set()
    node = expr
    while node is not None and depth < 50:
        depth += 1
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PASSTHROUGH:
            node = node.func.value
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == self_name:
            out.add(f"self.{node.attr}")
            break
        elif isinstance(node, ast.Name):
            out.add(node.id)
            break
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                out |= _returned_bases(elt, self_name, depth)
            break
        elif isinstance(node, ast.IfExp):
            out |= _returned_bases(node.body, self_name, depth)
            out |= _returned_bases(node.orelse, self_name, depth)
            break
        else:
            break
    return out


def _mentions(expr: ast.AST, self_name: str | None) -> set[str]:
    out = set()
    for n in ast.walk(expr):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == self_name:
            out.add(f"self.{n.attr}")
    return out


def _has_key_call(expr: ast.AST, tainted: set[str]) -> str | None:
    for n in ast.walk(expr):
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Attribute) and f.attr in ("data_ptr", "untyped_storage", "storage", "_cdata"):
                return f".{f.attr}()"
            if isinstance(f, ast.Name) and f.id == "id":
                return "id()"
        elif isinstance(n, ast.Attribute) and n.attr == "_cdata":
            return "._cdata"
        elif isinstance(n, ast.Name) and n.id in tainted:
            return n.id
    return None


def _availability_name(name: str, flags: set[str]) -> bool:
    words = set(name.lower().split("_")) - {""}
    if words & SIZE_WORDS:
        return False
    return name in flags or bool(words & AVAIL_STRONG) or bool(words & AVAIL_VERBS and words & AVAIL_NOUNS)


def _flag_names(body: list[ast.stmt], an: _Analyzer) -> set[str]:
    """Names (or attributes) a try block sets to a flag: True / False / None, or a built extension."""
    out = set()
    for n in walk(body):
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
            value = n.value
            flag_like = (isinstance(value, ast.Constant) and value.value in (True, False, None)) or (
                isinstance(value, ast.Call) and an.qual(value.func) in EXT_LOADERS)
            if not flag_like:
                continue
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in flat_targets(targets):
                if isinstance(t, ast.Name):
                    out.add(t.id)
                elif isinstance(t, ast.Attribute):
                    out.add(t.attr)
    return out


def _is_dynamic_dispatch(func: ast.AST, an: _Analyzer) -> bool:
    """Whether ``func`` looks names up at run time (getattr with a computed name, globals(), eval...)."""
    for n in walk(func.body):
        if isinstance(n, ast.Call):
            q = an.qual(n.func)
            if is_builtin(q, "globals", "locals", "vars", "eval", "exec"):
                return True
            if is_builtin(q, "getattr") and len(n.args) >= 2 and const_str(n.args[1]) is None:
                return True
    return False
