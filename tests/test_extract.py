"""Code extraction from completions: the rules a policy's output is judged by."""

from __future__ import annotations

import time

from kb_gym.extract import extract_code, fenced_blocks

MODEL = "class ModelNew(nn.Module):\n    pass"


def test_last_python_block_with_modelnew_wins():
    text = f"Draft:\n```python\n{MODEL}  # v1\n```\nBetter:\n```py\n{MODEL}  # v2\n```\n```\nprint('no model')\n```"
    assert extract_code(text).code.strip().endswith("# v2")


def test_untagged_and_tilde_fences_and_unclosed_final_block():
    assert extract_code(f"```\n{MODEL}\n```").code.strip() == MODEL
    assert extract_code(f"~~~python\n{MODEL}\n~~~").code.strip() == MODEL
    assert extract_code(f"here it is\n```python\n{MODEL}").code.strip() == MODEL  # cut off by max_tokens


def test_prose_mentioning_a_fence_does_not_open_one():
    text = f"Sure, in one ```python block:\n```python\n{MODEL}\n```"
    assert extract_code(text).code.strip() == MODEL


def test_raw_source_without_fences():
    assert extract_code(f"import torch.nn as nn\n{MODEL}\n").code.startswith("import torch.nn")


def test_other_languages_are_not_taken():
    r = extract_code("```cpp\nclass ModelNew {};\n```")
    assert r.code is None and "none defines class ModelNew" in r.error


def test_errors_for_empty_binary_and_non_text():
    assert "empty" in extract_code("  \n").error
    assert "NUL" in extract_code("a\x00b").error
    assert "text" in extract_code(b"bytes").error
    assert "no code" in extract_code("just prose").error


def test_adversarial_sizes_stay_fast():
    for text in ["```" * 100_000, "```\n" * 500_000, "x" * 5_000_000]:
        t0 = time.perf_counter()
        extract_code(text)
        assert time.perf_counter() - t0 < 2.0
    assert len(fenced_blocks("```a\nx\n```\n```b\ny\n```")) == 2
