"""The node-by-node checks: imports (allowlist, star imports), stores into modules, calls, attribute names
(frames, dunders), computed attribute names, module objects passed around as values, and strings."""

from __future__ import annotations

import ast
import re
import threading

from kb_gym.integrity.astutil import FUNCS, const_str, const_strings, is_builtin, is_dunder, short
from kb_gym.integrity.names import (
    ATTR_GETTERS,
    ATTR_RULES,
    CLASS_NAMES_DENIED,
    DANGEROUS_NAMES,
    DUNDER_OK,
    ENV_ALLOW,
    EVALUATING_BUILTINS,
    MODULE_ARG_OK,
    MUTATORS,
    OPEN_CALLS,
    PATH_CALLS,
    PRECISION_CALLS,
    TENSOR_BASES,
    into_python,
)
from kb_gym.integrity.paths import _StateChecks

_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_NAMESPACE_CALLS = ("globals", "locals", "vars")
_TYPE_FACTORIES = ("TypeVar", "NewType", "ParamSpec", "TypeVarTuple", "NamedTuple", "TypedDict", "namedtuple", "Enum",
                   "IntEnum", "Flag", "IntFlag", "StrEnum")


def _type_like(node: ast.expr) -> bool:
    """Whether a value reads as a type for an annotation: a name or dotted name, a constant (``None``, ``...``, a
    literal; a string is checked as code where it is one), a generic's subscript, a union, tuple or list of those, or a
    typing or enum factory (``TypeVar("T")``, ``Enum("Act", [...])``). Not a string sliced or computed."""
    if isinstance(node, (ast.Name, ast.Attribute, ast.Constant)):
        return True
    if isinstance(node, ast.Subscript):  # a generic (`Optional[T]`), not a string sliced (`"..."[::-1]`)
        return isinstance(node.value, (ast.Name, ast.Attribute)) and _type_like(node.slice)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _type_like(node.left) and _type_like(node.right)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_type_like(e) for e in node.elts)
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        return name in _TYPE_FACTORIES
    return False


CODE_STRING_CHARS = 20_000  # strings longer than this are not parsed as code (kernels' sources are C++)
# strings checked as code within strings checked as code: two levels at most (per thread: callers' threads)
_CODE_DEPTH = threading.local()


class _SimpleChecks(_StateChecks):
    """One pass over every node of the tree; what a finding needs beyond one node is in _Behaviour."""

    def run(self) -> None:
        an = self.an
        for node in an.nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    an.check_import(a.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                self.check_import_from(node)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    self.check_store(target, node.lineno)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                if not isinstance(node, ast.AnnAssign) or node.value is not None:
                    self.check_store(node.target, node.lineno)
                if isinstance(node, ast.AnnAssign):
                    self.check_annotation(node.annotation, node.lineno)
            elif isinstance(node, ast.Delete):
                for target in node.targets:
                    self.check_store(target, node.lineno, verb="deletes")
            elif isinstance(node, ast.Call):
                self.check_call(node)
            elif isinstance(node, ast.Attribute):
                self.check_attr_name(node.attr, node.lineno)
                if isinstance(node.ctx, ast.Load):
                    q = an.qual(node)
                    if q:
                        an.check_module_name(q, node.lineno, "uses")
                    if node.attr == "__dict__" and an.qual(node.value) and id(node) not in an.const_indexed:
                        an.add("dynamic_code", node.lineno, f"reads the namespace of `{an.qual(node.value)}` "
                               "through `__dict__`")
                    self.check_module_flow(node)
            elif isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    self.check_builtin_value(node)
                if node.id == "__builtins__":
                    an.add("harness_patch", node.lineno, "uses `__builtins__`")
                elif node.id in an.alias and an.alias[node.id] != node.id:
                    an.check_module_name(an.alias[node.id], node.lineno, "uses")
                if isinstance(node.ctx, ast.Load):
                    self.check_module_flow(node)
            elif isinstance(node, ast.Subscript):
                self.check_namespace_lookup(node)
                if isinstance(node.ctx, ast.Load):
                    q = an.qual(node)  # a module's namespace read by a constant key: `vars(torch)["sys"]`
                    if q:
                        an.check_module_name(q, node.lineno, "uses")
            elif isinstance(node, ast.MatchClass):
                self.check_match_class(node)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) not in an.docstrings:
                    self.check_string(node)
            elif isinstance(node, ast.ClassDef):
                self.check_class(node)
            elif isinstance(node, FUNCS):
                self.check_attr_name(node.name, node.lineno, defines=True)
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                    if arg is not None:
                        self.check_annotation(arg.annotation, node.lineno)
                self.check_annotation(node.returns, node.lineno)

    # ----------------------------------------------------------------- imports and names

    def check_match_class(self, node: ast.MatchClass) -> None:
        """``case object(__globals__=g)`` reads the attribute ``__globals__`` of the subject: the pattern's keyword
        names are attribute reads no ``ast.Attribute`` shows (round 20: a function's globals, an exception's frame,
        and so the runner's ``sys.modules``, under ``strict``). Where the subject is a module, each is a use of
        ``module.name`` as well."""
        an = self.an
        parent = an.parents.get(id(node))
        subject = an.parents.get(id(parent)) if isinstance(parent, ast.match_case) else None
        q = an.qual(subject.subject) if isinstance(subject, ast.Match) else None
        for attr in node.kwd_attrs:
            self.check_attr_name(attr, node.lineno)
            if q:
                an.check_module_name(f"{q}.{attr}", node.lineno, "uses")

    def check_import_from(self, node: ast.ImportFrom) -> None:
        an = self.an
        if node.level or not node.module:
            an.add("harness_patch", node.lineno, f"imports `{'.' * node.level}{node.module or ''}` relative to "
                   "the package the candidate is loaded from, which may be the evaluator's")
            return
        an.check_import(node.module, node.lineno)
        for a in node.names:
            if a.name == "*":
                an.add("star_import", node.lineno, f"imports every name of `{node.module}` with `*`")
            else:
                an.check_module_name(f"{node.module}.{a.name}", node.lineno, "imports")

    def check_attr_name(self, attr: str, line: int, defines: bool = False) -> None:
        flag = ATTR_RULES.get(attr)
        if flag:
            if not defines or flag == "tensor_subclass":
                self.an.add(flag, line, f"{'defines' if defines else 'uses'} `{attr}`")
        elif not defines and is_dunder(attr) and attr not in DUNDER_OK:
            self.an.add("introspection", line, f"uses `{attr}`, an object internal kernel code has no use for")

    def check_dotted_names(self, text: str, line: int) -> None:
        """Every part of a dotted attribute name (``operator.attrgetter("f_back.f_globals")``)."""
        for part in text.split(".")[:20]:
            self.check_attr_name(part, line)

    def check_string(self, node: ast.Constant) -> None:
        an = self.an
        text = node.value
        if "/proc/" in text or "/dev/mem" in text or "/dev/kmem" in text:
            an.add("introspection", node.lineno, f"refers to `{text[:40]}`")
        elif "kb_gym" in text.lower():
            an.add("introspection", node.lineno, "refers to the evaluator (`kb_gym`) in a string")
        elif "{" in text and ";" in text and (hit := into_python(text)):  # C or C++ text
            an.add("introspection", node.lineno, f"reaches the Python interpreter from native code (`{hit}`)")
        elif len(text) < 200 and _DOTTED_NAME.fullmatch(text):
            name = next((p for p in text.split(".") if p in DANGEROUS_NAMES), None)
            if name:
                an.add("introspection", node.lineno, f"names `{name}` in a string")
        else:
            self.check_code_string(node)

    def check_builtin_value(self, node: ast.Name) -> None:
        """``eval``, ``getattr`` and the like used as a value (mapped, wrapped, stored) rather than called: what they
        will be given is not there to judge (round 22)."""
        an = self.an
        if not is_builtin(an.qual(node), *EVALUATING_BUILTINS):
            return
        parent = an.parents.get(id(node))
        if isinstance(parent, ast.Call) and parent.func is node:
            return
        names = const_strings(parent.args[1]) if (
            isinstance(parent, ast.Call) and an.qual(parent.func) == "functools.reduce" and node.id == "getattr"
            and len(parent.args) >= 2 and parent.args[0] is node) else None
        if names is not None:  # `functools.reduce(getattr, "block.0".split("."), self)`: a path of known names
            for name in names:
                self.check_attr_name(name, node.lineno)
                if name in DANGEROUS_NAMES:
                    an.add("introspection", node.lineno, f"reads `{name}` through `functools.reduce(getattr, ...)`")
            return
        an.add("dynamic_code", node.lineno, f"uses `{node.id}` as a value (`{short(parent or node, 50)}`), so what "
               "it evaluates or reads cannot be judged")

    def check_annotation(self, node: ast.expr | None, line: int) -> None:
        """An annotation is evaluated by whatever reads the function's type hints (``functools.singledispatch``'s
        ``register``, ``typing.get_type_hints``): one that names a value bound to anything but a type (a string built at
        run time) is text evaluated where the checks cannot read it (round 22)."""
        an = self.an
        if node is not None and not _type_like(node):  # the annotation itself: `x: "..."[::-1]` (round 23)
            an.add("dynamic_code", line, f"annotates with `{short(node, 40)}`, which is no type: whatever reads the "
                   "annotations evaluates it")
            return
        for sub in ast.walk(node) if node is not None else []:
            # a name bound nowhere here is a builtin's or an import's (or fails when evaluated)
            if not isinstance(sub, ast.Name) or sub.id not in an.stores or sub.id in an.imported:
                continue
            value = an.value_of(sub.id)
            if sub.id in an.classes or (value is not None and _type_like(value)):
                continue
            an.add("dynamic_code", line, f"annotates with `{sub.id}`, bound to a value that is no type, which whatever "
                   "reads the annotations evaluates")

    def check_code_string(self, node: ast.Constant) -> None:
        """A string that is Python code (an annotation evaluated later, text a library function runs): checked as
        code, its findings the string's (round 21: ``typing.get_type_hints`` on ``x: "__import__('sys').modules"``,
        ``torch.fx``'s exec of a text). Only text that parses and does something (a call, an import, an attribute
        read): an error message or a kernel's C++ does not parse; a bare name or dotted name is read above."""
        text = node.value
        depth = getattr(_CODE_DEPTH, "level", 0)
        if len(text) > CODE_STRING_CHARS or depth >= 2 or not any(c in text for c in "(.\n;="):
            return
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
            return
        if not any(isinstance(n, (ast.Call, ast.Import, ast.ImportFrom, ast.Attribute)) for n in ast.walk(tree)):
            return
        from kb_gym.integrity.static import static_findings  # the checks over the text, one level down

        _CODE_DEPTH.level = depth + 1
        try:
            inner = static_findings(text)
        finally:
            _CODE_DEPTH.level = depth
        for finding in inner:
            if finding.flag in ("introspection", "harness_patch", "dynamic_code", "concurrency", "io_escape",
                                "tensor_subclass", "unlisted_import"):
                self.an.add(finding.flag, node.lineno, f"a string that is Python code: {finding.message}")

    def check_class(self, node: ast.ClassDef) -> None:
        for stmt in node.body:  # the class's own namespace (round 21)
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
                stmt, (ast.AnnAssign, ast.AugAssign)) else []
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if isinstance(stmt, FUNCS):
                names.append(stmt.name)
            for name in names:
                if name in CLASS_NAMES_DENIED:
                    self.an.add("introspection", stmt.lineno, f"class `{node.name}` defines `{name}`, which decides "
                                "what a class pattern matches and reads")
            value = getattr(stmt, "value", None)
            module = self.an.is_module(value) if value is not None else None
            if module:  # `class K: m = collections`: `K.m` has no module root the checks could follow
                self.an.add("dynamic_code", stmt.lineno, f"keeps the module `{module}` in class `{node.name}`, "
                            "where the checks cannot follow what is done with it")
        for base in node.bases:
            q = self.an.qual(base)
            if q in TENSOR_BASES:
                self.an.add("tensor_subclass", node.lineno, f"class `{node.name}` subclasses `{q}`")

    def result_used(self, node: ast.AST) -> bool:
        """Whether the value of ``node`` is called, bound to a name, returned or reached into."""
        parents = self.an.parents
        child, parent = node, parents.get(id(node))
        while isinstance(parent, (ast.Tuple, ast.List, ast.Starred)):
            child, parent = parent, parents.get(id(parent))
        if isinstance(parent, ast.Call):
            return parent.func is child
        if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr, ast.Return, ast.Yield,
                               ast.YieldFrom, ast.Lambda)):
            return True
        return isinstance(parent, (ast.Attribute, ast.Subscript)) and parent.value is child

    def check_module_flow(self, node: ast.expr) -> None:
        """A module object used as a value (in a container, passed, returned, stored): its uses can't be read."""
        an = self.an
        parent = an.parents.get(id(node))
        if isinstance(parent, (ast.Attribute, ast.Subscript)) and parent.value is node:
            return
        if isinstance(parent, (ast.Expr, ast.Compare, ast.FormattedValue)):
            return
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
            return  # an alias: followed by the name resolution
        if isinstance(parent, ast.Call) and (parent.func is node or (
                any(a is node for a in parent.args) and self.module_arg_ok(parent))):
            return
        if isinstance(parent, (ast.If, ast.While, ast.Assert)) and parent.test is node:
            return
        if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
            return
        module = an.is_module(node)
        if module:
            where = short(parent, 50) if parent is not None else short(node)
            an.add("dynamic_code", node.lineno, f"passes the module `{module}` around as a value (`{where}`), "
                   "where the checks cannot follow what is done with it")

    def module_arg_ok(self, call: ast.Call) -> bool:
        """Calls that may take a module object: introspecting builtins, and calls other rules already judge."""
        q = self.an.qual(call.func)
        if is_builtin(q, *MODULE_ARG_OK) or (q is not None and self.an.ref_flag(q)):
            return True
        return isinstance(call.func, ast.Attribute) and call.func.attr in ("__setattr__", "__delattr__")

    def check_namespace_lookup(self, node: ast.Subscript) -> None:
        """``globals()[name]`` / ``vars(obj)[name]`` with a computed name, whose result is used."""
        value = node.value
        if not (isinstance(value, ast.Call) and is_builtin(self.an.qual(value.func), *_NAMESPACE_CALLS)):
            return
        key = const_str(node.slice)
        if key is None:
            name = self.an.fold(node.slice)
            if name is not None:
                self.check_dotted_names(name, node.lineno)
            if isinstance(node.ctx, ast.Load) and self.result_used(node):
                self.an.add("dynamic_code", node.lineno, f"looks a name up in a namespace by a computed key "
                            f"(`{short(node)}`)")

    # ----------------------------------------------------------------- stores

    def check_store(self, target: ast.AST, line: int, verb: str = "assigns to") -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.check_store(elt, line, verb)
        elif isinstance(target, ast.Starred):
            self.check_store(target.value, line, verb)
        elif isinstance(target, ast.Attribute):
            if target.attr == "__code__":
                self.an.add("introspection", line, f"{verb} `{short(target)}`, swapping a function's code")
                return
            if target.attr == "__class__":
                self.an.add("tensor_subclass", line, f"{verb} `{short(target)}`, changing an object's class")
                return
            q = self.an.qual(target)
            if q:
                self.module_store(q, line, verb)
        elif isinstance(target, ast.Subscript):
            self.check_subscript_store(target, line, verb)

    def check_subscript_store(self, target: ast.Subscript, line: int, verb: str) -> None:
        an = self.an
        container = target.value
        vq = an.qual(container)
        key = const_str(target.slice)
        if vq == "sys.modules":
            what = f"{verb} `sys.modules[{key!r}]`" if key else f"{verb} an entry of `sys.modules`"
            an.add("harness_patch", line, what)
        elif vq == "os.environ":
            if key not in ENV_ALLOW:
                what = f"{verb} `os.environ[{key!r}]`" if key else f"{verb} an environment variable"
                an.add("io_escape", line, what)
        elif isinstance(container, ast.Attribute) and container.attr == "__dict__" and an.qual(container.value):
            self.module_store(f"{an.qual(container.value)}.{key or '?'}", line, verb)
        elif (isinstance(container, ast.Call) and is_builtin(an.qual(container.func), "vars")
              and container.args and an.qual(container.args[0])):
            self.module_store(f"{an.qual(container.args[0])}.{key or '?'}", line, verb)
        elif vq:
            self.module_store(vq, line, f"{verb} an item of")

    # ----------------------------------------------------------------- calls

    def check_setattr(self, node: ast.Call, q: str | None) -> None:
        """setattr / delattr / ``object.__setattr__``: on modules a patch; with a computed name, dynamic code."""
        an = self.an
        line = node.lineno
        func = node.func
        args = node.args
        verb = "sets" if "set" in (q or func.attr) else "deletes"
        if len(args) < 2:
            return
        names = an.attr_names(args[1]) or []
        name = names[0] if len(names) == 1 else None
        for one in names:
            self.check_attr_name(one, line)
            if one == "__code__":
                an.add("introspection", line, f"{verb} `__code__` with {q or func.attr}")
            elif one == "__class__":
                an.add("tensor_subclass", line, f"{verb} `__class__` with {q or func.attr}")
        tq = an.qual(args[0])
        if tq:
            self.module_store(f"{tq}.{name}" if name else tq, line, f"{verb} (via setattr)")
        elif const_str(args[1]) is None and not an.is_loop_name(args[1]):
            an.add("dynamic_code", line, f"{verb} an attribute whose name is computed (`{short(node)}`)")

    def check_getattr(self, node: ast.Call, q: str) -> None:
        an = self.an
        line = node.lineno
        args = node.args
        names = an.attr_names(args[1])
        base = an.qual(args[0]) if is_builtin(q, "getattr") else None  # hasattr reads no value
        for name in names or []:
            self.check_attr_name(name, line)
            if base:
                an.check_module_name(f"{base}.{name}", line, "uses")
        if const_str(args[1]) is not None or an.is_loop_name(args[1]) or not is_builtin(q, "getattr"):
            return
        tq = an.qual(args[0])
        if tq:
            an.add("dynamic_code", line, f"reads an attribute of `{tq}` whose name is computed (`{short(node)}`)")
        elif self.result_used(node):
            an.add("dynamic_code", line, f"uses an attribute whose name is computed (`{short(node)}`)")

    def check_attr_getter(self, node: ast.Call, q: str) -> None:
        """operator.attrgetter / methodcaller / itemgetter: their strings are attribute (or key) names."""
        args = node.args[:1] if q.endswith("methodcaller") else node.args
        for arg in args:
            name = self.an.attr_name(arg)
            if name is not None:
                self.check_dotted_names(name, node.lineno)
            elif not q.endswith("itemgetter"):
                self.an.add("dynamic_code", node.lineno, f"calls `{q}` with a computed name (`{short(node)}`)")

    def check_call(self, node: ast.Call) -> None:
        an = self.an
        line = node.lineno
        func = node.func
        q = an.qual(func)
        args = node.args
        if an.is_import_call(node):  # getattr(torch, "nn"), __import__("torch"): a module object too
            self.check_module_flow(node)
        if is_builtin(q, "setattr", "delattr") or (
            isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__")
            and is_builtin(an.qual(func.value), "object", "type")
        ):
            self.check_setattr(node, q)
            return
        if isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__"):
            tq = an.qual(func.value)
            if tq:
                name = const_str(args[0]) if args else None
                self.module_store(f"{tq}.{name}" if name else tq, line, "sets (via __setattr__)")
            return
        if isinstance(func, ast.Attribute):
            self.check_attr_name(func.attr, line)
            if func.attr in MUTATORS:
                self.check_mutator(node, func)
        if is_builtin(q, "getattr", "hasattr") and len(args) >= 2:
            self.check_getattr(node, q)
        elif is_builtin(q, "vars") and args and an.qual(args[0]) and id(node) not in an.const_indexed:
            an.add("dynamic_code", line, f"reads the namespace of `{an.qual(args[0])}` with `vars`")
        if q is None:
            self.check_path_method(node)
            return
        if q in ATTR_GETTERS:
            self.check_attr_getter(node, q)
        elif is_builtin(q, "exec", "eval", "compile"):
            an.add("dynamic_code", line, f"calls `{q.removeprefix('builtins.')}`")
        elif is_builtin(q, "__import__") or q == "importlib.import_module":
            name = const_str(args[0]) if args else None
            if name is None:
                an.add("dynamic_code", line, f"imports a module whose name is computed (`{short(node)}`)")
            else:
                an.check_import(name, line)
        elif q in PRECISION_CALLS or (
            q.startswith("torch.backends.")
            and q.rsplit(".", 1)[-1].startswith(("set_", "enable", "allow", "preferred"))
        ):
            an.add("precision_change", line, f"calls `{q}`")
        elif q.startswith("torch.library."):
            strings = [const_str(a) for a in [*args, *(k.value for k in node.keywords)]]
            if any(s and (s == "aten" or s.startswith("aten::") or s.startswith("aten.")) for s in strings):
                an.add("tensor_subclass", line, f"overrides an aten operator with `{q}`")
        elif q in OPEN_CALLS:
            self.check_open(node, q)
        elif q in PATH_CALLS:
            self.check_path_call(node, q)
        self.check_path_method(node)
