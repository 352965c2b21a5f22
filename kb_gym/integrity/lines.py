"""The line scan: regular expressions over the raw text, for sources too large to parse (``unchecked``).

It names the blatant patches, frame reads, threads, processes and escapes, and checks every ``import`` line
against the same allowlist as the parsed checks; anything subtler is left to the runtime checks.
"""

from __future__ import annotations

import bisect
import re

from kb_gym.integrity.analyzer import _Analyzer
from kb_gym.integrity.names import MAX_PER_FLAG

# Each rule carries the literal needles one of which every match contains: a rule whose needles are all absent
# is skipped with a substring test (memchr speed) instead of a regex pass, which is what keeps a megabyte of
# ordinary source well under a second (the alternations below cost 0.05-0.25 s a megabyte each).
_MODULES = ("torch", "triton", "np", "numpy", "nn", "F", "builtins", "sys")
LINE_RULES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (r"\b(?:time|timeit)\.\w+\s*=(?!=)", "timer_patch", "assigns to a clock", ("time.", "timeit.")),
    (r"\btorch\.cuda\.(?:Event|synchronize|Stream)\b[\w.]*\s*=(?!=)", "timer_patch", "assigns to a CUDA timing API",
     ("torch.cuda.",)),
    (r"\bdo_bench\s*=(?!=)", "timer_patch", "assigns to do_bench", ("do_bench",)),
    (r"\b(?:torch|triton|np|numpy|nn|F|builtins|sys)(?:\.\w+)+\s*=(?!=)", "harness_patch",
     "assigns to a module attribute", tuple(f"{m}." for m in _MODULES)),
    (r"\bsetattr\(\s*(?:torch|triton|np|numpy|nn|F|builtins|sys|time)\b", "harness_patch", "calls setattr on a module",
     ("setattr(",)),
    (r"\bsys\.modules\[[^\]\n]{0,200}\]\s*=(?!=)|__builtins__|importlib\.reload|\bkb_gym\b", "harness_patch",
     "patches the interpreter or imports the evaluator",
     ("sys.modules[", "__builtins__", "importlib.reload", "kb_gym")),
    (r"_getframe|currentframe|inspect\.stack|\bf_back\b|\bf_locals\b|\bf_globals\b|\btb_frame\b|gc\.get_(?:objects|referrers|referents)|\bctypes\b|/proc/|settrace|setprofile|__subclasses__|__globals__",
     "introspection", "inspects frames, objects or memory",
     ("_getframe", "currentframe", "inspect.stack", "f_back", "f_locals", "f_globals", "tb_frame", "gc.get_", "ctypes",
      "/proc/", "settrace", "setprofile", "__subclasses__", "__globals__")),
    (r"^\s*(?:import|from)\s+(?:threading|_thread|multiprocessing|subprocess|asyncio|concurrent)\b|\bos\.(?:fork|system|popen|exec\w*|spawn\w*)\s*\(",
     "concurrency", "uses threads or processes",
     ("threading", "_thread", "multiprocessing", "subprocess", "asyncio", "concurrent", "os.")),
    (r"^\s*(?:import|from)\s+(?:socket|urllib|requests|http|signal|psutil)\b|\bos\.(?:kill|killpg|chdir|putenv)\b|\bos\.environ\[[^\]\n]{0,200}\]\s*=(?!=)",
     "io_escape", "uses the network, signals or the environment",
     ("socket", "urllib", "requests", "http", "signal", "psutil", "os.")),
    (r"__torch_function__|__torch_dispatch__|_make_subclass|_make_wrapper_subclass|\(\s*(?:torch\.)?Tensor\s*\)\s*:",
     "tensor_subclass", "subclasses or hooks torch.Tensor",
     ("__torch_function__", "__torch_dispatch__", "_make_subclass", "_make_wrapper_subclass", "Tensor")),
    (r"\b(?:exec|eval)\s*\(", "dynamic_code", "builds code at run time", ("exec", "eval")),
)
_LINE_RE = [(re.compile(p, re.MULTILINE), flag, what, needles) for p, flag, what, needles in LINE_RULES]
_ITEM = r"[\w.]+(?:[ \t]+as[ \t]+\w+)?"
_IMPORT_RE = re.compile(rf"^[ \t]*import[ \t]+({_ITEM}(?:[ \t]*,[ \t]*{_ITEM})*)", re.MULTILINE)
_FROM_RE = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\*)?", re.MULTILINE)


def line_scan(an: _Analyzer, source: str) -> None:
    starts = [0]
    starts.extend(m.end() for m in re.finditer("\n", source))
    for regex, flag, what, needles in _LINE_RE:
        if not any(needle in source for needle in needles):
            continue
        for match in regex.finditer(source):
            line = bisect.bisect_right(starts, match.start())
            an.add(flag, line, f"{what} (`{match.group(0).strip()[:40]}`)")
            if an.per_flag.get(flag, 0) >= MAX_PER_FLAG:
                break
    for match in _IMPORT_RE.finditer(source):
        line = bisect.bisect_right(starts, match.start())
        for item in match.group(1).split(","):
            an.check_import(item.split()[0], line)
    for match in _FROM_RE.finditer(source):
        line = bisect.bisect_right(starts, match.start())
        dots, module, star = match.groups()
        if dots or not module:
            an.add("harness_patch", line, f"imports `{dots}{module}` relative to the package the candidate is "
                   "loaded from, which may be the evaluator's")
            continue
        an.check_import(module, line)
        if star:
            an.add("star_import", line, f"imports every name of `{module}` with `*`")
