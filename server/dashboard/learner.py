"""What a lab's latest step report says about how its partners' samples act on it (the dashboard's
participants table; docs/partner_rules.md "What a lab sees every update").

Runs in the coordinator's process (the dashboard thread of hacfed-server). The values come from the
lab's own step report (`train/*` in the metrics file), so a lab can report anything: each is a finite
number in its range or is shown as missing, and at most MAX_TRUST partners' trust weights are kept,
their names cut to MAX_NAME characters (the page sets them as text, never as markup).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

MAX_TRUST = 8  # partners whose trust weight a row shows; more are counted in `trust_more`
MAX_NAME = 40
TRUST_PREFIX = "train/trust/"


def _share(value: Any) -> float | None:
    """A fraction in [0, 1], else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        return None
    return float(value)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def learner_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """From one lab's latest step-report row:

    kl_start: the k3 KL of its own samples to its start model during the update (`train/kl`);
    form_share: the share of its answers still in the form of its first rollout
      (`train/answer_form_start_share`);
    partner_grad: the share of partners' samples that carried gradient (`train/partner/grad_frac` with a
      learner-side rule, else `train/cross_grad_frac`);
    partner_context: the share used as hints by guided rollouts (`train/partner/in_context_frac`);
    trust: partner -> the lab's trust weight in it (`train/trust/PARTNER`), sorted by name;
    trust_more: how many more partners' weights the row carried."""
    grad = row.get("train/partner/grad_frac", row.get("train/cross_grad_frac"))
    weights = sorted((str(key)[len(TRUST_PREFIX):], _share(value)) for key, value in row.items()
                     if str(key).startswith(TRUST_PREFIX))
    weights = [(name[:MAX_NAME], w) for name, w in weights if name and w is not None]
    shown: dict[str, float] = {}
    for name, w in weights:  # two names cut to the same text: the first stands, the other is counted
        if len(shown) < MAX_TRUST and name not in shown:
            shown[name] = w
    kl = _finite(row.get("train/kl"))
    return {
        "kl_start": kl if kl is None or kl >= 0.0 else None,
        "form_share": _share(row.get("train/answer_form_start_share")),
        "partner_grad": _share(grad),
        "partner_context": _share(row.get("train/partner/in_context_frac")),
        "trust": shown,
        "trust_more": len(weights) - len(shown),
    }


__all__ = ["MAX_NAME", "MAX_TRUST", "learner_view"]
