"""No extension build that reaches the Python interpreter from C++, judged on the text the build is given.

The static checks read the candidate's strings (integrity/checks.py, ``INTO_PYTHON``); a source composed at run time
(pieces joined, a template filled) is seen only here, in the runner, where ``load_inline`` and ``load`` are called:
a source that names ``py::exec``, an import, CPython's API or token pasting is refused before the compiler runs, a
``compile_error`` that says why (round 20). Like every check in the runner, defence in depth: native code that is
built can do anything in its process, which is why the runner holds nothing the verdict rests on.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kb_gym.integrity.names import INTO_PYTHON

MAX_SOURCE_BYTES = 8 << 20  # a source file read to check it (kernels are kilobytes)


class NativeSourceRefused(RuntimeError):
    pass


def _texts(sources: Any) -> Iterable[str]:
    if isinstance(sources, str):
        yield sources
    elif isinstance(sources, list | tuple):
        for s in sources:
            if isinstance(s, str):
                yield s


def _files(paths: Any) -> Iterable[str]:
    for p in [paths] if isinstance(paths, str | Path) else paths if isinstance(paths, list | tuple) else []:
        try:
            with open(p, "rb") as f:
                yield f.read(MAX_SOURCE_BYTES).decode("utf-8", "replace")
        except (OSError, TypeError):
            continue  # the build itself says what is wrong with it


def check(texts: Iterable[str]) -> None:
    for text in texts:
        hit = INTO_PYTHON.search(text)
        if hit:
            raise NativeSourceRefused(f"the extension's source reaches the Python interpreter (`{hit.group(0).strip()}`"
                                      "): kernels and their bindings have no use for it")


def install() -> None:
    """Wrap ``load_inline`` and ``load`` of ``torch.utils.cpp_extension`` in this process (outermost: what the
    candidate passes is what is read)."""
    import torch.utils.cpp_extension as cpp_extension

    inline, files = cpp_extension.load_inline, cpp_extension.load

    @functools.wraps(inline)
    def load_inline(name: Any, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        check([*_texts(cpp_sources), *_texts(cuda_sources), *_texts(kwargs.get("sycl_sources"))])
        return inline(name, cpp_sources, cuda_sources, *args, **kwargs)

    @functools.wraps(files)
    def load(name: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        check(_files(sources))
        return files(name, sources, *args, **kwargs)

    cpp_extension.load_inline, cpp_extension.load = load_inline, load
