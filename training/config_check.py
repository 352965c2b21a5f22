"""Every training and evaluation option checked before any model loads: one line naming the bad key (and the
nearest valid one) or the bad value, instead of a traceback minutes into a run."""

from __future__ import annotations

import dataclasses
import difflib
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from kb_gym.training.errors import ConfigError

_ARTICLE = {int: "an"}


def check_keys(section: str, given: Mapping[str, Any], valid: Iterable[str]) -> None:
    """ConfigError for the first key of ``given`` not in ``valid``, with the closest valid name."""
    names = sorted(set(valid))
    for key in given:
        if key not in names:
            near = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else f"; valid: {', '.join(names)}"
            raise ConfigError(f"unknown {section} option {key!r}{hint}")


def check_types(section: str, given: Mapping[str, Any], cls: type) -> None:
    """ConfigError for a value whose type differs from its field's default (an int, float, bool or str):
    ``--grpo max_steps=ten`` is caught here, not by an arithmetic error in the trainer's first step."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    for key, value in given.items():
        default = defaults.get(key)
        if default is None or not isinstance(default, bool | int | float | str) or value is None:
            continue
        wanted = type(default)
        ok = isinstance(value, bool) if wanted is bool else (
            isinstance(value, int | float) and not isinstance(value, bool) if wanted is float else
            isinstance(value, wanted) and not (wanted is int and isinstance(value, bool)))
        if not ok:
            article = _ARTICLE.get(wanted, "a")
            raise ConfigError(f"{section} option {key!r} takes {article} {wanted.__name__} "
                              f"(default {default!r}), got {value!r}")


def check_eval_config(fields: Mapping[str, Any], section: str = "--eval") -> None:
    """The keys against EvalConfig's fields, then the values through EvalConfig itself."""
    from kb_gym.config import EvalConfig

    check_keys(section, fields, (f.name for f in dataclasses.fields(EvalConfig)))
    check_types(section, fields, EvalConfig)
    try:
        EvalConfig(**fields)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{section}: {exc}") from None


def check_grpo_config(fields: Mapping[str, Any], section: str = "--grpo") -> None:
    """The keys against TRL's GRPOConfig fields, then the values through GRPOConfig (in a scratch folder)."""
    from trl import GRPOConfig

    check_keys(section, fields, (f.name for f in dataclasses.fields(GRPOConfig)))
    check_types(section, fields, GRPOConfig)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            GRPOConfig(**{"output_dir": scratch, "report_to": [], **fields})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{section}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
