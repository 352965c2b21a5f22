"""Small AST helpers shared by the checks: walking without entering definitions, statement blocks, short text,
and folding strings built from pieces (``"li" + "brary"``, f-strings, ``"".join(chr(c) for c in ...)``)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator

DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)

_MAX_FOLD = 2_000  # longest string folded (names are short; this bounds "a" * 10**9)
_MAX_FOLD_DEPTH = 30


def is_builtin(q: str | None, *names: str) -> bool:
    return q is not None and any(q == n or q == f"builtins.{n}" for n in names)


def const_str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def const_strings(node: ast.AST | None) -> list[str] | None:
    """The strings of a literal list or tuple of them, or of ``"a.b".split(".")``; else None."""
    if isinstance(node, (ast.List, ast.Tuple)) and all(const_str(e) is not None for e in node.elts):
        return [e.value for e in node.elts]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "split"
            and const_str(node.func.value) is not None and len(node.args) == 1 and const_str(node.args[0])):
        return node.func.value.value.split(node.args[0].value)
    return None


def const_int(node: ast.AST | None) -> int | None:
    """An integer literal, negative ones (``-1``, a unary minus in the tree) included."""
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        sign, node = -1, node.operand
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return sign * node.value
    return None


def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def walk(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every node below ``nodes`` (included), not entering nested function or class bodies."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, DEFS):
            continue
        stack.extend(ast.iter_child_nodes(node))


def short(node: ast.AST, limit: int = 60) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # noqa: BLE001 - unparse of odd trees must not break the checks
        return "..."
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def stmt_blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested directly in ``stmt`` (not in nested definitions)."""
    if isinstance(stmt, DEFS):
        return []
    blocks = []
    for name in ("body", "orelse", "finalbody"):
        block = getattr(stmt, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            blocks.append(block)
    for handler in getattr(stmt, "handlers", ()) or ():
        blocks.append(handler.body)
    for case in getattr(stmt, "cases", ()) or ():
        blocks.append(case.body)
    return blocks


def terminates(block: list[ast.stmt]) -> bool:
    return bool(block) and isinstance(block[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def arithmetic(expr: ast.AST) -> str | None:
    for sub in ast.walk(expr):
        if isinstance(sub, (ast.BinOp, ast.UnaryOp)) and not isinstance(sub.op, ast.Not):
            return short(expr, 40)
    return None


def flat_targets(targets: Iterable[ast.AST]) -> Iterator[ast.AST]:
    stack = list(targets)
    while stack:
        t = stack.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            stack.extend(t.elts)
        elif isinstance(t, ast.Starred):
            stack.append(t.value)
        else:
            yield t


def stmt_exprs(stmt: ast.stmt) -> Iterator[ast.AST]:
    """The expression nodes of ``stmt`` itself (not of the statements nested in it)."""
    stack = [c for c in ast.iter_child_nodes(stmt)
             if not isinstance(c, (ast.stmt, ast.excepthandler, ast.match_case))]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(ast.iter_child_nodes(node))


# --------------------------------------------------------------------------------------------- folding

_Value = str | bytes | int


def fold_str(node: ast.AST | None, lookup: Callable[[str], ast.AST | None] | None = None) -> str | None:
    """The text a string expression built from constant pieces evaluates to, else None (nothing is run).

    Folds concatenation and repetition, ``%`` and ``.format``, f-strings of constants, ``sep.join(...)`` of
    constants, ``chr`` / ``map(chr, ...)`` / generator expressions over constant sequences, ``bytes(...)`` and
    ``.decode()``, slicing and the case / strip / replace methods; ``lookup`` resolves a name to the one value
    it is assigned, if any.
    """
    try:
        value = _fold(node, lookup, 0)
    except Exception:  # noqa: BLE001 - "{0.a}".format(0), range(0, 1, 0): what Python would raise, the fold gives up on
        return None  # (it raised out of the checks, which then returned what they had found so far: round 12)
    return value if isinstance(value, str) else None


def _fold(node: ast.AST | None, lookup, depth: int) -> _Value | list | None:
    if node is None or depth > _MAX_FOLD_DEPTH:
        return None
    d = depth + 1
    if isinstance(node, ast.Constant):
        v = node.value
        return v if isinstance(v, (str, bytes, int)) and not isinstance(v, bool) else None
    if isinstance(node, ast.UnaryOp):
        return const_int(node)
    if isinstance(node, ast.Name):
        target = lookup(node.id) if lookup is not None else None
        return _fold(target, lookup, d) if target is not None else None
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_fold(e, lookup, d) for e in node.elts]
        return items if all(i is not None and not isinstance(i, list) for i in items) else None
    if isinstance(node, ast.BinOp):
        return _fold_binop(node, lookup, d)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.FormattedValue):
                if v.format_spec is not None:
                    return None
                inner = _fold(v.value, lookup, d)
                if inner is None or isinstance(inner, list):
                    return None
                parts.append(repr(inner) if v.conversion == ord("r") else str(inner))
            else:
                inner = _fold(v, lookup, d)
                if not isinstance(inner, str):
                    return None
                parts.append(inner)
        return _bounded("".join(parts))
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        base = _fold(node.value, lookup, d)
        parts = (node.slice.lower, node.slice.upper, node.slice.step)
        bounds = [_fold(b, lookup, d) if b is not None else None for b in parts]
        if (isinstance(base, (str, bytes)) and all(isinstance(b, int) for b, p in zip(bounds, parts, strict=True)
                                                   if p is not None)):
            try:
                return base[slice(*bounds)]
            except (ValueError, TypeError):
                return None
        return None
    if isinstance(node, (ast.GeneratorExp, ast.ListComp)):
        return _fold_comprehension(node, lookup, d)
    if isinstance(node, ast.Call):
        return _fold_call(node, lookup, d)
    return None


def _bounded(value: _Value | None) -> _Value | None:
    if isinstance(value, (str, bytes)) and len(value) > _MAX_FOLD:
        return None
    return value


def _fold_binop(node: ast.BinOp, lookup, d: int) -> _Value | None:
    left, right = _fold(node.left, lookup, d), _fold(node.right, lookup, d)
    if left is None or right is None:
        return None
    try:
        if isinstance(node.op, ast.Add) and type(left) is type(right) and not isinstance(left, list):
            return _bounded(left + right)
        if isinstance(node.op, ast.Mult):
            if isinstance(left, (str, bytes)) and isinstance(right, int) and len(left) * max(right, 0) <= _MAX_FOLD:
                return left * right
            if isinstance(right, (str, bytes)) and isinstance(left, int) and len(right) * max(left, 0) <= _MAX_FOLD:
                return right * left
            return None
        if isinstance(node.op, ast.Mod) and isinstance(left, str):
            args = tuple(right) if isinstance(right, list) else right
            return _bounded(left % args)
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def _fold_sequence(node: ast.AST, lookup, d: int) -> list | None:
    """A constant sequence: a list / tuple, ``range(...)`` of constants, or ``map(chr, ...)``."""
    value = _fold(node, lookup, d)
    if isinstance(value, list):
        return value
    if isinstance(value, (str, bytes)):
        return list(value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        args = [_fold(a, lookup, d) for a in node.args]
        if node.func.id == "range" and args and all(isinstance(a, int) for a in args) and not node.keywords:
            r = range(*args)
            return list(r) if len(r) <= _MAX_FOLD else None
        if node.func.id == "map" and len(node.args) == 2 and isinstance(node.args[0], ast.Name):
            seq = _fold_sequence(node.args[1], lookup, d)
            fn = node.args[0].id
            if seq is None:
                return None
            try:
                if fn == "chr":
                    return [chr(c) for c in seq]
                if fn == "str":
                    return [str(c) for c in seq]
            except (TypeError, ValueError, OverflowError):
                return None
    return None


def _fold_comprehension(node: ast.GeneratorExp | ast.ListComp, lookup, d: int) -> list | None:
    if len(node.generators) != 1:
        return None
    gen = node.generators[0]
    if gen.ifs or gen.is_async or not isinstance(gen.target, ast.Name):
        return None
    seq = _fold_sequence(gen.iter, lookup, d)
    if seq is None or len(seq) > _MAX_FOLD:
        return None
    var = gen.target.id
    out = []
    for item in seq:
        value = _fold(node.elt, lambda n, _item=item: ast.Constant(_item) if n == var else (
            lookup(n) if lookup else None), d)
        if value is None or isinstance(value, list):
            return None
        out.append(value)
    return out


def _fold_call(node: ast.Call, lookup, d: int) -> _Value | list | None:
    func = node.func
    if node.keywords and not (isinstance(func, ast.Attribute) and func.attr in ("decode", "format")):
        return None
    try:
        if isinstance(func, ast.Name):
            if func.id == "chr" and len(node.args) == 1:
                code = _fold(node.args[0], lookup, d)
                return chr(code) if isinstance(code, int) else None
            if func.id in ("bytes", "bytearray") and len(node.args) == 1:
                seq = _fold_sequence(node.args[0], lookup, d)
                return bytes(seq) if seq is not None and all(isinstance(c, int) for c in seq) else None
            if func.id == "str" and len(node.args) == 1:
                inner = _fold(node.args[0], lookup, d)
                return str(inner) if isinstance(inner, (str, int)) else None
            return None
        if not isinstance(func, ast.Attribute):
            return None
        base = _fold(func.value, lookup, d)
        if func.attr == "join" and isinstance(base, (str, bytes)) and len(node.args) == 1:
            seq = _fold_sequence(node.args[0], lookup, d)
            if seq is None or not all(type(s) is type(base) for s in seq):
                return None
            return _bounded(base.join(seq))
        if func.attr == "decode" and isinstance(base, bytes):
            return base.decode("utf-8", "replace")
        if func.attr == "encode" and isinstance(base, str) and not node.args:
            return base.encode()
        if func.attr == "format" and isinstance(base, str):
            args = [_fold(a, lookup, d) for a in node.args]
            kwargs = {k.arg: _fold(k.value, lookup, d) for k in node.keywords if k.arg}
            if any(a is None or isinstance(a, list) for a in [*args, *kwargs.values()]):
                return None
            return _bounded(base.format(*args, **kwargs))
        if isinstance(base, str) and func.attr in ("lower", "upper", "strip", "lstrip", "rstrip", "replace",
                                                   "swapcase", "title", "capitalize", "casefold"):
            args = [_fold(a, lookup, d) for a in node.args]
            if any(not isinstance(a, (str, int)) for a in args):
                return None
            return _bounded(getattr(base, func.attr)(*args))
    except (TypeError, ValueError, OverflowError, KeyError, IndexError):
        return None
    return None
