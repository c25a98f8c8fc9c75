"""Per-partner trust that each lab learns by itself (docs/partner_rules.md, "Trust").

Local state of a lab's participant, saved in its checkpoint; nothing of it crosses the wire and no
message changes. Every partner starts neutral at weight 1. After each update the lab scores each
partner from its own view of that update (`hacfed.clients.partner_rules` counts it from the
coordinator's verified rewards and the learner's own likelihood, never from a peer's claim):

    y = useful / short   (short: prompts where the learner fell short and the partner answered;
                          useful: those where a kept sample of the partner beat the learner's mean)
    s = clip(2 · y / trust_target − 1, −1, 1)        (no short prompt: no evidence, no change)
    w ← clip(w · exp(trust_rate · s), trust_floor, 1)

A partner that never helps (s = −1 every update) falls to exp(−5 · trust_rate) after 5 updates:
0.082 at the rate 0.5, below 10 %. One that helps on half the target share of the prompts holds
its weight; one that reaches it regains e^rate per update. The weight scales that partner's ω in
the learner's objective (`partner_rules.trust_factors`).
"""

from __future__ import annotations

import math
from typing import Mapping

from hacfed.clients.partner_rules import counts_from_metrics
from hacfed.hacpo_config import HacpoConfig

__all__ = ["PartnerTrust", "trust_signal"]


def trust_signal(short: int, useful: int, target: float) -> float | None:
    """s in [−1, 1] from one update's counts of a partner; None without a short prompt."""
    if short <= 0:
        return None
    return max(-1.0, min(1.0, 2.0 * (useful / short) / target - 1.0))


class PartnerTrust:
    """The lab's weight of each partner, in (trust_floor, 1]; 1 for a partner not seen yet."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self._weights: dict[str, float] = {}
        for partner, w in (weights or {}).items():
            if not (isinstance(w, (int, float)) and math.isfinite(w) and 0 < w <= 1):
                raise ValueError(f"trust weight of {partner!r} must be in (0, 1], got {w!r}")
            self._weights[str(partner)] = float(w)

    def weights(self) -> dict[str, float]:
        return dict(self._weights)

    def update(self, update_metrics: Mapping[str, float], cfg: HacpoConfig) -> None:
        """One step of every partner counted in an update's metrics; nothing when trust is off."""
        if cfg.trust_rate <= 0:
            return
        for partner, (short, useful) in sorted(counts_from_metrics(update_metrics).items()):
            s = trust_signal(short, useful, cfg.trust_target)
            if s is None:
                continue
            w = self._weights.get(partner, 1.0) * math.exp(cfg.trust_rate * s)
            self._weights[partner] = min(1.0, max(cfg.trust_floor, w))

    def metrics(self) -> dict[str, float]:
        """`trust/PARTNER` for every partner with a weight."""
        return {f"trust/{partner}": w for partner, w in sorted(self._weights.items())}
