"""A precompiled ``torch/extension.h`` for candidates' ``load_inline`` builds.

Parsing the torch headers is most of a cold C++ build: 17-19 s of a 19 s CPU extension build on a 2-core
machine, 7 s with the header precompiled (docs/benchmarks.md). For a CUDA candidate it is the binding
translation unit (``main.cpp``, g++) that includes them; nvcc takes no GCC precompiled header.

GCC uses ``torch/extension.h.gch`` in place of the header when it finds it first on the include path and
it was built with the same options and macros. So each *variant* (C++ only or with CUDA, and the candidate's
``-O`` flag, the only ``extra_cflags`` a variant may carry) is built once per toolchain, by the judge's side,
never by a runner: the flags come from the build file torch itself writes for an extension, minus
``-DTORCH_EXTENSION_NAME`` (a macro the header does not use; a PCH built with a name refuses every other
name). A variant is written to a temporary folder and renamed into place with a ``ready`` marker, so a
half-built one is never used; a failed build leaves a ``failed`` marker and is not retried by the judges.

In a runner, :func:`install` wraps ``torch.utils.cpp_extension.load_inline`` before the candidate is
imported: a call with a known variant gets the variant's folder first on its include path (ready or not,
so that its build arguments, which torch and the build cache compare, do not change when the header
appears), and the variants asked for that were not ready are reported to the judge, which starts their builds in the
background (``start_build``, a low-priority process; only names from :data:`VARIANTS`). The runner reads the
folder only where Landlock confines it (writes only in its scratch folder): an unconfined runner could
rewrite a header every later build includes, so it gets no PCH; and before each build a candidate may start
the judge checks every ready variant's files against the size, inode and change time recorded when it was
built (``verify``), removing one that changed (written by some unconfined process on the host). A header that
does not match a build's flags is ignored by GCC, which then reads the plain copy beside it: a mismatch costs
speed, never a build.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENV_DIR = "KB_GYM_PCH_DIR"
OPT_FLAGS = ("", "-O2", "-O3")
VARIANTS = tuple(f"{lang}{opt}" for lang in ("cpp", "cuda") for opt in OPT_FLAGS)
READY, FAILED = "ready", "failed"


def root_for(extensions_root: Path | None, tools: str, device_type: str) -> Path | None:
    """The PCH folder of this toolchain, beside the build cache; None where there is no cache, or
    ``KB_GYM_PCH`` is ``0``, or it is ``auto`` (the default) and the device is the CPU: a header is 0.8 GB and
    half a minute of a core to build, worth it where CUDA candidates are built, not for a test suite's few
    C++ extensions (``KB_GYM_PCH=1`` turns it on there)."""
    mode = os.environ.get("KB_GYM_PCH", "auto").lower()
    if extensions_root is None or mode in ("0", "off") or (mode == "auto" and device_type != "cuda"):
        return None
    return extensions_root.parent / "pch" / hashlib.sha256(tools.encode()).hexdigest()[:16]


def variant_for(cuda_sources: Any, kwargs: dict[str, Any]) -> str | None:
    """The variant a ``load_inline`` call can use, or None where its options would not match any."""
    if any(kwargs.get(k) for k in ("no_implicit_headers", "use_pch", "sycl_sources", "extra_include_paths")):
        return None
    flags = kwargs.get("extra_cflags") or []
    if isinstance(flags, str):
        flags = [flags]
    # Blank flags reach the compiler as empty words, which change nothing: KernelBench's example answer passes
    # ``extra_cflags=[""]`` and policies copy it.
    flags = [f for f in flags if not (isinstance(f, str) and not f.strip())]
    if len(flags) > 1 or any(f not in OPT_FLAGS[1:] for f in flags):
        return None
    lang = "cuda" if cuda_sources or kwargs.get("with_cuda") else "cpp"
    return lang + (flags[0] if flags else "")


def install(root: Path) -> dict[str, list[str]]:
    """Wrap ``load_inline`` so that calls use the ready variants under ``root``; returns the record of what
    was used and what was wanted, filled as the candidate's module builds."""
    import torch.utils.cpp_extension as cpp_extension

    record: dict[str, list[str]] = {"used": [], "wanted": []}
    original = cpp_extension.load_inline

    @functools.wraps(original)
    def load_inline(name: str, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        variant = None if args else variant_for(cuda_sources, kwargs)
        if variant is not None:
            # On the path whether built yet or not (a missing folder is skipped by the compiler): the build's
            # arguments stay the same, so an extension built before the header was ready is not rebuilt.
            folder = root / variant
            kwargs["extra_include_paths"] = [str(folder)]
            if (folder / READY).is_file():
                record["used"].append(variant)
            elif variant not in record["wanted"]:
                record["wanted"].append(variant)
        return original(name, cpp_sources, cuda_sources, *args, **kwargs)

    cpp_extension.load_inline = load_inline
    return record


def start_build(root: Path, variant: str) -> bool:
    """Start building ``variant`` in the background unless it is ready, failed, unknown or being built."""
    if variant not in VARIANTS or (root / variant / READY).is_file() or (root / f"{variant}.{FAILED}").exists():
        return False
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{variant}.log", "ab") as log:
        subprocess.Popen([sys.executable, "-P", "-m", "kb_gym.worker.pch", str(root), variant], stdout=log,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    return True


def prebuild(root: Path | None, device_type: str) -> bool:
    """On a CUDA judge, start building the variant of a CUDA candidate without compiler flags (ours, and
    KernelBench's example) before any candidate asks for it: built on a candidate's first request, the header
    is not ready for that candidate nor for those beside it (on the H200, CUDA builds of a fresh machine
    loaded in 14.4-16.4 s without it; 7.9-11.0 s with it, docs/benchmarks.md 0i). Once per toolchain and
    machine; a no-op when it is ready, failed, or there is no PCH folder."""
    return root is not None and device_type == "cuda" and start_build(root, "cuda")


def wait_ready(root: Path | None, variant: str, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``variant`` under ``root`` to be ready; False if it is not by then
    (or failed, or there is no PCH folder)."""
    deadline = time.monotonic() + timeout
    while root is not None and not (root / f"{variant}.{FAILED}").exists():
        if (root / variant / READY).is_file():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return False


def _signature(folder: Path) -> list[list[Any]]:
    """What any write to a variant's files changes: each file's size, inode and change time (``ctime``, which
    no process can set back)."""
    out = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != READY):
        st = path.stat()
        out.append([str(path.relative_to(folder)), st.st_size, st.st_ino, st.st_ctime_ns])
    return out


def verify(root: Path) -> list[str]:
    """Remove every ready variant whose files changed since they were built (where runners are not confined,
    another process could have rewritten them); returns the variants removed. The judge calls it before each
    build a candidate may start."""
    removed = []
    for marker in root.glob(f"*/{READY}"):
        folder = marker.parent
        try:
            ok = json.loads(marker.read_text()).get("files") == _signature(folder)
        except (OSError, ValueError, AttributeError):
            ok = False
        if not ok:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed


def compile_flags(variant: str) -> tuple[str, str]:
    """The compiler and the flags torch would give ``main.cpp`` of an extension of this variant, without the
    extension's name: read from the build file torch writes (its own function, so they follow torch)."""
    import torch.utils.cpp_extension as cpp_extension

    lang = "cuda" if variant.startswith("cuda") else "cpp"
    opt = variant[len(lang):]
    with tempfile.TemporaryDirectory() as tmp:
        main = Path(tmp) / "main.cpp"
        main.write_text("#include <torch/extension.h>\n")
        args = dict(path=str(Path(tmp) / "build.ninja"), name="kb_gym_pch", sources=[str(main)],
                    extra_cflags=[opt] if opt else [], extra_cuda_cflags=[], extra_sycl_cflags=[], extra_ldflags=[],
                    extra_include_paths=[], with_cuda=lang == "cuda", with_sycl=False, is_standalone=False)
        accepted = inspect.signature(cpp_extension._write_ninja_file_to_build_library).parameters
        cpp_extension._write_ninja_file_to_build_library(**{k: v for k, v in args.items() if k in accepted})
        text = (Path(tmp) / "build.ninja").read_text()
    cxx = re.search(r"^cxx = (.*)$", text, re.M)
    cflags = re.search(r"^cflags = (.*)$", text, re.M)
    if cxx is None or cflags is None:
        raise RuntimeError("torch's build file has no cxx or cflags line")
    return cxx.group(1).strip(), re.sub(r"-DTORCH_EXTENSION_NAME=\S+", "", cflags.group(1)).strip()


def build(root: Path, variant: str) -> Path | None:
    """Build one variant under ``root`` (once: a second builder waits for the first and finds it ready)."""
    import torch.utils.cpp_extension as cpp_extension

    if variant not in VARIANTS:
        raise ValueError(f"unknown PCH variant {variant!r}; known: {', '.join(VARIANTS)}")
    root.mkdir(parents=True, exist_ok=True)
    final = root / variant
    with open(root / f"{variant}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / READY).is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{variant}.", dir=root))
        try:
            t0 = time.monotonic()
            cxx, cflags = compile_flags(variant)
            (tmp / "torch").mkdir()
            header = tmp / "torch" / "extension.h"
            shutil.copyfile(Path(cpp_extension._TORCH_PATH) / "include" / "torch" / "extension.h", header)
            cmd = f"{cxx} {cflags} -x c++-header {header} -o {header}.gch"
            subprocess.run(cmd, shell=True, check=True, cwd=tmp)
            for path in tmp.rglob("*"):
                if path.is_file():
                    path.chmod(0o444)
            (tmp / READY).write_text(json.dumps({"command": cmd, "seconds": round(time.monotonic() - t0, 1),
                                                 "files": _signature(tmp)}))
            (tmp / READY).chmod(0o444)
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
            return final
        except Exception as exc:  # noqa: BLE001 - no PCH is a slower build, never a failed one
            (root / f"{variant}.{FAILED}").write_text(f"{type(exc).__name__}: {exc}\n")
            return None
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)


if __name__ == "__main__":
    os.nice(15)  # beside a judge that may be timing: the compiler yields the cores
    print(build(Path(sys.argv[1]), sys.argv[2]), flush=True)
