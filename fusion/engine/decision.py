"""`FusionDecision`: a yes/no with the reason, combined with `&` and `|` (XLA style), shown in reports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FusionDecision:
    ok: bool
    reason: str = ""

    @classmethod
    def yes(cls, reason: str = "legal") -> FusionDecision:
        return cls(True, reason)

    @classmethod
    def no(cls, reason: str) -> FusionDecision:
        return cls(False, reason)

    def __bool__(self) -> bool:
        return self.ok

    def __and__(self, other: FusionDecision) -> FusionDecision:
        """Both must hold; a refusal carries the first failing reason."""
        if not self.ok:
            return self
        if not other.ok:
            return other
        return FusionDecision(True, _join(self.reason, other.reason))

    def __or__(self, other: FusionDecision) -> FusionDecision:
        """Either suffices; a refusal lists both reasons."""
        if self.ok:
            return self
        if other.ok:
            return other
        return FusionDecision(False, _join(self.reason, other.reason, " and "))


def _join(a: str, b: str, sep: str = "; ") -> str:
    if a in ("", "legal"):
        return b
    if b in ("", "legal"):
        return a
    return f"{a}{sep}{b}"
