"""The entry point of the static checks: parse (or line-scan) a candidate's source and run every check."""

from __future__ import annotations

import ast

from kb_gym.integrity.analyzer import _Analyzer
from kb_gym.integrity.behaviour import _Behaviour
from kb_gym.integrity.checks import _SimpleChecks
from kb_gym.integrity.findings import Finding
from kb_gym.integrity.lines import line_scan
from kb_gym.integrity.names import MAX_PARSE_CHARS
from kb_gym.integrity.structure import _Structure


def static_findings(source: str) -> list[Finding]:
    """Integrity findings in a candidate's source, sorted by line; ``[]`` when it does not parse. Never raises."""
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    if not isinstance(source, str) or not source.strip():
        return []
    if len(source) > MAX_PARSE_CHARS:
        an = _Analyzer(ast.Module(body=[], type_ignores=[]))
        try:
            line_scan(an, source)
        except Exception:  # noqa: BLE001 - the checks must never break an evaluation
            pass
        an.add("unchecked", None, f"the source has {len(source)} characters, over the {MAX_PARSE_CHARS} the static "
               "checks parse, so only a line scan ran",
               "fallbacks, decoys and replays were not checked, so the result gets no speed credit")
        return _sorted(an.findings)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return []
    except Exception:  # noqa: BLE001
        return []
    an = _Analyzer(tree)
    try:
        an.collect()
        _SimpleChecks(an).run()
        st = _Structure(an)
        st.build()
        _Behaviour(an, st).run()
    except Exception as exc:  # noqa: BLE001 - the checks must never break an evaluation, nor pass what they skipped
        # What the checks did not reach is unchecked, as an oversized source is: a check that raised on one node
        # ended the pass there, and everything after it (forward's imports, fallbacks, decoys) went unseen (round 12)
        an.add("unchecked", None, f"the static checks failed on this source ({type(exc).__name__}), so part of it "
               "was not checked", "fallbacks, decoys and replays may not have been checked, so the result gets no "
               "speed credit")
    return _sorted(an.findings)


def _sorted(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (f.line is None, f.line or 0, f.flag))
