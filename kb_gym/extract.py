"""Pull candidate source out of raw text or an LLM completion."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PY_TAGS = {"", "python", "py", "python3", "py3"}
_MODELNEW = re.compile(r"\bclass\s+ModelNew\b")
# Where Markdown and Python end a line. str.splitlines also ends one at \x0b, \x0c, \x1c-\x1e, \x85, \u2028 and
# \u2029, so text after "# note\u2028" in a block was a comment to every reader and code to the evaluator (round 12).
_LINE_END = re.compile(r"\r\n|\r|\n")
_FENCE = re.compile(r"(`{3,}|~{3,})(.*)")  # a fence's run of backticks or tildes, then its info string


@dataclass(frozen=True)
class Extraction:
    """The code found, or why none was: ``code is None`` means a format error."""

    code: str | None
    error: str | None = None


def extract_code(text: str) -> Extraction:
    """Return the code that defines ``ModelNew``.

    Rules: if the text holds fenced blocks, take the last python/py/untagged block that defines
    ``ModelNew`` (models often draft, then correct themselves); otherwise, if the text has no fences
    and mentions ``class ModelNew``, take all of it as raw source.
    """
    if not isinstance(text, str):
        return Extraction(None, f"the action must be text, got {type(text).__name__}")
    if "\x00" in text:
        return Extraction(None, "the text contains NUL bytes; send Python source, optionally in a "
                                "```python fenced block")
    if not text.strip():
        return Extraction(None, "empty answer: send Python source that defines class ModelNew(nn.Module), "
                                "in a ```python fenced block")
    all_blocks = fenced_blocks(text)
    blocks = [body for lang, body in all_blocks if lang in _PY_TAGS]
    with_model = [body for body in blocks if _MODELNEW.search(body)]
    if with_model:
        return Extraction(with_model[-1].strip("\n") + "\n")
    if _MODELNEW.search(text) and not all_blocks:
        return Extraction(text)  # raw source; a syntax error in it is the compiler's verdict
    if all_blocks:
        return Extraction(None, f"found {len(all_blocks)} code block(s) but none defines class ModelNew; "
                                "the answer must define class ModelNew(nn.Module) with Model's "
                                "constructor and forward signature")
    return Extraction(None, "no code found: put the full program defining class ModelNew(nn.Module) "
                            "in a ```python fenced block")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of each fenced block, in order, by one linear pass over the lines.

    A line-based scan rather than one regex: adversarial text (thousands of fences) must cost
    milliseconds. An unclosed final block (a completion cut off by max_tokens) is kept so the
    compiler, not the parser, says what is wrong with it.

    A block ends where Markdown ends it: at a line of the opening fence's character, at least as many
    of them and nothing else, indented at most 3 spaces more than the opening fence. Any line that
    began with ``` used to end it, so "    ```python" inside a string of the block (a Markdown reader's
    code: one block) split it for the evaluator, which ran a later part of it (round 12).
    """
    blocks: list[tuple[str, str]] = []
    fence: str | None = None
    indent = 0
    lang = ""
    body: list[str] = []
    for line in _LINE_END.split(text):
        stripped = line.strip(" \t")  # indentation is spaces and tabs, as for Markdown and Python
        if fence is None:
            # Markdown opens a fence only at the start of a line; prose that mentions ``` does not.
            opening = _FENCE.match(stripped)
            if opening and not (opening[1][0] == "`" and "`" in opening[2]):  # ```x``` is inline code
                fence, indent = opening[1], len(line) - len(line.lstrip(" \t"))
                words = opening[2].split()
                lang = words[0].lower() if words else ""
                body = []
        elif (stripped.startswith(fence) and not stripped.strip(fence[0])
              and len(line) - len(line.lstrip(" \t")) <= indent + 3):
            blocks.append((lang, "\n".join(body)))
            fence = None
        else:
            body.append(line)
    if fence is not None:
        blocks.append((lang, "\n".join(body)))
    return blocks
