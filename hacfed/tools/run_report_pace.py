"""Each lab's pace in a paced `hacfed sim` run: its steps on the simulated clock and how stale the
samples it trained on were, from the rows' `sim/*` keys (docs/staleness.md, docs/experiments.md).

    paces = lab_paces(rows)              # {} for a run whose rows carry no sim/* keys (synchronous, Flower)
    paces["tiny-gpt2"].idle_share        # 0.0 for the slowest lab, up to ~0.75 for a 4x faster one

A row's `sim/*` keys describe the step that produced it: `sim/start_s`, `sim/finish_s`, `sim/idle_s`
(waited since the lab's previous step finished), `sim/compute_s`, and what the update of that step
trained on: `sim/trained_samples`, `sim/staleness_mean`, `sim/staleness_max`, `sim/staleness_S`
(samples S rounds old). The final row (the final update) counts as a step, not as a round.

The numbers are the file's, and a lab's file is its own word: a value that is not a finite number
in [0, MAX_VALUE] is left out (and counted), so no sum becomes infinite and nothing non-finite
reaches the page.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

SIM_PREFIX = "sim/"
MAX_VALUE = 1e12  # seconds or samples: beyond any run, and finite however many rows are summed
MAX_STALENESS = 1000  # `sim/staleness_S` keys with a larger S are not a bound hacfed sim accepts
_BY_STALENESS = re.compile(r"sim/staleness_(\d{1,4})")


@dataclass(frozen=True)
class LabPace:
    """One lab's steps on the simulated clock, summed over the run."""

    rounds: int  # rounds it rolled out (rows with sim/* keys, the final update's row not counted)
    steps: int  # its updates: the rounds plus the final update
    last_round: int | None  # the last round it rolled out
    trained: float  # samples its updates trained on
    staleness_mean: float | None  # over those samples (each row's mean weighted by its samples)
    staleness_max: float | None
    by_staleness: Mapping[int, float]  # S -> samples S rounds old
    compute_s: float
    idle_s: float
    finish_s: float | None  # when its last step's submission (or final update) was done
    left_out: int = 0  # sim/* values not kept (not finite, negative or beyond MAX_VALUE)

    @property
    def idle_share(self) -> float | None:
        """Of its simulated time busy or waiting, the part it waited for slower labs."""
        total = self.idle_s + self.compute_s
        return self.idle_s / total if total > 0 else None


def sim_value(value: object) -> float | None:
    """A `sim/*` value as a float, or None when it is not a finite number in [0, MAX_VALUE]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0.0 <= value <= MAX_VALUE else None


def is_paced(row: Mapping[str, Any]) -> bool:
    return any(str(k).startswith(SIM_PREFIX) for k in row)


@dataclass
class _Sums:
    rounds: int = 0
    steps: int = 0
    last_round: int | None = None
    trained: float = 0.0
    weighted: float = 0.0  # sum of staleness_mean x trained_samples
    weighted_n: float = 0.0
    staleness_max: float | None = None
    by_staleness: dict[int, float] = field(default_factory=dict)
    compute_s: float = 0.0
    idle_s: float = 0.0
    finish_s: float | None = None
    left_out: int = 0

    def add(self, row: Mapping[str, Any]) -> None:
        values: dict[str, float] = {}
        for key, raw in row.items():
            if str(key).startswith(SIM_PREFIX):
                value = sim_value(raw)
                if value is None:
                    self.left_out += 1
                else:
                    values[str(key)] = value
        self.steps += 1
        if not row.get("final"):
            self.rounds += 1
            self.last_round = max(self.last_round if self.last_round is not None else -1, int(row["round"]))
        self.compute_s += values.get("sim/compute_s", 0.0)
        self.idle_s += values.get("sim/idle_s", 0.0)
        if "sim/finish_s" in values:
            self.finish_s = max(self.finish_s or 0.0, values["sim/finish_s"])
        trained = values.get("sim/trained_samples")
        if trained is not None:
            self.trained += trained
            if "sim/staleness_mean" in values:
                self.weighted += values["sim/staleness_mean"] * trained
                self.weighted_n += trained
        if "sim/staleness_max" in values:
            self.staleness_max = max(self.staleness_max or 0.0, values["sim/staleness_max"])
        for key, value in values.items():
            match = _BY_STALENESS.fullmatch(key)
            if match and int(match.group(1)) <= MAX_STALENESS:
                s = int(match.group(1))
                self.by_staleness[s] = self.by_staleness.get(s, 0.0) + value

    def pace(self) -> LabPace:
        mean = self.weighted / self.weighted_n if self.weighted_n > 0 else None
        return LabPace(self.rounds, self.steps, self.last_round, self.trained, mean, self.staleness_max,
                       dict(sorted(self.by_staleness.items())), self.compute_s, self.idle_s, self.finish_s,
                       self.left_out)


def lab_paces(rows: Sequence[Mapping[str, Any]]) -> dict[str, LabPace]:
    """agent -> its pace, for the agents whose rows carry `sim/*` keys; {} when none does."""
    sums: dict[str, _Sums] = {}
    for row in rows:
        if is_paced(row):
            sums.setdefault(str(row["agent"]), _Sums()).add(row)
    return {agent: s.pace() for agent, s in sorted(sums.items())}
