"""Red team, round 12: a pass from scratch over the correctness judgement, the speed-credit decisions, the static
checks and the extraction of the answer's code (session 20, a helper's pass with the source open).

Each test asserts what a sound judge does. The holes below were reproduced 3 of 3 times when this pass was made and
fixed in the same session (each "Fixed:" line says how). The
candidates run with ``integrity="off"`` where the runtime alone must hold, ``strict`` where the static checks are the
attack's target.

Attacks, their mechanism, what happened:

1. (hole) The static checks fail open. ``static_findings`` ran every check inside one ``try`` and, when one raised,
   returned what had been found so far. ``fold_str`` raised on a name built with ``"{0.a}".format(0)``
   (AttributeError, not among the exceptions it caught) and on ``[c for c in range(0, 1, 0)]`` (ValueError, outside
   the folding of calls that caught it). The checks walk the tree breadth first, so one such ``getattr`` in a ``try``
   at the top of the module hid everything deeper: ``import gc`` in ``forward`` (``introspection``, rejected under
   ``strict``), ``torch.compile`` (``pytorch_compiler``), and every fallback, decoy and replay finding (the behaviour
   pass never ran). Measured: ``correct`` under ``strict`` (3 of 3) for a candidate ``rejected`` without the prefix.
   Fixed: ``fold_str`` gives up (a computed name) on any exception, and ``static_findings`` adds ``unchecked`` (no
   speed credit) when a check raises, instead of returning a clean partial list.
1b. (hole) A coding declaration. The precheck parses and checks the answer's text; the runner writes it to a file as
   UTF-8 and imports it, and Python decodes a file by its PEP 263 declaration. Under ``# coding: utf-7`` the comment
   text ``+AAo-`` is a line break (``\\u000a`` under ``unicode_escape``), so code after it in a comment runs and no
   check, dedup key (``program_key``: comments dropped) or reader ever sees it. Measured: hidden ``import gc`` under
   ``strict``: ``correct`` (3 of 3, no finding at all); hidden ``y = y * 0.0``: ``incorrect``, proving it ran.
   Fixed: ``Evaluator._precheck`` gives ``compile_error`` to a source whose declared encoding is not UTF-8
   (``evaluator.declared_encoding_error``).
2. (hole) Stalls of the caller in the static checks, which run in the caller's thread (``Evaluator.submit``:
   ``env.step``, the GRPO reward function, ``evaluate-model``) before any stage limit. ``_CallGraph.mro`` searched a
   list for each class seen and kept no memo, and the call graph asks for the MRO of every class and of the class of
   every ``self.x`` it resolves: cubic in the depth of an inheritance chain. ``_Structure._binding_nodes`` scanned
   every value for every ``triton.jit(...)`` call: quadratic. Measured (2 cores): chains of 800 / 1,600 / 2,400
   one-line classes 2.2 / 13 / 37 s (a 93 KB chain of 3,800, under the 100,000 characters the checks parse, about
   150 s by the cubic); 4,500 ``k = triton.jit(f)`` lines (98 KB) 8.3 s. Fixed: ``mro`` is memoised per class and
   walks with a set; ``_binding_nodes`` looks values up by identity in an index (after: 1.4 s, 3.9 s for 3,800, 0.7 s).
3. (hole) Telling the widened trial by its values. On a problem whose own inputs make the output equal the input
   (ReLU of ``torch.rand``), one more trial runs on ``3 * randn`` inputs (``correctness._widened_trial``). A forward
   that looks at 256 of its input's values knows which it got: both signs mean the widened trial, where it computes;
   none negative means the problem's own inputs, where it returns its input untouched. Every timed call got the
   problem's own inputs, and the input passed every timed check. Measured: ``correct`` at 1.3-3.2x (5 runs) for a
   forward whose computing path is 200 ReLUs (a true ~0.01x); under ``strict``, a Triton ReLU on the widened path and
   the same kernel on 256 elements otherwise: ``correct`` with speed credit (3 of 3; 0.11x on the CPU interpreter,
   where the 256-element launch dominates; on a GPU the shortcut is free). Fixed: once the widened trial has judged
   a problem, its timed calls (baseline, candidate, calibration, output checks) run on widened inputs too
   (``state["widen"]`` from ``correctness.run_trials``; ``timing.time_pair``, ``calibrate_overhead``,
   ``reference_outputs``; ``timed_checks.timed_output_check``); the shortcut then computes in every timed call: 0.012x.
3b. (hole) The input, once the trials are over, where it is within the tolerance of the answer on inputs of both
   signs too (``x + 2e-5 * tanh(3x)``: a LayerScale-like residual). The trials flag the problem degenerate and hold a
   candidate to 0.3x the input's own relative error (here 1.7e-5 -> 5.2e-6); the widened trial is skipped (the input
   is the answer there too); the timed checks held an output to the tolerance and the 1 x rtol relative L2 bound
   only. Computing honestly until the determinism rerun and returning the input after: ``correct`` at 36-39x for a
   true ~0.6-1x (4 of 4; ``degenerate_problem`` is a note). Fixed: on a degenerate problem a timed output is also
   compared with the trivial outputs of its own inputs (zeros, the input), as a trial's is
   (``timed_checks.timed_output_check``): ``incorrect``, ``timing_mismatch``.
4. (hole) Its own kernel in the trials and the timing's warm-up call, PyTorch after. ``fallback`` was given where a
   candidate whose trials launched kernels launched none in the whole timing stage; the warm-up calls count, so one
   launch in the first timed call kept the flag away. With the two paths picked by indexing a tuple of methods
   (``(self._kernel, self._eager)[self.calls > 4](x)``) the static fallback check (if/else branches) does not see it
   either. Measured under ``strict``: ``correct``, no flag, speed credit, PyTorch's time (3 of 3). Fixed: a candidate
   whose trials launched kernels gets ``fallback`` if any timed call launched none (``PairedTiming.unlaunched``).
5. (hole, what a reader sees) The extraction split blocks where Markdown does not. ``fenced_blocks`` broke lines with
   ``str.splitlines`` (also at ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028``, ``\\u2029``; Markdown
   and Python break only at ``\\n``, ``\\r\\n``, ``\\r``), and ended a block at any line beginning with ``` (Markdown:
   a line of at least the opening fence's characters and nothing else, indented at most 3 spaces). So text after
   ``# comment\\u2028`` was a comment to every reader and code to the evaluator, and a ``    ```python`` line inside a
   string of the block split it: Markdown (and the block run as written) shows ModelNew computing the reference, the
   evaluator ran a later part, ``x * 0.0`` (deterministic: a pure function). The program paid is then not the one a
   transcript, a reviewer or a code-reading monitor sees. Fixed: ``fenced_blocks`` breaks lines and closes fences as
   Markdown does (CommonMark's rules, checked against ``markdown_it`` where installed).

Found, not fixed (design, reported):

6. (hole) A token kernel earns the speed credit. ``no_custom_kernel`` was decided by the launch count alone: the
   reference's own PyTorch code plus one launch of a kernel that loads and stores one element of the output was
   ``correct`` with speed credit under ``strict`` (3 of 3; reward 0.4 + speed against -0.1 for the plain copy, the
   learning check's most common "correct" answer). Fixed (in the session, after the helper's pass): the job's last
   call runs forward once more on fresh inputs with the candidate's own kernels doing nothing (a Triton launch
   skipped; an extension function run on copies of its arguments, its tensor results spoiled:
   ``launches.LaunchCounter.knockout``); a right answer then is ``token_kernel``, no speed credit
   (``correctness.kernels_needed``, ``kernel_checks.knockout_check``). Beside it: a ``load_inline`` function that computes the
   answer with ``torch::`` ops was a kernel too (measured once: ``x * 2.0 + 1.0`` in a C++ function, ``correct``,
   no flag, speed credit); on a GPU an extension now counts only where its CUDA sources define a ``__global__``
   function (``launches._defines_device_kernel``; tests/test_launches.py, the CPU counts every C++ extension).
   Open: such a function beside a ``__global__`` it never launches; and a candidate that reads our source can tell
   the knocked-out call (its kernel's side effect missing) and spoil its own answer there (the counter is in its
   process).

All evaluations run on one CPU Evaluator of the module.
"""

from __future__ import annotations

import time

import pytest
from device import DEVICE

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.extract import extract_code
from kb_gym.integrity import static_findings
from kb_gym.problems import reference_as_candidate

CHECK = EvalConfig(trials=2, timing=False, load_timeout=60, correctness_timeout=60)
TIMED = EvalConfig(trials=2, timing_min_reps=10, timing_max_reps=20, timing_warmup=1, timing_max_seconds=10,
                   load_timeout=60, correctness_timeout=60, timing_timeout=90)
TIMED_OFF = TIMED.replace(integrity="off")


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


SCALE = Problem(id=3, name="3_ScaleShift", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
""")

HEAD = "import torch\nimport torch.nn as nn\n"


# --- 1. the static checks fail open ------------------------------------------------------------------------------

GC_IN_FORWARD = HEAD + """

class ModelNew(nn.Module):
    def forward(self, x):
        import gc
        gc.collect()
        return x * 2.0 + 1.0
"""
# A getattr whose name the checks fold, raising there (and at run time, where the candidate catches it).
CHECK_CRASHERS = {
    "format_attribute": 'try:\n    getattr(0, "{0.a}".format(0))\nexcept AttributeError:\n    pass\n',
    "range_step_zero": "try:\n    getattr(0, [c for c in range(0, 1, 0)])\nexcept (TypeError, ValueError):\n    pass\n",
}


def _crashed(name: str) -> str:
    return GC_IN_FORWARD.replace(HEAD, HEAD + "\n" + CHECK_CRASHERS[name], 1)


@pytest.mark.parametrize("name", sorted(CHECK_CRASHERS))
def test_a_name_the_checks_cannot_fold_hides_nothing_after_it(name):
    assert "introspection" in {f.flag for f in static_findings(GC_IN_FORWARD)}  # the control: seen without it
    assert "introspection" in {f.flag for f in static_findings(_crashed(name))}


def test_a_check_that_raises_leaves_the_source_unchecked(monkeypatch):
    """Whatever a future check raises on, the pass fails closed: ``unchecked`` (no speed credit), not a clean list."""
    from kb_gym.integrity import behaviour
    from kb_gym.integrity.policy import get_policy

    def broken(self):
        raise RuntimeError("a check's own bug")

    monkeypatch.setattr(behaviour._Behaviour, "run", broken)
    flags = {f.flag for f in static_findings(HEAD + "\nclass ModelNew(nn.Module):\n    pass\n")}
    assert "unchecked" in flags and get_policy("strict").action("unchecked") == "no_speed_credit"


def test_the_hidden_import_is_rejected_before_any_worker_runs(ev):
    r = ev.evaluate(SCALE, _crashed("format_attribute"), config=CHECK)
    assert r.status == "rejected" and "introspection" in r.flags, (r.status, r.flags, r.error)


# --- 1b. a coding declaration: the runner decodes the file by it, the checks read the text ---------------------

HIDDEN_BY_UTF7 = "# coding: utf-7\n" + HEAD + """

class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.add(x * 2.0, 1.0)  # scale and shift+AAo-        import gc+AAo-        gc.collect()
        return y
"""
HIDDEN_BY_ESCAPES = HIDDEN_BY_UTF7.replace("utf-7", "unicode_escape").replace("+AAo-", "\\u000a")


@pytest.mark.parametrize("source", [HIDDEN_BY_UTF7, HIDDEN_BY_ESCAPES], ids=["utf-7", "unicode_escape"])
def test_a_coding_declaration_cannot_make_the_runner_run_other_code(ev, source):
    assert not static_findings(source)  # the text the checks (and a reader) see is clean
    assert "import gc" in source.encode().decode(source.split()[2])  # the program Python reads from the file
    r = ev.evaluate(SCALE, source, config=CHECK)
    assert r.status == "compile_error" and "encoding" in (r.error or ""), (r.status, r.flags, r.error)


def test_a_utf8_declaration_is_fine():
    from kb_gym.evaluator import declared_encoding_error

    assert declared_encoding_error("# -*- coding: utf-8 -*-\n" + GC_IN_FORWARD) is None
    assert declared_encoding_error(GC_IN_FORWARD) is None
    assert "latin-1" in declared_encoding_error("# coding: latin-1\n" + GC_IN_FORWARD) or "8859" in declared_encoding_error(
        "# coding: latin-1\n" + GC_IN_FORWARD)


# --- 2. a stall of the caller in the static checks --------------------------------------------------------------

def _class_chain(n: int) -> str:
    lines = [HEAD, "class A0(nn.Module):\n    pass"]
    lines += [f"class A{i}(A{i - 1}): pass" for i in range(1, n)]
    lines += [f"class ModelNew(A{n - 1}):\n    def forward(self, x):\n        return self.scale(x)\n"]
    return "\n".join(lines)


def _jit_bindings(n: int) -> str:
    return (HEAD + "import triton\n\n\ndef f(p):\n    pass\n\n\n" + "".join(f"k{i} = triton.jit(f)\n" for i in range(n))
            + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        k0[(1,)](x)\n        return x\n")


def test_adversarial_shapes_do_not_stall_the_checks():
    """Measured before the fix on this 2-core machine: 37 s for the chain, 8 s for the bindings; after: 1.4 s, 0.7 s."""
    sources = [_class_chain(2_400), _jit_bindings(4_500)]
    assert all(len(s) < 100_000 for s in sources)  # parsed and checked whole (names.MAX_PARSE_CHARS)
    started = time.process_time()  # CPU time: a loaded CI machine stretches the wall, not this
    for source in sources:
        static_findings(source)
    assert time.process_time() - started < 20.0


# --- 3. telling the widened trial by its values -----------------------------------------------------------------

RAND_RELU = Problem(id=19, name="19_ReLUOfRand", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.rand(256, 1024)]

def get_init_inputs():
    return []
""")

SIGN_SNIFFER = HEAD + """

class ModelNew(nn.Module):
    def forward(self, x):
        if bool((x.reshape(-1)[:256] < 0).any()):  # both signs: the judge's widened trial
            y = x
            for _ in range(200):  # the computing path, slow
                y = torch.relu(x)
            return y
        return x  # torch.rand inputs: the answer is the input
"""


def test_the_widened_trial_cannot_be_told_from_a_timed_call(ev):
    r = ev.evaluate(RAND_RELU, SIGN_SNIFFER, config=TIMED_OFF)
    assert r.correctness.get("widened_trial"), r.correctness
    # the computing path is 200 ReLUs: honestly timed, far below 1x; the shortcut was timed at several x
    assert r.status == "correct" and r.speedup is not None and r.speedup < 0.5, (r.status, r.speedup, r.error)


def test_an_honest_kernel_on_the_widened_problem_is_timed_as_before(ev):
    r = ev.evaluate(RAND_RELU, reference_as_candidate(RAND_RELU), config=TIMED_OFF)
    assert r.status == "correct" and r.correctness.get("widened_trial"), (r.status, r.error)
    assert set(r.flags) <= {"no_custom_kernel", "degenerate_problem"}, (r.flags, r.correctness.get("envelope"))
    assert 0.2 < r.speedup < 5, r.speedup


# --- 3b. the input, once the trials are over, where it is within the tolerance of the answer ----------------------

TINY_RESIDUAL = Problem(id=21, name="21_TinyResidual", level=1, code="""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x + 2e-5 * torch.tanh(3.0 * x)

def get_inputs():
    return [torch.randn(256, 1024)]

def get_init_inputs():
    return []
""")

INPUT_AFTER_THE_RERUN = HEAD + """

class ModelNew(nn.Module):
    def forward(self, x):
        if getattr(self, "stale", False):
            return x  # the trials are over: the input is within the tolerance of the answer
        if getattr(self, "last", None) is not None and torch.equal(x, self.last):
            self.stale = True  # the determinism rerun: the same inputs twice
        self.last = x.clone()
        return x + 2e-5 * torch.tanh(3.0 * x)
"""


def test_the_input_returned_in_timed_calls_is_caught_where_the_trials_caught_it(ev):
    r = ev.evaluate(TINY_RESIDUAL, INPUT_AFTER_THE_RERUN, config=TIMED_OFF)
    assert "widened_trial" not in r.correctness, r.correctness  # the input is the answer on 3 * randn too
    assert r.status == "incorrect" and "timing_mismatch" in r.flags, (r.status, r.speedup, r.flags, r.error)


def test_an_honest_kernel_on_the_tiny_residual_is_correct(ev):
    r = ev.evaluate(TINY_RESIDUAL, reference_as_candidate(TINY_RESIDUAL), config=TIMED_OFF)
    assert r.status == "correct" and set(r.flags) <= {"no_custom_kernel", "degenerate_problem"}, (r.status, r.flags,
                                                                                                  r.error)


# --- 4. its own kernel in the trials and the warm-up call, PyTorch after ----------------------------------------

KERNEL_UNTIL_WARMUP = HEAD + """import triton
import triton.language as tl


@triton.jit
def _scale_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    v = tl.load(src_ptr + offs, mask=mask, other=0.0)
    tl.store(dst_ptr + offs, v * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def _kernel(self, x):
        src = x.contiguous()
        out = torch.empty_like(src)
        n = src.numel()
        _scale_kernel[(triton.cdiv(n, 1024),)](src, out, n, BLOCK=1024)
        return out

    def _eager(self, x):
        return x * 2.0 + 1.0

    def forward(self, x):
        self.calls += 1
        # 2 trials, the rerun on the same inputs and the timing's warm-up call: the kernel; then PyTorch
        return (self._kernel, self._eager)[self.calls > 4](x)
"""


def test_pytorch_after_the_warm_up_call_is_a_fallback(ev):
    assert "fallback" not in {f.flag for f in static_findings(KERNEL_UNTIL_WARMUP)}  # the static check misses it
    r = ev.evaluate(SCALE, KERNEL_UNTIL_WARMUP, config=TIMED)
    assert r.status == "correct" and r.custom_kernel_launches, (r.status, r.error)
    assert "fallback" in r.flags and r.speed_credit is False, (r.flags, r.speed_credit)


# --- 5. line ends in the extraction -----------------------------------------------------------------------------

@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85", "\x0c", "\x0b", "\x1c", "\x1d", "\x1e"],
                         ids=lambda s: f"U+{ord(s):04X}")
def test_the_code_run_is_the_block_a_reader_sees(sep):
    block = (HEAD + "\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
             f"        return x * 2.0 + 1.0  # as the reference{sep}        return x * 0.0\n")
    assert extract_code(f"Here it is:\n```python\n{block}```\n").code == block


NESTED_FENCES = HEAD + """
_NOTE = \"\"\"
    ```python
\"\"\"


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


_OLD = \"\"\"
    ```python
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 0.0
# \"\"\"
"""


def test_a_fence_line_inside_a_string_of_the_block_does_not_split_it():
    """Markdown reads one block (its "    ```python" lines, in strings, are no fences: indented 4 and with an info
    string), whose Python defines ModelNew as the reference; the evaluator read two and ran the second, x * 0."""
    text = f"Here it is:\n```python\n{NESTED_FENCES}```\n"
    assert extract_code(text).code == NESTED_FENCES
    markdown_it = pytest.importorskip("markdown_it")
    tokens = markdown_it.MarkdownIt("commonmark").parse(text)
    assert [t.content for t in tokens if t.type == "fence"] == [NESTED_FENCES]


@pytest.mark.parametrize("text, code", [
    ("````python\nA = '''\n```\n'''\nclass ModelNew: pass\n````\n", "A = '''\n```\n'''\nclass ModelNew: pass\n"),
    ("1. The kernel:\n    ```python\n    class ModelNew: pass\n    ```\n", "    class ModelNew: pass\n"),
    ("```python\nclass ModelNew: pass\n```   \nprose\n", "class ModelNew: pass\n"),
], ids=["longer_fence", "in_a_list", "closing_fence_with_spaces"])
def test_fences_close_where_markdown_closes_them(text, code):
    assert extract_code(text).code == code


def test_markdown_line_ends_still_split():
    block = HEAD + "\nclass ModelNew(nn.Module):\n    pass\n"
    for end in ("\n", "\r\n", "\r"):
        text = f"```python\n{block}```\n".replace("\n", end)
        assert extract_code(text).code.replace(end, "\n").rstrip("\n") == block.rstrip("\n"), repr(end)


# --- 6. a token kernel beside PyTorch -------------------------------------------------------------------------------

TOKEN_KERNEL = HEAD + """import triton
import triton.language as tl


@triton.jit
def _touch(ptr):
    tl.store(ptr, tl.load(ptr))


class ModelNew(nn.Module):
    def forward(self, x):
        y = x * 2.0 + 1.0
        _touch[(1,)](y)
        return y
"""

SCALE_KERNEL = HEAD + """import triton
import triton.language as tl


@triton.jit
def _scale_shift(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _scale_shift[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""


@pytest.mark.parametrize("config", [CHECK, TIMED], ids=["untimed", "timed"])
def test_a_token_kernel_beside_pytorch_earns_no_speed_credit(ev, config):
    r = ev.evaluate(SCALE, TOKEN_KERNEL, config=config)
    assert r.status == "correct", (r.status, r.error)
    assert "token_kernel" in r.flags and r.speed_credit is False, (r.flags, r.custom_kernel_launches)


def test_a_kernel_that_computes_the_answer_keeps_its_credit(ev):
    r = ev.evaluate(SCALE, SCALE_KERNEL, config=CHECK)
    assert r.status == "correct" and r.custom_kernel_launches, (r.status, r.error)
    assert "token_kernel" not in r.flags and r.speed_credit is True, r.flags
