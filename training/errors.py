"""Errors of the training commands that the CLI turns into one line."""

from __future__ import annotations


class ModelLoadError(OSError):
    """A model id or path that ``transformers`` cannot load (missing, offline, not a causal LM)."""
