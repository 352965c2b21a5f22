"""Static integrity checks: the policies that act on findings, and robustness (unparsable, odd and oversized
sources; the line scan that stands in for parsing past its limit). Fast, CPU only, nothing is executed."""

from __future__ import annotations

import ast
import random
import string
import time

import pytest
from test_static_checks import ATTACKS, candidate

from kb_gym.integrity import (
    ALWAYS_FAIL,
    MAX_PARSE_CHARS,
    POLICIES,
    RUNTIME_FLAGS,
    STATIC_FLAGS,
    IntegrityPolicy,
    get_policy,
    lines,
    static_findings,
)
from kb_gym.integrity.analyzer import _Analyzer
from kb_gym.integrity.lines import _LINE_RE, LINE_RULES, line_scan

# ------------------------------------------------------------------------------- policies


def test_strict_policy_actions():
    strict = get_policy("strict")
    for flag in ("harness_patch", "timer_patch", "introspection", "concurrency", "io_escape", "tensor_subclass",
                 "tampering", "timing_mismatch"):
        assert strict.action(flag) == "reject", flag
    for flag in ("no_custom_kernel", "fallback", "decoy", "input_mutation", "side_stream", "excessive_speedup",
                 "nondeterministic", "replay", "precision_change", "dynamic_code", "unchecked", "pytorch_compiler"):
        assert strict.action(flag) == "no_speed_credit", flag
    for flag in ("unused_kernel", "degenerate_problem", "some_new_flag"):
        assert strict.action(flag) == "note", flag
    assert ALWAYS_FAIL <= strict.reject
    assert strict.reject.isdisjoint(strict.no_speed_credit)


@pytest.mark.parametrize("name", ["kernelbench", "off"])
def test_lenient_policies_only_note(name):
    policy = get_policy(name)
    for flag in STATIC_FLAGS | RUNTIME_FLAGS:
        assert policy.action(flag) == "note", flag


def test_policies_cover_every_flag_and_take_findings():
    strict = POLICIES["strict"]
    # notes by design: how a problem was checked (degenerate, ill-conditioned) and how a launch-bound forward was
    # charged (its host time, back to back: a measurement, not a finding against the candidate)
    notes = {"degenerate_problem", "ill_conditioned", "launch_bound"}
    assert RUNTIME_FLAGS - notes <= strict.reject | strict.no_speed_credit
    assert not notes & (strict.reject | strict.no_speed_credit)
    assert STATIC_FLAGS - {"unused_kernel"} <= strict.reject | strict.no_speed_credit
    findings = static_findings(candidate("import threading  # <-\nimport torch.backends\n"
                                         "torch.backends.cudnn.benchmark = True"))
    assert [f.flag for f in strict.rejections(findings)] == ["concurrency"]
    assert [f.flag for f in strict.speed_credit_denied(findings)] == ["precision_change"]
    assert strict.action(findings[0]) == "reject"
    assert isinstance(strict, IntegrityPolicy) and set(POLICIES) == {"strict", "kernelbench", "off"}


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(ValueError, match="strict.*kernelbench.*off"):
        get_policy("lenient")


# ------------------------------------------------------------------------------- robustness


@pytest.mark.parametrize("text", [
    "", "   \n", "def broken(:\n", "class ModelNew(nn.Module)\n    pass", "\x00\x01", "(" * 500, "a" + "+a" * 20_000,
])
def test_unparsable_or_empty_sources_give_nothing(text):
    assert static_findings(text) == []


def test_odd_but_valid_sources_do_not_raise():
    for text in ("x = 1", "ModelNew = None", "class ModelNew:\n    pass", "import torch as nn\nnn.x = 1",
                 "a" + ".b" * 5000, "f(" * 150 + ")" * 150, "del x", "from . import y\ny.z = 1",
                 "from torch import *\nallclose = None", "class ModelNew(Base):\n    def forward(self):\n"
                 "        return super().forward()\n", "lambda: (yield)", "match x:\n    case 1:\n        pass\n"):
        assert isinstance(static_findings(text), list)


def test_one_megabyte_returns_within_a_second():
    # A guard against backtracking blow-ups (which take minutes), not a performance target: unloaded, the ordinary
    # megabyte takes about 0.15 s and the one holding every rule's needles about 0.9 s. Timed in this process's CPU
    # time: a loaded two-core CI machine stretched the wall time to 1.45 s (another test run beside it).
    rng = random.Random(0)
    junk = "".join(rng.choice(string.printable) for _ in range(1_000_000))
    valid = (candidate() + "\n") * (1_000_000 // len(candidate()) + 1)
    hacked = valid + "\ntorch.allclose = lambda *a, **k: True\n"
    every_needle = valid + "\n# " + " ".join(n for *_, needles in LINE_RULES for n in needles) + "\n"
    for text, bound in ((junk, 1.0), (valid, 1.0), (hacked, 1.0), (every_needle, 4.0)):
        start = time.process_time()
        findings = static_findings(text)
        assert time.process_time() - start < bound
        assert isinstance(findings, list)
    flags = {f.flag for f in static_findings(hacked)}
    assert {"unchecked", "harness_patch"} <= flags
    assert len(valid) > MAX_PARSE_CHARS


# One line per alternative of every line rule: the needle prefilter must never skip a rule that would match.
LINE_RULE_EXAMPLES = [
    "time.perf_counter = f", "timeit.default_timer = f", "torch.cuda.Event.elapsed_time = f",
    "torch.cuda.synchronize = f", "torch.cuda.Stream = f", "do_bench = f", "torch.allclose = f", "triton.x = 1",
    "np.testing.x = 1", "numpy.x = 1", "nn.Module.x = 1", "F.relu = f", "builtins.print = f", "sys.x = 1",
    "setattr(torch, 'x', 1)", "setattr( time, 'x', 1)", "sys.modules['x'] = y", "__builtins__", "importlib.reload(m)",
    "import kb_gym", "sys._getframe(1)", "inspect.currentframe()", "inspect.stack()", "f.f_back", "f.f_locals",
    "f.f_globals", "t.tb_frame", "gc.get_objects()", "gc.get_referrers(x)", "gc.get_referents(x)", "import ctypes",
    "open('/proc/self/mem')", "sys.settrace(f)", "sys.setprofile(f)", "object.__subclasses__()", "f.__globals__",
    "import threading", "from _thread import x", "import multiprocessing", "import subprocess", "import asyncio",
    "from concurrent import futures", "os.fork()", "os.system ('x')", "os.popen('x')", "os.execv(a, b)",
    "os.spawnl(a)", "import socket", "import urllib", "import requests", "from http import client", "import signal",
    "import psutil", "os.kill", "os.killpg", "os.chdir", "os.putenv", "os.environ['X'] = '1'",
    "def __torch_function__(cls): pass", "__torch_dispatch__", "torch.Tensor._make_subclass(c, x)",
    "torch.Tensor._make_wrapper_subclass(c, s)", "class T(torch.Tensor):", "class T( Tensor ) :", "exec('x')",
    "eval ('x')",
]


@pytest.mark.parametrize("line", LINE_RULE_EXAMPLES)
def test_the_line_scan_needles_never_skip_a_matching_rule(line):
    text = "\n# padding\n" * 3 + line + "\n"
    matching = [(regex, needles) for regex, _, _, needles in _LINE_RE if regex.search(text)]
    assert matching, f"{line!r} matches no line rule: the example list is stale"
    for regex, needles in matching:
        assert any(needle in text for needle in needles), f"{regex.pattern[:40]} matches {line!r} but its needles miss"


def test_every_attack_gets_the_same_line_scan_with_and_without_the_needles(monkeypatch):
    def scan(text: str) -> list[tuple[str, int | None]]:
        an = _Analyzer(ast.Module(body=[], type_ignores=[]))
        line_scan(an, text)
        return [(f.flag, f.line) for f in an.findings]

    texts = [source for _, source, _ in ATTACKS] + LINE_RULE_EXAMPLES
    with_needles = [scan(t) for t in texts]
    monkeypatch.setattr(lines, "_LINE_RE", [(regex, flag, what, ("",)) for regex, flag, what, _ in _LINE_RE])
    assert [scan(t) for t in texts] == with_needles


def test_oversized_source_still_gets_the_line_scan():
    text = candidate("import threading") + "\n# padding\n" * (MAX_PARSE_CHARS // 10)
    findings = static_findings(text)
    assert [f.flag for f in findings] == ["concurrency", "unchecked"]
    assert findings[0].line == 5 and "line 5" in findings[0].message
    assert findings[1].line is None and str(MAX_PARSE_CHARS) in findings[1].message


def test_largest_parsed_source_is_fast():
    unit = candidate()
    text = (unit * (MAX_PARSE_CHARS // len(unit)))[:MAX_PARSE_CHARS]
    text = text[: text.rfind("\nimport torch\n")]
    start = time.process_time()
    static_findings(text)
    # a guard against blow-ups (minutes), not a target: about 0.7 s here, in this process's CPU time (not the wall's,
    # which a loaded CI machine stretches)
    assert time.process_time() - start < 4.0
