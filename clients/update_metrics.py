"""What one learner's HACPO update reports: the minibatches' metrics averaged, and per source of
cross samples the ratio quantiles and the fraction carrying gradient (`train/cross/SOURCE/STAT`).

Used by `hacfed.clients.update` and `hacfed.clients.update_parallel`; read back by
`hacfed.tools.run_report` and `hacfed.tools.experiments.results`.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

from torch import Tensor

from hacfed.algorithm import SampleFlags
from hacfed.trajectory import TrainingView


class CrossRow(NamedTuple):
    """One cross sample as the loss saw it."""

    source: str
    ratio: float
    advantage: float
    carries: bool  # `SampleFlags.carries`: its objective depended on the policy


def cross_rows(views: Sequence[TrainingView], advantages: Tensor, flags: SampleFlags) -> list[CrossRow]:
    """The cross samples of one minibatch (views, advantages and flags of the same rows)."""
    return [
        CrossRow(v.source_id, ratio, adv, carries)
        for v, ratio, adv, carries in zip(views, flags.ratio.tolist(), advantages.tolist(), flags.carries.tolist())
        if not v.is_self
    ]


def summarize_cross(rows: Sequence[tuple[str, float, float, bool]]) -> dict[str, float]:
    """Per source: ratio quantiles (of the samples trained on), the fraction carrying gradient, and
    the advantage sign of those."""
    out: dict[str, float] = {}
    by_source: dict[str, list[tuple[float, float, bool]]] = {}
    for source, s, adv, carries in rows:
        by_source.setdefault(source, []).append((s, adv, carries))
    for source, items in by_source.items():
        ratios = sorted(s for s, _, _ in items if math.isfinite(s))  # a sample skipped untrained has none
        for q in (0.1, 0.5, 0.9) if ratios else ():
            out[f"cross/{source}/ratio_p{int(q * 100)}"] = ratios[min(len(ratios) - 1, int(q * len(ratios)))]
        signed = [(s, adv) for s, adv, _ in items if adv != 0]
        if signed:
            out[f"cross/{source}/pos_frac"] = sum(adv > 0 for _, adv in signed) / len(signed)
            for name, keep in (("pos", lambda a: a > 0), ("neg", lambda a: a < 0)):
                values = sorted(s for s, adv in signed if keep(adv))
                if values:
                    out[f"cross/{source}/ratio_p50_{name}"] = values[len(values) // 2]
        carrying = [adv for _, adv, c in items if c]
        out[f"cross/{source}/grad_frac"] = len(carrying) / len(items)
        if carrying:
            out[f"cross/{source}/grad_pos_frac"] = sum(a > 0 for a in carrying) / len(carrying)
    return out


class UpdateLog:
    """Accumulates each minibatch's metrics (the finite ones) and cross rows over one update."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._cross: list[CrossRow] = []
        self.updates = 0

    def add(self, metrics: dict[str, float], cross: Sequence[CrossRow]) -> None:
        self.updates += 1
        for key, value in metrics.items():
            if isinstance(value, float) and math.isfinite(value):
                self._sums[key] = self._sums.get(key, 0.0) + value
                self._counts[key] = self._counts.get(key, 0) + 1
        self._cross.extend(cross)

    def carrying_cross(self) -> dict[str, int]:
        """{source: how many of its samples carried gradient} over the update so far."""
        out: dict[str, int] = {}
        for row in self._cross:
            if row.carries:
                out[row.source] = out.get(row.source, 0) + 1
        return out

    def summary(self, views: Sequence[TrainingView], advantages: Tensor, skipped: int) -> dict[str, float]:
        """The averaged metrics, the update's shape and its advantages, and the per-source rows."""
        out = {k: self._sums[k] / self._counts[k] for k in self._sums}
        own_adv = advantages[[v.is_self for v in views]]
        out.update(
            num_samples=float(len(views)),
            num_updates=float(self.updates),
            adv_mean=float(advantages.mean()),
            adv_abs_mean=float(advantages.abs().mean()),
            own_adv_abs_mean=float(own_adv.abs().mean()) if own_adv.numel() else 0.0,
            skipped_views=float(skipped),
        )
        out.update(summarize_cross(self._cross))
        return out
