"""Which ``__global__`` kernels a CUDA source launches, read from its text.

The launch counter credits an extension as a kernel on a GPU only where its CUDA sources launch one of their own
``__global__`` functions. A ``__global__`` that sits in a comment or a string, or is defined and never launched,
is decoration beside ``torch::`` ops (the function is PyTorch under another name), so it earns nothing.

This is a reading of the text, not of what runs: a kernel launched ``<<<1, 1>>>`` to touch one element beside
``torch::`` ops still passes it (the knockout, per extension function, does not tell either; docs/integrity.md).
"""

from __future__ import annotations

import re

# One pass, so that a comment opener inside a string (or a quote inside a comment) is read as what it is in.
_COMMENT_OR_LITERAL = re.compile(
    r"""//[^\n]*|/\*.*?(?:\*/|\Z)|R"([^()\\\s]{0,16})\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'""",
    re.DOTALL,
)
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^()]*\)")
# The declarator's name is the last identifier before its parameter list: ``__global__ void __launch_bounds__(256)
# k(...)``, ``template <typename T> __global__ void k(...)``, ``extern "C" __global__ void k(...)``.
_KERNEL_NAME = re.compile(r"\b__global__\b[^;{}()]*?\b([A-Za-z_]\w*)\s*\(")
# Template arguments of a launch, one level of nesting deep: ``k<float, Tile<4>><<<g, b>>>``.
_TEMPLATE_ARGS = r"(?:<(?:[^<>;{}]|<[^<>;{}]*>)*>)?"
_LAUNCH_CALL = re.compile(r"\b(?:cudaLaunch\w*|cuLaunch\w*)\s*\(")
_MACRO_WITH_LAUNCH = re.compile(r"^[ \t]*#[ \t]*define\b[^\n]*<<<", re.MULTILINE)


def code_only(source: str) -> str:
    """The source with its comments and string and character literals blanked (kept as a space each)."""
    return _COMMENT_OR_LITERAL.sub(" ", source)


def _kernel_code(sources: list[str]) -> str:
    """The sources as one text, comments, literals and ``__launch_bounds__`` blanked: what the patterns read."""
    return _LAUNCH_BOUNDS.sub(" ", " \n".join(code_only(s) for s in sources))


def defined_kernels(source: str) -> list[str]:
    """Names of the ``__global__`` functions the source defines or declares (comments and strings left out)."""
    return _KERNEL_NAME.findall(_kernel_code([source]))


def launches_own_kernel(sources: list[str]) -> bool:
    """Whether the sources launch one of the ``__global__`` functions they define: ``k<<<...>>>`` (template
    arguments allowed), or ``k`` named inside a ``cudaLaunch*`` / ``cuLaunch*`` call. Where a macro holds a
    ``<<<`` launch, a kernel named anywhere besides its own declarations counts, as the macro may launch it."""
    code = _kernel_code(sources)
    names = set(_KERNEL_NAME.findall(code))
    if not names:
        return False
    launch_macro = bool(_MACRO_WITH_LAUNCH.search(code))
    for name in names:
        if re.search(rf"\b{re.escape(name)}\s*{_TEMPLATE_ARGS}\s*<<<", code):
            return True
        named = re.compile(rf"\b{re.escape(name)}\b")
        if any(named.search(_call_arguments(code, m.end())) for m in _LAUNCH_CALL.finditer(code)):
            return True
        if launch_macro and _named_outside_declarations(code, name):
            return True
    return False


def _call_arguments(code: str, start: int) -> str:
    """The text from ``start`` (just after a call's opening parenthesis) to its closing one."""
    depth = 1
    for i in range(start, min(len(code), start + 4096)):
        if code[i] == "(":
            depth += 1
        elif code[i] == ")":
            depth -= 1
            if depth == 0:
                return code[start:i]
    return code[start : start + 4096]


def _named_outside_declarations(code: str, name: str) -> bool:
    declared_at = {m.start(1) for m in _KERNEL_NAME.finditer(code) if m.group(1) == name}
    return any(m.start() not in declared_at for m in re.finditer(rf"\b{re.escape(name)}\b", code))
