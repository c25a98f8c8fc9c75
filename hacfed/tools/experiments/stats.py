"""Statistics over seeds for `hacfed bench modes`: mean with a 95 % Student-t interval, paired differences.

    hacfed bench modes --matrix bench/modes.toml --out runs/modes --report-only

Pure functions on plain floats (no numpy, no scipy). Seeds are the unit of replication: each run's
final accuracy is one observation, and a mode is compared with the baseline per seed (same prompt
plans, same starting models), which removes the seed-to-seed spread the two modes share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Two-sided 95 % quantiles of Student's t, t_{0.975, df}, df = 1..30 (standard table, 4 decimals).
T_975 = {
    1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060, 9: 2.2622,
    10: 2.2281, 11: 2.2010, 12: 2.1788, 13: 2.1604, 14: 2.1448, 15: 2.1314, 16: 2.1199, 17: 2.1098,
    18: 2.1009, 19: 2.0930, 20: 2.0860, 21: 2.0796, 22: 2.0739, 23: 2.0687, 24: 2.0639, 25: 2.0595,
    26: 2.0555, 27: 2.0518, 28: 2.0484, 29: 2.0452, 30: 2.0423,
}

# Accuracies are counts / problems, so a difference this small is float rounding, not a win.
TIE_TOLERANCE = 1e-9


def t_975(df: int) -> float:
    """t_{0.975, df}; beyond df 30 the df-30 value (slightly wider than exact, never narrower)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return T_975[min(df, 30)]


@dataclass(frozen=True)
class Estimate:
    """Mean of n observations and the half-width of its 95 % CI (None when n = 1: no interval)."""

    mean: float
    half_width: float | None
    n: int

    @property
    def above_zero(self) -> bool:
        """The whole interval lies above 0 (needs n >= 2)."""
        return self.half_width is not None and self.mean - self.half_width > 0


@dataclass(frozen=True)
class PairedDifference:
    """Per-seed differences value − baseline over the seeds present in both."""

    estimate: Estimate
    positive: int  # seeds where the difference is > 0
    seeds: tuple[int, ...]


def mean_ci(values: Sequence[float]) -> Estimate:
    """Mean ± t_{0.975, n−1} · s / √n, with s the sample standard deviation (n − 1 denominator)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = math.fsum(values) / n
    if n == 1:
        return Estimate(mean, None, 1)
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return Estimate(mean, t_975(n - 1) * math.sqrt(variance / n), n)


def paired_difference(values: Mapping[int, float], baseline: Mapping[int, float]) -> PairedDifference | None:
    """Differences values[s] − baseline[s] for the seeds s in both; None when no seed is shared."""
    seeds = tuple(sorted(set(values) & set(baseline)))
    if not seeds:
        return None
    diffs = [values[s] - baseline[s] for s in seeds]
    return PairedDifference(mean_ci(diffs), sum(d > TIE_TOLERANCE for d in diffs), seeds)
