"""Integrity policies: what each flag costs (reject, no speed credit or a note) and the registry of policies."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kb_gym.integrity.findings import ALWAYS_FAIL, Finding

ACTIONS = ("reject", "no_speed_credit", "note")


@dataclass(frozen=True)
class IntegrityPolicy:
    """What each flag costs: ``reject`` (verdict ``rejected`` before running), ``no_speed_credit``, else note."""

    name: str
    reject: frozenset[str] = frozenset()
    no_speed_credit: frozenset[str] = frozenset()
    description: str = ""

    def action(self, flag: str | Finding) -> str:
        """``"reject"``, ``"no_speed_credit"`` or ``"note"`` for a flag name (or a :class:`Finding`)."""
        name = flag.flag if isinstance(flag, Finding) else flag
        if name in self.reject:
            return "reject"
        if name in self.no_speed_credit:
            return "no_speed_credit"
        return "note"

    def rejections(self, findings: Iterable[Finding]) -> list[Finding]:
        """The findings that make the verdict ``rejected`` under this policy."""
        return [f for f in findings if self.action(f.flag) == "reject"]

    def speed_credit_denied(self, findings: Iterable[Finding]) -> list[Finding]:
        """The findings that remove speed credit (not rejections) under this policy."""
        return [f for f in findings if self.action(f.flag) == "no_speed_credit"]


POLICIES: dict[str, IntegrityPolicy] = {
    "strict": IntegrityPolicy(
        name="strict",
        reject=frozenset({"harness_patch", "timer_patch", "introspection", "concurrency", "io_escape",
                          "tensor_subclass", "star_import"}) | ALWAYS_FAIL,
        no_speed_credit=frozenset({"no_custom_kernel", "token_kernel", "fallback", "decoy", "input_mutation",
                                   "side_stream", "excessive_speedup", "nondeterministic", "replay", "precision_change",
                                   "dynamic_code", "unchecked", "unverifiable_output", "pytorch_compiler",
                                   "unlisted_import", "unverified_timing"}),
        description="default: reject harness, timer, introspection, concurrency, I/O and tensor-subclass "
                    "hacks and star imports; no speed credit for fallbacks, decoys, replays, other imports "
                    "outside the allowlist and runtime integrity flags",
    ),
    "kernelbench": IntegrityPolicy(
        name="kernelbench",
        description="KernelBench's own rules: any correct candidate counts, every flag is a note "
                    "(the engine still fails tampering and timing mismatches)",
    ),
    "off": IntegrityPolicy(name="off", description="every flag is a note"),
}


def get_policy(name: str) -> IntegrityPolicy:
    """The policy called ``name``; ``ValueError`` naming the known policies otherwise."""
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown integrity policy {name!r}; known policies: {', '.join(POLICIES)}") from None
