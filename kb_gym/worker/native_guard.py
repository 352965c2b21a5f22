"""No extension build that reaches the Python interpreter from C++, judged on what the build is given and on what
it built.

The static checks read the candidate's strings (integrity/checks.py, ``INTO_PYTHON``); a source composed at run time
(pieces joined, a template filled) is seen only here, in the runner, where ``load_inline`` and ``load`` are called:
a source that names ``py::exec``, an import, CPython's entry points or the dynamic linker is refused before the
compiler runs (round 20), and so is one whose own macros paste such a name together, read as the preprocessor expands
it with its own headers read in and the system headers left out (``expanded``; round 22). Whatever spelling is left
(a macro of a system header that pastes, an ``__asm__`` label: round 21), a library that calls the interpreter's
evaluation links it: before a built library is loaded, its undefined dynamic symbols are read from its ELF file, and
one of ``DENIED_SYMBOLS`` refuses it. (An honest pybind11 extension links ``PyObject_GetAttrString``,
``PyEval_GetBuiltins`` and ``PyFrame_GetBack`` for its own machinery, and ``pybind11/numpy.h`` links
``PyImport_ImportModule``, so those cannot be told from a candidate's use of them at that level; none links
``PyRun_*``, ``Py_CompileString*``, ``PySys_*`` or ``dlsym``.) Either is a ``compile_error`` that says why. Like every
check in the runner, defence in depth: native code that is built can do anything in its process, which is why the
runner holds nothing the verdict rests on.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import struct
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kb_gym.integrity.names import into_python
from kb_gym.worker import header_diet

MAX_SOURCE_BYTES = 8 << 20  # a source file read to check it (kernels are kilobytes)
MAX_LIBRARY_BYTES = 1 << 30  # a built library read for its symbols
# Undefined symbols no kernel's library needs: the interpreter's evaluation, imports and system state, code objects,
# and the dynamic linker (which would find any of them by name)
DENIED_SYMBOLS = re.compile(r"_?Py(?:Run|Sys|Marshal|Code|Function)_\w*|Py_CompileString\w*"
                            r"|PyImport_(?!ImportModule$)\w*"  # pybind11/numpy.h imports numpy's C API module
                            r"|PyEval_(?:EvalCode\w*|EvalFrame\w*|GetGlobals|GetLocals|GetFrame\w*|MergeCompilerFlags)"
                            r"|_?_?(?:libc_)?dl(?:sym|vsym|open|mopen|_sym)")


class NativeSourceRefused(RuntimeError):
    pass


def _listed(value: Any) -> list[Any]:
    """A source argument as torch takes it: one item, or a list or tuple of them."""
    return list(value) if isinstance(value, list | tuple) else [value] if value is not None else []


def _texts(sources: Any) -> list[str]:
    return [s for s in _listed(sources) if isinstance(s, str)]


def _files(paths: list[Any]) -> Iterable[str]:
    for p in paths:
        try:
            with open(p, "rb") as f:
                yield f.read(MAX_SOURCE_BYTES).decode("utf-8", "replace")
        except (OSError, TypeError):
            continue  # the build itself says what is wrong with it


# The candidate's own text through the preprocessor, system headers left out: a name its macros paste together
# (`J(PyEv, al_GetBuiltins)`, round 22) reads whole there. Its own headers (an `#include "x.h"` of a file it wrote,
# an absolute path) are read in; stand-ins for the pasting macros of torch's and pybind11's headers, which it may use
# without defining them. A name pasted by a macro of another system header is left to the library's symbols.
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]*)[>"][^\n]*$', re.MULTILINE)
_PASTING = "".join(f"#define {name}(a, b) a##b\n" for name in (
    "C10_CONCATENATE", "C10_CONCATENATE_IMPL", "AT_CONCAT", "AT_CONCAT_AUX", "PYBIND11_CONCAT", "ITT_JOIN",
    "ITT_JOIN_AUX", "TH_CONCAT_2", "TH_CONCAT_2_EXPAND")) + "".join(
    f"#define {name}(a, b, c) a##b##c\n" for name in ("TH_CONCAT_3", "TH_CONCAT_3_EXPAND")) + "".join(
    f"#define {name}(a, b, c, d) a##b##c##d\n" for name in ("TH_CONCAT_4", "TH_CONCAT_4_EXPAND"))
MAX_INCLUDES = 64


def _flattened(text: str, dirs: list[Path], seen: set[str]) -> str:
    """``text`` with system includes dropped and the candidate's own included files read in, once each."""
    def include(match: re.Match) -> str:
        bracket, name = match.group(1), match.group(2)
        path = Path(name)
        if bracket == "<" and not path.is_absolute():
            return ""  # a system header: its macros are not the candidate's (stand-ins above)
        for found in [path] if path.is_absolute() else [folder / path for folder in dirs]:
            key = str(found.resolve()) if found.is_file() else ""
            if key and key not in seen and len(seen) < MAX_INCLUDES:
                seen.add(key)
                try:
                    inner = found.read_bytes()[:MAX_SOURCE_BYTES].decode("utf-8", "replace")
                except OSError:
                    return ""
                return _flattened(inner, [found.parent, *dirs], seen)
        return ""
    return _INCLUDE.sub(include, text)


def expanded(text: str, dirs: Iterable[str | Path] = ()) -> str:
    """``text`` as the C preprocessor expands it without the system headers, or "" where none could run. ``dirs``:
    where its quoted includes are looked for (the build folder, extra include paths)."""
    compiler = shutil.which(os.environ.get("CXX") or "c++") or shutil.which("cpp")
    if compiler is None or "#" not in text:
        return ""
    command = [compiler, "-E", "-P", "-w", "-x", "c++", "-std=c++17", "-nostdinc", "-"]
    source = _PASTING + _flattened(text, [Path(d) for d in dirs], set())
    try:
        done = subprocess.run(command, input=source, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout


def check(texts: Iterable[str], preprocess: bool = True, dirs: Iterable[str | Path] = ()) -> None:
    dirs = list(dirs)
    for text in texts:
        hit = into_python(text) or (into_python(expanded(text, dirs)) if preprocess else None)
        if hit:
            raise NativeSourceRefused(f"the extension's source reaches the Python interpreter (`{hit}`): kernels and "
                                      "their bindings have no use for it")


def _include_dirs(name: Any, kwargs: dict[str, Any]) -> list[str]:
    """Where a build's quoted includes are found: its build folder and the extra include paths it is given."""
    folder = header_diet.build_directory(name, kwargs) if isinstance(name, str) else None
    return [str(d) for d in [folder, *_listed(kwargs.get("extra_include_paths"))] if d]


def undefined_symbols(path: str | Path) -> list[str]:
    """The undefined symbols of an ELF library's dynamic symbol table (what the loader will look up for it)."""
    with open(path, "rb") as f:
        data = f.read(MAX_LIBRARY_BYTES)
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # 64-bit little-endian only (Linux x86-64, aarch64)
        raise NativeSourceRefused(f"{Path(path).name} is not a library this runner can read")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + k * shentsize) for k in range(shnum)]
    names: list[str] = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 11 or not entsize:  # SHT_DYNSYM
            continue
        strings = sections[link]
        base = strings[4]
        for k in range(size // entsize):
            name_at, _, _, shndx = struct.unpack_from("<IBBH", data, offset + k * entsize)
            if shndx == 0 and name_at:
                end = data.index(b"\0", base + name_at)
                names.append(data[base + name_at:end].decode("ascii", "replace"))
    return names


def check_library(path: str | Path) -> None:
    try:
        denied = sorted({name for name in undefined_symbols(path) if DENIED_SYMBOLS.fullmatch(name.split("@")[0])})
    except (OSError, struct.error, ValueError, IndexError) as exc:
        raise NativeSourceRefused(f"the built library could not be read for its symbols ({exc})") from None
    if denied:
        raise NativeSourceRefused(f"the built library calls into the Python interpreter or the dynamic linker "
                                  f"({', '.join(denied[:4])}): kernels and their bindings have no use for it")


def install() -> None:
    """Wrap ``load_inline`` and ``load`` of ``torch.utils.cpp_extension`` in this process (outermost: what the
    candidate passes is what is read)."""
    import torch
    import torch.utils.cpp_extension as cpp_extension

    inline, files = cpp_extension.load_inline, cpp_extension.load

    @functools.wraps(inline)
    def load_inline(name: Any, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        check([*_texts(cpp_sources), *_texts(cuda_sources), *_texts(kwargs.get("sycl_sources"))],
              dirs=_include_dirs(name, kwargs))
        return inline(name, cpp_sources, cuda_sources, *args, **kwargs)

    @functools.wraps(files)
    def load(name: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        paths = [p for p in _listed(sources) if isinstance(p, str | Path)]
        check(_files(paths), dirs=[*{str(Path(p).parent) for p in paths}, *_include_dirs(name, kwargs)])
        return files(name, sources, *args, **kwargs)

    library_import = getattr(cpp_extension, "_import_module_from_library", None)
    if library_import is not None:  # every build of load and load_inline is loaded through it (torch 2.x)
        suffix = getattr(cpp_extension, "LIB_EXT", ".so")

        @functools.wraps(library_import)
        def import_library(module_name: Any, path: Any, is_python_module: Any) -> Any:
            check_library(Path(path) / f"{module_name}{suffix}")
            return library_import(module_name, path, is_python_module)

        cpp_extension._import_module_from_library = import_library
    ops_load = torch.ops.load_library

    @functools.wraps(ops_load)
    def load_library(path: Any) -> Any:
        check_library(path)
        return ops_load(path)

    cpp_extension.load_inline, cpp_extension.load = load_inline, load
    torch.ops.load_library = load_library
