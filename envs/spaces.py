"""CodeText: a Gymnasium Text space for source code and free-form text."""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

# Printable ASCII, used only to draw samples; ``contains`` accepts any character.
SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n"


class CodeText(spaces.Text):
    """Any ``str`` whose length is within ``[min_length, max_length]``.

    Gymnasium's :class:`~gymnasium.spaces.Text` checks every character against a charset
    (alphanumerics by default), which rejects source code: spaces, newlines, brackets, quotes,
    unicode in comments. ``contains`` here checks only the type and the length.

    ``sample()`` draws printable ASCII of a random length up to ``sample_max_length`` (256 by
    default, never more than ``max_length``) so that ``check_env`` and random agents stay cheap:
    random text is answered with ``format_error`` by the evaluator without running anything.
    """

    def __init__(self, max_length: int = 1_000_000, *, min_length: int = 0, sample_max_length: int = 256,
                 charset: str = SAMPLE_CHARSET, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=charset, seed=seed)
        if sample_max_length < self.min_length:
            raise ValueError(f"sample_max_length ({sample_max_length}) must be >= min_length ({self.min_length})")
        self.sample_max_length = int(min(sample_max_length, self.max_length))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        length = None
        if mask is not None:
            length, mask = mask
        elif probability is not None:
            length, probability = probability
        if length is None:
            length = self.np_random.integers(self.min_length, self.sample_max_length + 1)
        if probability is not None:
            return super().sample(probability=(length, probability))
        return super().sample(mask=(length, mask))

    def __repr__(self) -> str:
        return f"CodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object, /) -> bool:
        return (isinstance(other, CodeText) and self.min_length == other.min_length
                and self.max_length == other.max_length)
