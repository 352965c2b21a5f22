"""Static integrity checks, deny by default: the import allowlist, frames and dunders, computed attribute names,
module objects as values, the clock under an alias. Fast, CPU only, nothing is executed."""

from __future__ import annotations

import pytest
from test_static_checks import assert_finding, candidate

from kb_gym.integrity import (
    MAX_PARSE_CHARS,
    STATIC_FLAGS,
    Finding,
    get_policy,
    static_findings,
)

# ------------------------------------------------------------------------------- deny by default

STRICT = get_policy("strict")


def assert_action(source: str, flag: str, action: str) -> Finding:
    """The finding at the marked line has ``flag``, and ``strict`` makes it cost ``action``."""
    finding = assert_finding(source, flag, exact=False)
    assert STRICT.action(finding) == action, (finding, STRICT.action(finding))
    return finding


@pytest.mark.parametrize("module", ["gc", "sys", "os", "ctypes", "torch", "triton.language", "math", "numpy"])
def test_star_imports_are_rejected(module):
    source = candidate(f"from {module} import *  # <-")
    finding = assert_action(source, "star_import", "reject")
    assert f"`{module}`" in finding.message
    assert STRICT.rejections(static_findings(source))


def test_star_import_is_a_flag_of_its_own():
    assert "star_import" in STATIC_FLAGS and "unlisted_import" in STATIC_FLAGS
    assert STRICT.action("star_import") == "reject" and STRICT.action("unlisted_import") == "no_speed_credit"
    from kb_gym.integrity import FLAG_DESCRIPTIONS
    assert {"star_import", "unlisted_import"} <= set(FLAG_DESCRIPTIONS)
    for name in ("kernelbench", "off"):
        assert get_policy(name).action("star_import") == get_policy(name).action("unlisted_import") == "note"


# Modules outside the allowlist that reach frames, objects, processes, the file system or the harness: the
# import alone is refused, with the flag of the module's family.
DENIED_MODULES = [
    ("gc", "introspection"), ("sys", "introspection"), ("inspect", "introspection"), ("ctypes", "introspection"),
    ("traceback", "introspection"), ("types", "introspection"), ("weakref", "introspection"),
    ("operator", "introspection"), ("pickle", "introspection"), ("marshal", "introspection"),
    ("faulthandler", "introspection"), ("threading", "concurrency"), ("_thread", "concurrency"),
    ("subprocess", "concurrency"), ("multiprocessing", "concurrency"), ("signal", "io_escape"),
    ("socket", "io_escape"), ("atexit", "io_escape"), ("resource", "io_escape"), ("posix", "io_escape"),
    ("fcntl", "io_escape"),
    ("importlib", "harness_patch"), ("builtins", "harness_patch"), ("unittest", "harness_patch"),
    ("kb_gym", "harness_patch"),
]


@pytest.mark.parametrize(("module", "flag"), DENIED_MODULES)
def test_modules_outside_the_allowlist_are_refused(module, flag):
    for source in (candidate(f"import {module}  # <-"), candidate(f"import {module} as _m  # <-"),
                   candidate(f"from {module} import *  # <-")):
        assert_action(source, flag, "reject")
    assert_action(candidate(f'_m = __import__("{module}")  # <-'), flag, "reject")


@pytest.mark.parametrize("module", ["time", "timeit", "random", "json", "re", "copy", "logging", "datetime",
                                    "io", "pathlib", "shutil", "tempfile", "not_a_real_module", "scipy"])
def test_other_modules_outside_the_allowlist_cost_the_speed_credit(module):
    source = candidate(f"import {module}  # <-")
    finding = assert_action(source, "unlisted_import", "no_speed_credit")
    assert f"`{module}`" in finding.message and "allowlist" in finding.message
    assert {f.flag for f in static_findings(source)} == {"unlisted_import"}


def test_relative_imports_are_refused():
    assert_action(candidate("from . import helpers  # <-"), "harness_patch", "reject")
    assert_action(candidate("from ..worker import runtime  # <-"), "harness_patch", "reject")


ALLOWED_IMPORTS = """\
from __future__ import annotations

import abc
import cmath
import collections
import collections.abc
import dataclasses
import enum
import functools
import itertools
import math
import numbers
import os
import textwrap
import typing
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any

import einops
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.utils.cpp_extension import load_inline
from triton.language.extra import libdevice

JOBS = os.environ.get("MAX_JOBS", "4")
SRC = textwrap.dedent('''
    torch::Tensor relu_cuda(torch::Tensor x);
''')
ext = load_inline(name="e", cpp_sources=SRC, cuda_sources="...", functions=["relu_cuda"])


@dataclass
class Cfg:
    block: int = 1024


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_cuda(x)
"""


def test_the_allowlist_is_clean():
    assert static_findings(ALLOWED_IMPORTS) == []
    for extra in ("import cupy as cp", "from numba import cuda", "import triton.testing"):
        assert static_findings(ALLOWED_IMPORTS.replace("import abc\n", f"import abc\n{extra}\n")) == []


def test_the_line_scan_checks_imports_too():
    for prelude, flag in (("from gc import *", "star_import"), ("import sys", "introspection"),
                          ("import json", "unlisted_import")):
        text = candidate(prelude) + "\n# padding\n" * (MAX_PARSE_CHARS // 10)
        findings = static_findings(text)
        assert any(f.flag == flag and f.line == 5 for f in findings), findings
        assert any(f.flag == "unchecked" for f in findings)


# ------------------------------------------------------------------------------- frames and dunders

INTROSPECTION = [
    ("attrgetter_frame", candidate("import operator", forward="""
        try:
            raise RuntimeError
        except RuntimeError as err:
            frame = operator.attrgetter("tb_frame")(err.__traceback__)  # <-
        return launch(x)
    """)),
    ("attrgetter_dotted", candidate("from operator import attrgetter\n"
                                    'caller_globals = attrgetter("f_back.f_globals")  # <-')),
    ("methodcaller_subclasses", candidate("import operator\n"
                                          'everything = operator.methodcaller("__subclasses__")(object)  # <-')),
    ("itemgetter_builtins", candidate("import operator\n"
                                      'get_builtins = operator.itemgetter("__builtins__")  # <-')),
    ("closure", candidate('cells = launch.__closure__  # <-')),
    ("globals_read", candidate('namespace = launch.__globals__  # <-')),
    ("code_read", candidate('code = launch.__code__.co_code  # <-')),
    ("dict_of_object", candidate(init="self.state = self.__dict__  # <-")),
    ("mro", candidate('bases = type(torch.zeros(1)).__mro__  # <-')),
    ("bases", candidate('bases = torch.Tensor.__bases__  # <-')),
    ("classic_escape", candidate('everything = ().__class__.__base__.__subclasses__()  # <-')),
    ("getattribute", candidate('close = torch.__getattribute__("allclose")  # <-')),
    ("dir", candidate('names = torch.__dir__()  # <-')),
    ("loader", candidate('loader = torch.__loader__  # <-')),
    ("spec", candidate('spec = triton.__spec__  # <-')),
    ("bound_self", candidate('owner = torch.allclose.__self__  # <-')),
    ("wrapped", candidate('original = torch.nn.functional.relu.__wrapped__  # <-')),
    ("defaults", candidate('launch.__defaults__ = ()  # <-')),
    ("generator_frame", candidate("def gen():\n    yield 1\n\n\nframe = gen().gi_frame  # <-")),
    ("coroutine_frame", candidate("async def co():\n    pass\n\n\nframe = co().cr_frame  # <-")),
    ("frame_code", candidate("def where(frame):\n    return frame.f_code  # <-")),
    ("cell_contents", candidate("def peek(cell):\n    return cell.cell_contents  # <-")),
    ("getattr_string", candidate('cells = getattr(launch, "__closure__")  # <-')),
    ("setattr_string", candidate('setattr(launch, "__defaults__", ())  # <-')),
    ("delattr_string", candidate('delattr(launch, "__wrapped__")  # <-')),
    ("hasattr_string", candidate('peek = hasattr(launch, "__globals__")  # <-')),
    ("string_kept_in_a_name", candidate('ATTR = "f_back"  # <-')),
]


@pytest.mark.parametrize("source", [pytest.param(s, id=i) for i, s in INTROSPECTION])
def test_frames_and_object_internals_are_introspection(source):
    assert_action(source, "introspection", "reject")


HONEST_DUNDERS = candidate("", init="""
    nn.Module.__init__(self)
    self.label = self.__class__.__name__ + type(self).__qualname__
    self.version = torch.__version__ + triton.__version__
""", forward="""
    n = x.__len__()
    doc = launch.__doc__, launch.__name__, launch.__module__
    with torch.no_grad().__class__():
        pass
    return launch(x).__mul__(1.0)
""", extra='''
__all__ = ["ModelNew"]


def interface(t):
    return t.__cuda_array_interface__, t.__dlpack_device__()


class Scaled:
    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"Scaled({self.value})"

    def __add__(self, other):
        return Scaled(self.value + other.value)

    def __getitem__(self, i):
        return self.value


if __name__ == "__main__":
    print(ModelNew()(torch.randn(4)))
''')


def test_the_data_model_and_metadata_dunders_are_clean():
    assert static_findings(HONEST_DUNDERS) == []


# ------------------------------------------------------------------------------- computed names

COMPUTED = [
    ("getattr_module_pieces", candidate('lib = getattr(torch, "li" + "brary")  # <-'), "dynamic_code"),
    ("getattr_join", candidate('', forward="""
        op = getattr(x, "_".join(["add", ""]))  # <-
        return launch(op(1.0))
    """), "dynamic_code"),
    ("getattr_fstring_called", candidate('', forward="""
        name = "re" + "lu"
        y = getattr(x, f"{name}_")()  # <-
        return launch(y)
    """), "dynamic_code"),
    ("getattr_returned", candidate("def pick(obj, name):\n    return getattr(obj, name)  # <-"), "dynamic_code"),
    ("setattr_computed", candidate(init="""
        for i in range(2):
            setattr(self, f"w{i}", nn.Parameter(torch.zeros(1)))  # <-
    """), "dynamic_code"),
    ("attrgetter_computed", candidate("import operator\nNAME = input()\nget = operator.attrgetter(NAME)  # <-"),
     "dynamic_code"),
    ("globals_computed", candidate('', forward="""
        fn = globals()["la" + "unch"]  # <-
        return fn(x)
    """), "dynamic_code"),
    ("dunder_from_pieces", candidate('namespace = getattr(launch, "__glo" + "bals__")  # <-'), "introspection"),
    ("dunder_from_chr", candidate("namespace = getattr(launch, ''.join(chr(c) for c in "
                                  "[95, 95, 103, 108, 111, 98, 97, 108, 115, 95, 95]))  # <-"), "introspection"),
    ("dunder_from_map_chr", candidate("code = getattr(launch, ''.join(map(chr, (95, 95, 99, 111, 100, 101, 95, "
                                      "95))))  # <-"), "introspection"),
    ("dunder_from_bytes", candidate("code = getattr(launch, bytes([95, 95, 99, 111, 100, 101, 95, 95]).decode())"
                                    "  # <-"), "introspection"),
    ("frame_from_fstring", candidate('part = "back"\nframe = getattr(launch, f"f_{part}")  # <-'), "introspection"),
    ("frame_from_name", candidate('NAME = "f_" + "globals"\nnamespace = getattr(launch, NAME)  # <-'),
     "introspection"),
    ("frame_from_reversed", candidate('frame = getattr(launch, "kcab_f"[::-1])  # <-'), "introspection"),
    ("dunder_through_setattr", candidate('setattr(launch, "__co" + "de__", print.__call__)  # <-'),
     "introspection"),
]


@pytest.mark.parametrize(("source", "flag"), [pytest.param(s, f, id=i) for i, s, f in COMPUTED])
def test_computed_attribute_names(source, flag):
    assert_action(source, flag, "reject" if flag == "introspection" else "no_speed_credit")
    if flag == "introspection":  # the name is computed all the same
        assert "dynamic_code" in {f.flag for f in static_findings(source)}


def test_computed_names_that_are_only_tested_are_left_alone():
    source = candidate(init="self.bias = None", forward="""
        for name in ("bias", "scale"):
            if getattr(self, name, None) is not None:
                x = x + 1
        if hasattr(self, "bi" + "as"):
            x = x * 1
        return launch(x)
    """)
    assert static_findings(source) == []


# ------------------------------------------------------------------------------- module objects as values

CONTAINED = [
    # the container hides the module: gc is refused at its import, its use is named where it is reached
    ("list_of_modules", candidate("import gc\nmods = [torch, gc]", forward="""
        objs = mods[1].get_objects()  # <-
        return launch(x)
    """), "introspection", {"introspection", "dynamic_code"}),
    ("dict_of_modules", candidate('import gc\nd = {"g": gc}', forward="""
        d["g"].get_referrers(x)  # <-
        return launch(x)
    """), "introspection", {"introspection", "dynamic_code"}),
    # an allowed module reached through a container: flagged as if reached directly
    ("tuple_index_alias", candidate("m = (torch,)[0]\nm.allclose = lambda *a, **k: True  # <-"),
     "harness_patch", {"harness_patch", "dynamic_code"}),
    ("tuple_index_store", candidate("(torch,)[0]._C._cuda_synchronize = lambda: None  # <-"),
     "timer_patch", {"timer_patch", "dynamic_code"}),
    ("list_index_library", candidate('lib = [torch][0].library.Library("aten", "IMPL")  # <-'),
     "tensor_subclass", {"tensor_subclass", "dynamic_code"}),
    ("named_list_setattr", candidate('mods = [triton, torch]\nsetattr(mods[-1], "allclose", max)  # <-'),
     "harness_patch", {"harness_patch", "dynamic_code"}),
    ("dict_through_alias", candidate('d = {"t": torch}\nt = d["t"]\nt.testing.assert_close = print  # <-'),
     "harness_patch", {"harness_patch", "dynamic_code"}),
    ("through_torch_to_sys", candidate("m = (torch,)[0]\nloaded = m._utils.sys.modules  # <-"),
     "introspection", {"introspection", "dynamic_code"}),
    # what can't be resolved (a computed index, a module handed to a function) is dynamic code
    ("computed_index", candidate("mods = [torch]  # <-", forward="""
        mods[len(mods) - 1].allclose = max
        return launch(x)
    """), "dynamic_code", {"dynamic_code"}),
    ("module_passed_to_a_helper", candidate("def patch(m):\n    m.allclose = max\n\n\npatch(torch)  # <-"),
     "dynamic_code", {"dynamic_code"}),
    ("module_stored_on_self", candidate(init="self.t = torch  # <-"), "dynamic_code", {"dynamic_code"}),
]


@pytest.mark.parametrize(("source", "flag", "flags"), [pytest.param(s, f, fs, id=i) for i, s, f, fs in CONTAINED])
def test_module_objects_in_containers_do_not_escape(source, flag, flags):
    assert_action(source, flag, "no_speed_credit" if flag == "dynamic_code" else "reject")
    assert {f.flag for f in static_findings(source)} == flags


def test_modules_in_plain_uses_are_clean():
    source = candidate("import os\nT = torch\nHAS_NP = isinstance(torch, type(os)) and hasattr(torch, 'compile')",
                       forward="""
        if T is not None and not getattr(torch, "cuda", None) is None:
            print(f"{torch.__version__}", type(os))
        return launch(x)
    """)
    assert static_findings(source) == []


# ------------------------------------------------------------------------------- the clock under an alias


CLOCK_USES = ["{m}.time()", "{m}.perf_counter()", "{m}.monotonic_ns()"]


@pytest.mark.parametrize("use", CLOCK_USES)
def test_an_aliased_clock_gets_the_same_findings_as_the_plain_name(use):
    def findings(prelude, module):
        source = candidate(prelude, forward=f"start = {use.format(m=module)}\nreturn launch(x)")
        return [(f.flag, f.line) for f in static_findings(source)]

    plain = findings("import time", "time")
    assert findings("import time as clock", "clock") == plain
    assert findings("import time as _t", "_t") == plain
    # `import time` is outside the allowlist (no speed credit); calling the clock adds nothing, and
    # `time.time` is the module's function, not "the module time through time" (introspection)
    assert plain == [("unlisted_import", 5)]
    assert STRICT.action("unlisted_import") == "no_speed_credit"


def test_the_clock_imported_by_name_is_no_introspection():
    source = candidate("from time import time, perf_counter", forward="t0 = time() + perf_counter()\nreturn launch(x)")
    assert [(f.flag, f.line) for f in static_findings(source)] == [("unlisted_import", 5)]
    # reaching a module's same-named member is no reach into another module; a real one still is
    assert_action(candidate("import socket\nsock = socket.socket  # <-"), "io_escape", "reject")
    assert_action(candidate("clock = torch._utils.time  # <-"), "introspection", "reject")
