"""Errors of the training commands that the CLI turns into one line."""

from __future__ import annotations


class ModelLoadError(OSError):
    """A model id or path that ``transformers`` cannot load (missing, offline, not a causal LM)."""


class ConfigError(ValueError):
    """An option of a training or evaluation command that is unknown or has a bad value."""
