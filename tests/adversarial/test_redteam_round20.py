"""Red team, round 20: the static checks under the default ``strict`` policy, as the barrier between a candidate
and its runner's own objects (a helper's pass with the source open).

Why it matters: the runner reports each timed call's event time and its launch count, and the judge believes a
time within the envelope's tolerance (3 ms a call on the CPU, ~0.3 ms on a GPU: round 4). A candidate that reaches
the runner's module globals (``timed_call``, ``LaunchCounter``) lies about both. Round 4 did it with
``import gc, sys`` (rejected under ``strict``); the static checks are what keeps that lie from a ``strict`` result.
Everything below was run here (CPU, ``TRITON_INTERPRET=1``); each hole was reproduced 3 of 3 times.

What was tried, the mechanism, what happened:

1. (hole) Modules that allowed modules keep under another name. ``check_module_name`` flags a module reached as an
   attribute only where the attribute's *name* is in ``REACHABLE_STDLIB`` (``torch._utils.sys``). The standard
   library and torch keep dangerous modules under other names: ``collections._sys`` (sys), ``enum.bltns``
   (builtins), ``torch.cuda.tunable.mp`` and ``torch.utils.data.dataloader.python_multiprocessing``
   (multiprocessing), ``torch._dynamo.convert_frame.mock`` (unittest.mock),
   ``torch.utils.data._utils.signal_handling.signal`` (signal), ``typing.types`` (types), and
   ``from collections import _sys``. None gives any finding. Through ``collections._sys.modules`` the candidate finds
   the runner's module (the one holding ``Runner`` and ``timed_call``), replaces its ``timed_call`` with one that
   runs eager GELU and reports 1 us, and makes ``LaunchCounter.reset`` leave a count of 1; its forward is an honest
   Triton GELU, so the trials, the knockout and the dataflow stage see real kernel work. Measured under ``strict``:
   ``correct``, 53-90x, speed credit, no flag (6 of 6 over two sessions; the honest kernel: 0.03x on the
   interpreter).
   ``enum.bltns.exec`` / ``eval`` / ``getattr`` are the builtins under a name ``is_builtin`` does not know: ``exec`` of
   any text with no ``dynamic_code``, and ``getattr(f, "__glob" + "als__")`` with no folding.
2. (hole) Functions of denied modules kept under plain names: ``torch._dynamo.guards.currentframe`` is
   ``inspect.currentframe`` (a frame, no finding), ``torch.autograd.profiler_util.attrgetter`` is
   ``operator.attrgetter``, whose names built from pieces (``"f_" + "back"``) are folded only for
   ``operator.attrgetter`` itself, and ``torch.xpu.cast`` / ``c_double.from_address`` are ctypes (raw memory).
3. (hole, round 4's own route, never asserted) ``vars(torch)["sys"]``: a namespace read with a constant key is exempt
   from the ``vars`` finding, and ``qual`` resolves ``vars()[key]`` only without arguments. Still no finding.
4. (hole) Class patterns of ``match`` read attributes by keyword: ``case object(__globals__=G)`` on any torch
   function gives its module's globals (``G["sys"]``), ``case object(__traceback__=object(tb_frame=F))`` a frame.
   ``MatchClass.kwd_attrs`` are plain identifiers: no ``ast.Attribute``, no string constant, so neither the dunder
   rule, nor ``FRAME_ATTRS``, nor the string scan sees them. Measured end to end like 1: ``correct``, speed credit,
   56-71x, no flag (3 of 3).
5. (hole) C++ that runs Python. ``load_inline`` is allowed; its sources are strings, scanned only for ``kb_gym``,
   ``/proc/`` and (under 200 characters) dotted dangerous names. ``py::exec(R"(import sys ...)")`` in a C++ function
   called at import runs round 4's lie verbatim (``import sys``, ``sys.modules``, the patches): ``correct``,
   60-81x, speed credit, only ``unused_kernel`` (a note) (4 of 4; the first build ~25-30 s, the judge's build cache
   after).

Stopped (plain tests): ``enum.bltns.__import__`` (the dunder), ``attrgetter("f_back")`` under the alias (the string
scan), ``typing.sys`` / ``os.sys`` (``REACHABLE_STDLIB``), ``torch.__dict__["sys"]`` (the dunder),
``numpy.__builtins__``, a frame attribute written as an attribute after the ``match``, and
``functools.reduce(getattr, ["_sys", "modules"], collections)`` (the module passed as a value: ``dynamic_code``, no
speed credit, which is all the lie was for).

Fixed in the same session (28), each test below a plain test now:

- 1 and 2: a qualified name is judged by what it names as well as by its spelling (``integrity/resolve.py``,
  ``analyzer.check_home``): each step is resolved from its module (``vars`` of modules, ``getattr_static`` of
  anything else; modules under the allowlist's roots imported to resolve, once per process), and a module, function
  or class met on the way is named as its home names it (``collections._sys`` is ``sys``,
  ``torch._dynamo.guards.currentframe`` is ``inspect.currentframe``, ``torch.xpu.cast`` is ``ctypes.cast``) for
  ``REF_RULES`` and ``MODULE_FAMILIES`` to judge;
- 3: ``vars(mod)["key"]`` and ``mod.__dict__["key"]`` resolve to ``mod.key`` (``analyzer.qual``), and a namespace
  read by a constant key is checked as a use of that name;
- 4: every keyword of a class pattern is an attribute name to ``check_attr_name``, and on a module subject a use of
  ``module.name`` (``checks.check_match_class``);
- 5: strings that reach the interpreter from C++ (pybind11's ``exec``, ``eval``, imports, objects and ``.attr``,
  CPython's API, token pasting: ``names.INTO_PYTHON``) are ``introspection``; and in the runner, what ``load_inline``
  and ``load`` are actually given is read before anything is built (``worker/native_guard.py``): a source composed at
  run time is refused there, ``compile_error``.
"""

from __future__ import annotations

import textwrap

import pytest
from device import DEVICE
from runner_lie import GELU_KERNEL, HEADER, LIE, RANK, STRICT_TIMED, cost, reach, sound
from test_judge_isolation import GELU, TIMED
from test_static_checks import candidate

from kb_gym import Evaluator
from kb_gym.integrity import static_findings

# --------------------------------------------------------------------------------- 1-4: routes, static and run
#
# Each route binds ``REACHED`` at module level; ``PROBE`` (harness code, run after it in a fresh interpreter) is
# true when it got what it aims at. ``least`` is what a sound strict judge makes the candidate pay at least.

ROUTES: dict[str, tuple[str, str, str]] = {
    "collections_sys": ("import collections\nREACHED = collections._sys.modules",
                        "REACHED is sys.modules", "reject"),
    "from_collections_import_sys": ("from collections import _sys\nREACHED = _sys.modules",
                                    "REACHED is sys.modules", "reject"),
    "vars_torch_sys": ('REACHED = vars(torch)["sys"].modules', "REACHED is sys.modules", "reject"),
    "enum_builtins_exec": ("import enum\nREACHED = enum.bltns.exec\nREACHED('import gc')",
                           "REACHED is builtins.exec", "reject"),
    "enum_builtins_getattr_folded": ('import enum\nREACHED = enum.bltns.getattr(torch.nn.functional.relu, '
                                     '"__glob" + "als__")',
                                     "REACHED is vars(torch.nn.functional)", "reject"),
    "tunable_multiprocessing": ("import torch.cuda.tunable\nREACHED = torch.cuda.tunable.mp.Process",
                                "REACHED is importlib.import_module('multiprocessing').Process", "reject"),
    "dataloader_multiprocessing": ("import torch.utils.data.dataloader\n"
                                   "REACHED = torch.utils.data.dataloader.python_multiprocessing.Process",
                                   "REACHED is importlib.import_module('multiprocessing').Process", "reject"),
    "dynamo_unittest_mock": ("import torch._dynamo.convert_frame\nREACHED = torch._dynamo.convert_frame.mock.patch",
                             "REACHED is importlib.import_module('unittest.mock').patch", "reject"),
    "dataloader_signal": ("import torch.utils.data._utils.signal_handling\n"
                          "REACHED = torch.utils.data._utils.signal_handling.signal.setitimer",
                          "REACHED is importlib.import_module('signal').setitimer", "reject"),
    "typing_types_function": ("import typing\nREACHED = typing.types.FunctionType",
                              "REACHED is importlib.import_module('types').FunctionType", "no_speed_credit"),
    "dynamo_currentframe": ("import torch._dynamo.guards\nREACHED = torch._dynamo.guards.currentframe()",
                            "type(REACHED).__name__ == 'frame'", "reject"),
    "profiler_attrgetter_folded": ("import torch._dynamo.guards\nimport torch.autograd.profiler_util\n"
                                   'REACHED = torch.autograd.profiler_util.attrgetter("f_" + "globals")('
                                   "torch._dynamo.guards.currentframe())",
                                   "type(REACHED) is dict and 'REACHED' in REACHED", "reject"),
    "xpu_ctypes": ("REACHED = torch.xpu.c_double.from_address(id(1.5) + 16).value",
                   "REACHED == 1.5", "reject"),
    "match_globals": ("match torch._utils._rebuild_tensor:\n    case object(__globals__=G):\n"
                      '        REACHED = G["sys"].modules',
                      "REACHED is sys.modules", "reject"),
    "match_traceback_frame": ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    match e:\n"
                              "        case object(__traceback__=object(tb_frame=F)):\n            REACHED = F",
                              "type(REACHED).__name__ == 'frame'", "reject"),
}


@pytest.fixture(scope="module")
def reached() -> dict[str, bool | str]:
    return reach(ROUTES, "{'torch': torch}")


def _route_candidate(prelude: str) -> str:
    return candidate(prelude)


@pytest.mark.parametrize("name", list(ROUTES))
def test_a_route_to_a_denied_module_costs_what_the_module_does(name, reached):
    prelude, _, least = ROUTES[name]
    got = cost(_route_candidate(prelude))
    # sound: a route that works costs at least what importing its module costs (a route that fails is harmless)
    assert reached[name] is not True or RANK[got] >= RANK[least], (name, got, reached[name])


# --------------------------------------------------------------------------------- stopped routes (static)

STOPPED = {
    "enum_builtins_import": 'import enum\ngc = enum.bltns.__import__("gc")',
    "alias_attrgetter_literal": ('import torch.autograd.profiler_util\n'
                                 'get = torch.autograd.profiler_util.attrgetter("f_back")'),
    "typing_sys": "import typing\nmods = typing.sys.modules",
    "os_sys": "mods = os.sys.modules",
    "module_dict_sys": 'mods = torch.__dict__["sys"].modules',
    "numpy_builtins": "import numpy\nb = numpy.__builtins__",
    "frame_attr_after_match": ("import torch._dynamo.guards\nmatch torch._dynamo.guards.currentframe():\n"
                               "    case object(f_back=B):\n        L = B.f_locals"),
}


@pytest.mark.parametrize("name", list(STOPPED))
def test_routes_the_checks_see_are_rejected(name):
    prelude = STOPPED[name]
    source = _route_candidate(("import os\n" if "os." in prelude else "") + prelude)
    assert cost(source) == "reject", (name, static_findings(source))


def test_a_module_passed_to_reduce_getattr_costs_the_speed_credit():
    source = _route_candidate('import functools, collections\n'
                              'mods = functools.reduce(getattr, ["_sys", "modules"], collections)')
    assert cost(source) in ("reject", "no_speed_credit"), static_findings(source)


def test_the_honest_candidate_of_these_tests_is_clean():
    assert static_findings(candidate()) == [], static_findings(candidate())


# --------------------------------------------------------------------------------- 1, 4, 5: end to end



REACH = {
    "collections_sys": "import collections\n_modules = collections._sys.modules\n",
    "match_globals": ("match torch._utils._rebuild_tensor:\n    case object(__globals__=_G):\n"
                      '        _modules = _G["sys"].modules\n'),
}
CPP_LIE = 'R"PY(\nimport sys, torch\n_modules = sys.modules\n' + LIE + ')PY"'
CPP = '''
from torch.utils.cpp_extension import load_inline

_CPP = """
#include <torch/extension.h>
#include <pybind11/eval.h>
void setup() {
  py::exec(''' + CPP_LIE + ''');
}
"""
_ext = load_inline(name="round20_setup", cpp_sources=_CPP, functions=["setup"], verbose=False)
_ext.setup()
'''


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e



@pytest.mark.parametrize("route", list(REACH))
def test_a_strict_candidate_that_reaches_the_runner_gets_no_speed_credit(ev, route):
    source = HEADER + REACH[route] + LIE + GELU_KERNEL
    for _ in range(3):
        r = ev.evaluate(GELU, source, config=STRICT_TIMED)
        assert sound(r), (route, r.status, r.speedup, r.speed_credit, r.flags, r.error)


def test_python_run_from_a_load_inline_source_is_rejected(ev):
    source = HEADER + textwrap.dedent(CPP) + GELU_KERNEL
    if cost(source) == "reject":
        return
    r = ev.evaluate(GELU, source, config=STRICT_TIMED)
    assert sound(r), (r.status, r.speedup, r.speed_credit, r.flags, r.error)


# A C++ source composed at run time: no string of the program names the way in, so only the runner's reading of what
# load_inline is given (worker/native_guard.py) sees it; ``integrity="off"`` so that nothing static decides.
COMPOSED_CPP = CPP.replace('py::exec(', '" + "py::ex" + "ec(" + "').replace(
    '_CPP = """', '_CPP = """').replace("_ext = load_inline", "_CPP = _CPP.replace(chr(34) + ' + ' + chr(34), '')\n"
                                          "_ext = load_inline")


def test_a_cpp_source_composed_at_run_time_that_reaches_the_interpreter_is_refused_before_it_builds(ev):
    from kb_gym.worker import native_guard

    with pytest.raises(native_guard.NativeSourceRefused):
        native_guard.check(["void f() {}", "void g() { py::ex" + "ec(\"import sys\"); }"])
    native_guard.check(["#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x) { return x; }"])
    source = HEADER + textwrap.dedent(COMPOSED_CPP) + GELU_KERNEL
    assert "py::exec" not in source
    r = ev.evaluate(GELU, source, config=TIMED.replace(load_timeout=120))
    assert r.status == "compile_error" and "reaches the Python interpreter" in (r.error or ""), (r.status, r.error)
