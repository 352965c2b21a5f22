"""Static integrity checks: read a candidate's source (AST, no execution) and name the reward hacks in it.

``static_findings(source)`` returns :class:`Finding` objects (flag, one-sentence message with the
line, line). It never raises: source that does not parse gives ``[]`` (the load step reports the
syntax error). What a flag costs is decided by an :class:`IntegrityPolicy`:

========================  ==============  ===================================================
flag                      strict          what it means
========================  ==============  ===================================================
harness_patch             reject          assigns / setattr / deletes attributes of torch, Triton,
                                          NumPy, Python modules or the evaluator; sys.modules,
                                          __builtins__, importlib, builtins, unittest.mock,
                                          relative imports
timer_patch               reject          replaces time.*, torch.cuda.Event / synchronize,
                                          triton.testing.do_bench and other timing helpers
introspection             reject          frames (sys, inspect, f_back, tb_frame...), gc, ctypes,
                                          operator, pickle / marshal, /proc, dunders outside the
                                          data model (__dict__, __code__, __mro__...), also in strings
concurrency               reject          threading, multiprocessing, subprocess, asyncio,
                                          concurrent.futures, os.fork / system / popen / exec*
io_escape                 reject          sockets, HTTP, signals, atexit, os.kill, os.chdir,
                                          environment changes, absolute-path writes
tensor_subclass           reject          torch.Tensor subclasses, __torch_function__ /
                                          __torch_dispatch__, dispatch modes, aten overrides
star_import               reject          ``from module import *`` (any module, triton.language too)
fallback                  no_speed_credit an except branch or a device/availability branch that
                                          computes with PyTorch instead of the kernel
decoy                     no_speed_credit kernels are defined but ModelNew.forward reaches none
replay                    no_speed_credit forward returns results cached from an earlier call
precision_change          no_speed_credit global numerics or compiler settings (TF32, cudnn,
                                          matmul precision, inductor config, thread counts)
dynamic_code              no_speed_credit exec / eval / compile / marshal, computed attribute names
                                          (getattr / setattr / attrgetter), module objects passed
                                          around as values: code the checks can't see
unlisted_import           no_speed_credit any other module outside the allowlist (time, random, json,
                                          tempfile, unknown packages...): imports are deny by default
unchecked                 no_speed_credit the source is too large to parse; only a line scan ran
pytorch_compiler          no_speed_credit torch.compile, Inductor, TorchScript or torch.export
                                          write the kernels instead of the candidate
unused_kernel             note            some kernels are never reached from forward
========================  ==============  ===================================================

Imports are deny by default: a candidate may import ``torch``, ``triton``, ``numpy``, ``cupy``, ``numba``,
``einops``, ``os`` and the pure standard modules ``__future__``, ``math``, ``cmath``, ``numbers``,
``functools``, ``itertools``, ``collections``, ``typing``, ``typing_extensions``, ``dataclasses``, ``enum``,
``abc``, ``warnings``, ``textwrap`` (and their submodules, which still go through the rules on qualified
names). Any other import (``import``, ``from``, ``__import__`` / ``importlib.import_module`` with a literal
name) gets the flag of its module's family, which rejects under ``strict`` (``sys`` / ``gc`` / ``inspect`` /
``operator`` / ``types`` / ``weakref`` / ``pickle`` -> ``introspection``, ``threading`` / ``subprocess`` ->
``concurrency``, ``socket`` / ``signal`` / ``atexit`` / ``resource`` -> ``io_escape``, ``builtins`` /
``importlib`` -> ``harness_patch``), else ``unlisted_import``, which costs the speed credit (``time``,
``random``, ``json``, ``tempfile``, ``pathlib``, ``shutil``, unknown packages: the import is no hack by itself,
but a kernel has no use for it; what file-system modules do at absolute paths stays ``io_escape``, and a
missing module is still reported by the load step). A relative import is ``harness_patch``.

Dunder attributes (by name, or as a string given to getattr / setattr / delattr / hasattr / attrgetter /
methodcaller / itemgetter, folded when built from pieces such as ``"__glo" + "bals__"``; the dangerous ones
in any identifier-like string) are allowed only for
the data model (``__init__``, ``__call__``, operators, containers, context managers, ``__setattr__``), metadata
reads (``__name__``, ``__qualname__``, ``__doc__``, ``__module__``, ``__version__``, ``__file__``, reading
``__class__``) and the array protocols (``__cuda_array_interface__``, ``__dlpack__``...); any other is
``introspection``, and so are frame, traceback, generator and code attributes (``tb_frame``, ``f_back``,
``co_code``...). ``super().__init__()`` and ``if __name__ == "__main__":`` stay clean.

The engine's runtime flags are part of the same policies: ``no_custom_kernel``, ``input_mutation``,
``side_stream``, ``excessive_speedup``, ``nondeterministic`` and ``unverifiable_output`` keep the
result but get no speed credit under ``strict``; ``degenerate_problem`` is a note; ``tampering`` and
``timing_mismatch`` are failures in the engine under every policy (``ALWAYS_FAIL``; ``strict`` lists
them under ``reject`` to say so). ``precision_change`` is raised at runtime too, when the TF32 settings
differ after the job from what ``EvalConfig.tf32`` set. ``kernelbench`` follows KernelBench's own rules (any correct
candidate counts, so every flag is a note) and ``off`` makes every flag a note.

Trade-offs against honest code: ``os.environ[...] = ...`` is allowed for the build knobs in
``ENV_ALLOW`` (``TORCH_CUDA_ARCH_LIST``, ``MAX_JOBS``); ``import ctypes`` / ``threading`` alone is
flagged (kernel code has no use for them); ``torch.backends.* = ...`` costs speed credit, not the
verdict; ``setattr(self, f"conv{i}", ...)`` and ``getattr(obj, name)()`` cost speed credit (computed names);
decoy and fallback analysis follow names only (no data flow), and resolve ``getattr`` with
literal names, so dynamic dispatch is read conservatively (it never causes a decoy finding).

Modules: ``findings`` (Finding, the flags and their descriptions), ``policy`` (IntegrityPolicy and the
registry), ``names`` (tables), ``astutil`` (AST helpers, string folding), ``analyzer`` (name resolution and the
import allowlist), ``checks`` and ``paths`` (node-by-node checks), ``callgraph`` and ``structure`` (the call
graph), ``behaviour`` (fallbacks, decoys, replays), ``lines`` (the line scan) and ``static`` (the entry point).
"""

from __future__ import annotations

from kb_gym.integrity.findings import ALWAYS_FAIL, FLAG_DESCRIPTIONS, RUNTIME_FLAGS, STATIC_FLAGS, Finding
from kb_gym.integrity.names import ALLOWED_MODULES, ENV_ALLOW, MAX_PARSE_CHARS
from kb_gym.integrity.policy import POLICIES, IntegrityPolicy, get_policy
from kb_gym.integrity.static import static_findings

__all__ = [
    "ALLOWED_MODULES",
    "ALWAYS_FAIL",
    "ENV_ALLOW",
    "FLAG_DESCRIPTIONS",
    "MAX_PARSE_CHARS",
    "POLICIES",
    "RUNTIME_FLAGS",
    "STATIC_FLAGS",
    "Finding",
    "IntegrityPolicy",
    "get_policy",
    "static_findings",
]
