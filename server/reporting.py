"""What a federation round looks like from outside: console lines, JSONL rows, the time split.

Runs in the coordinator's ServerApp process, called by the round driver (`hacfed.server.driver`).

Pure functions over the coordinator's `RoundSummary` and the driver's timings, so the driver stays
about exchanges and these formats are tested without Flower.

Time split of round r (all seconds):
  wall         the round was opened (journal) -> closed
  coordinator  the driver's own work: opening, building and signing updates, opening and judging
               submissions (re-verification), closing and journaling
  rollout, training, eval
               what the slowest participant (last reply) reported for its step
  exchange     the rest: Flower transport (SuperNode and ServerApp pulls, the SuperNode's resident
               ClientApp runner thread, or a fresh `flwr-clientapp` per message with
               HACFED_CLIENTAPP_ISOLATION=subprocess; the relay), waiting for stragglers, and the
               participant's checkpoint write

Rows use the keys of `hacfed sim` (round, agent, mode, seed, reward_mean, eval_accuracy when
evaluated, accepted, rejected, capability, train/*) plus time_* and, after the run, rows with
"final": true carrying the evaluation after training on the last pool.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

from hacfed.server.coordinator.metrics import RoundSummary
from hacfed.server.coordinator.validation import Rejection

_STEP_PARTS = ("rollout", "training", "eval", "checkpoint")

# A lab's step report is its own word: finite but absurd values (1.7e308 s twice sums to infinity)
# would reach the time split, the metrics file and the dashboard. Only values in these ranges are kept.
MAX_STEP_TIME_S = 86_400.0  # no step of a round takes a day
MAX_COUNT = 1e9
MAX_METRIC_ABS = 1e12  # any other metric (losses, norms, rewards)
_FRACTION_SUFFIXES = ("_frac", "_fraction", "accuracy")
_FRACTION_PREFIXES = ("eval_greedy/", "eval_pass1")
_COUNT_PREFIXES = ("num_", "skipped_")


def metric_problem(key: str, value: object) -> str | None:
    """Why a reported metric is not kept (None when it is): not a finite number, or out of its range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"{key} is not a finite number"
    if key.startswith("time_"):
        low, high = 0.0, MAX_STEP_TIME_S
    elif key.endswith(_FRACTION_SUFFIXES) or key.startswith(_FRACTION_PREFIXES):
        low, high = 0.0, 1.0
    elif key.startswith(_COUNT_PREFIXES):
        low, high = 0.0, MAX_COUNT
    else:
        low, high = -MAX_METRIC_ABS, MAX_METRIC_ABS
    if not low <= value <= high:
        return f"{key} = {value:.3g} is outside [{low:g}, {high:g}]"
    return None


def sane_metrics(metrics: Mapping[str, Any]) -> tuple[dict[str, float], list[str]]:
    """The metrics of a lab's report that are kept, and a reason for each one dropped."""
    kept: dict[str, float] = {}
    dropped: list[str] = []
    for key, value in metrics.items():
        problem = metric_problem(str(key), value)
        if problem is None:
            kept[str(key)] = float(value)
        else:
            dropped.append(problem)
    return kept, dropped


def sane_fraction(value: float | None) -> float | None:
    """A reported accuracy, or None when it is not in [0, 1]."""
    return value if value is None or metric_problem("accuracy", value) is None else None


@dataclass(frozen=True)
class StepTimes:
    """One participant's step as it reported it, plus its round trip seen by the driver."""

    rollout_s: float
    training_s: float
    eval_s: float
    checkpoint_s: float
    round_trip_s: float | None

    @property
    def compute_s(self) -> float:
        return self.rollout_s + self.training_s + self.eval_s + self.checkpoint_s

    @property
    def exchange_s(self) -> float | None:
        """Round trip minus the participant's own work: what the transport cost it."""
        return None if self.round_trip_s is None else max(self.round_trip_s - self.compute_s, 0.0)

    @classmethod
    def from_report(cls, metrics: Mapping[str, float], round_trip_s: float | None) -> "StepTimes":
        """Out-of-range times (see `metric_problem`) count as 0: the split stays finite."""
        kept, _ = sane_metrics({f"time_{part}_s": metrics.get(f"time_{part}_s", 0.0) for part in _STEP_PARTS})
        values = {part: kept.get(f"time_{part}_s", 0.0) for part in _STEP_PARTS}
        return cls(values["rollout"], values["training"], values["eval"], values["checkpoint"], round_trip_s)


@dataclass(frozen=True)
class RoundTimes:
    wall_s: float
    coordinator_s: float
    rollout_s: float
    training_s: float
    eval_s: float
    exchange_s: float
    slowest: str | None


def split_round(wall_s: float, coordinator_s: float, steps: Mapping[str, StepTimes]) -> RoundTimes:
    """The round's wall time as rollout + training + eval + exchange + coordinator (see module doc)."""
    answered = {pid: s for pid, s in steps.items() if s.round_trip_s is not None}
    if not answered:
        return RoundTimes(wall_s, coordinator_s, 0.0, 0.0, 0.0, max(wall_s - coordinator_s, 0.0), None)
    slowest = max(answered, key=lambda pid: answered[pid].round_trip_s or 0.0)
    s = answered[slowest]
    training = s.training_s + s.checkpoint_s
    exchange = max(wall_s - coordinator_s - s.rollout_s - training - s.eval_s, 0.0)
    return RoundTimes(wall_s, coordinator_s, s.rollout_s, training, s.eval_s, exchange, slowest)


def round_rows(
    summary: RoundSummary, mode: str, seed: int, times: RoundTimes | None, steps: Mapping[str, StepTimes]
) -> list[dict[str, Any]]:
    """One JSONL row per participant of a closed round."""
    rows = []
    for m in summary.participants:
        row: dict[str, Any] = {
            "round": summary.round_id, "agent": m.participant_id, "mode": mode, "seed": seed,
            "reward_mean": m.reward_mean, "accepted": m.accepted, "rejected": m.rejected,
            "capability": m.capability, "submitted": m.submitted, "quarantined": m.quarantined,
        }
        if sane_fraction(m.eval_accuracy) is not None:
            row["eval_accuracy"] = m.eval_accuracy
        row.update({f"train/{k}": v for k, v in sane_metrics(m.train_metrics)[0].items()})
        if times is not None:
            row["time_round_s"] = times.wall_s
            row["time_coordinator_s"] = times.coordinator_s
        step = steps.get(m.participant_id)
        if step is not None:
            row.update(time_rollout_s=step.rollout_s, time_training_s=step.training_s + step.checkpoint_s,
                       time_eval_s=step.eval_s, time_exchange_s=step.exchange_s)
        rows.append(row)
    return rows


def final_row(participant_id: str, rounds: int, mode: str, seed: int, report: Mapping[str, Any]) -> dict[str, Any]:
    """The row of a participant's final report (training on the last pool, then evaluation)."""
    row: dict[str, Any] = {"round": rounds, "agent": participant_id, "mode": mode, "seed": seed, "final": True}
    if sane_fraction(report.get("eval_accuracy")) is not None:
        row["eval_accuracy"] = report["eval_accuracy"]
    row.update({f"train/{k}": v for k, v in sane_metrics(dict(report.get("metrics", {})))[0].items()})
    return row


def finite_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row without non-finite numbers: `Infinity` or `NaN` in metrics.jsonl is not JSON, and
    every reader of the file (dashboard, `hacfed report`) would have to guard against it."""
    return {k: v for k, v in row.items() if not (isinstance(v, float) and not math.isfinite(v))}


def append_rows(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(finite_row(row), sort_keys=True, allow_nan=False) + "\n")
        fh.flush()


def rounds_written(path: Path) -> tuple[set[int], bool]:
    """Rounds that already have rows in the metrics file, and whether final rows exist (so a
    restarted driver writes each round once)."""
    path = Path(path)
    if not path.exists():
        return set(), False
    rounds, final = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a crash mid-write; the round is written again
        if row.get("final"):
            final = True
        elif isinstance(row.get("round"), int):
            rounds.add(row["round"])
    return rounds, final


# -- console --------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def participant_line(summary: RoundSummary, participant_id: str, step: StepTimes | None) -> str | None:
    for m in summary.participants:
        if m.participant_id != participant_id:
            continue
        text = (f"round {summary.round_id} {participant_id}: reward {_fmt(m.reward_mean)} eval {_fmt(m.eval_accuracy)} "
                f"P {_fmt(m.capability)} accepted {m.accepted} rejected {m.rejected}")
        if m.quarantined:
            text += " QUARANTINED"
        if not m.submitted:
            text += " (no submission)"
        if step is not None:
            text += (f" | rollout {step.rollout_s:.1f}s training {step.training_s + step.checkpoint_s:.1f}s "
                     f"eval {step.eval_s:.1f}s exchange {_fmt(step.exchange_s, 1)}s")
        return text
    return None


def participant_lines(summary: RoundSummary, steps: Mapping[str, StepTimes], connected: Collection[str]) -> list[str]:
    """The console line of each participant of a closed round that submitted, or that is connected
    and not quarantined (a lab that left is not named every round)."""
    lines = []
    for m in summary.participants:
        line = participant_line(summary, m.participant_id, steps.get(m.participant_id))
        if line and (m.submitted or (m.participant_id in connected and not m.quarantined)):
            lines.append(line)
    return lines


def round_line(summary: RoundSummary, times: RoundTimes | None) -> str:
    reason = summary.close_reason or "?"
    if summary.below_quorum:
        reason += ", fewer contributors than min_participants"
    text = f"round {summary.round_id} closed ({reason})"
    if times is not None:
        text += (f" in {times.wall_s:.1f}s = rollout {times.rollout_s:.1f} + training {times.training_s:.1f} + "
                 f"eval {times.eval_s:.1f} + exchange {times.exchange_s:.1f} + coordinator {times.coordinator_s:.1f}")
        if times.slowest:
            text += f" (slowest: {times.slowest})"
    return text


def rejection_line(round_id: int, participant_id: str, rejected: Sequence[Rejection], total: int) -> str:
    """`round 2 lab-c: REJECTED 4 of 4: HACFED-E-REWARD-MISMATCH x4 (first: ...)`."""
    counts = Counter(r.code.value for r in rejected)
    codes = ", ".join(f"{code} x{n}" for code, n in sorted(counts.items()))
    return (
        f"round {round_id} {participant_id}: REJECTED {len(rejected)} of {total}: {codes} "
        f"(first: {rejected[0].detail})"
    )
