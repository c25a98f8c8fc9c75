"""Per-round, per-participant metrics for the console and the JSONL metrics file.

Runs in the coordinator's ServerApp process (the Flower ServerApp that hacfed-server's SuperLink
starts, through `hacfed.server.driver`) and, in-process, in `hacfed sim`.

Everything reported for round r describes one policy per participant: the one that rolled out
round r's plan (after training on pool r-1). reward_mean is the mean verified reward of that
participant's accepted rollouts of round r; eval_accuracy and train metrics come from the
StepReport carried by the same submission.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from hacfed.server.coordinator.journal import ParticipantRecord, RoundRecord


@dataclass(frozen=True)
class ParticipantRoundMetrics:
    participant_id: str
    round_id: int
    submitted: bool
    accepted: int
    rejected: int
    reward_mean: float | None  # None when nothing was accepted
    eval_accuracy: float | None
    train_metrics: Mapping[str, float] = field(default_factory=dict)
    strikes: int = 0  # total so far
    quarantined: bool = False
    # P̂ after this round closed; None while open, and for a lab with no accepted sample yet, whose P̂
    # is the algorithm's starting 1.0 (hacfed.capability), not a measurement: shown as "P -".
    capability: float | None = None


@dataclass(frozen=True)
class RoundSummary:
    round_id: int
    state: str
    close_reason: str | None
    below_quorum: bool | None
    deadline: float
    participants: tuple[ParticipantRoundMetrics, ...]

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "round": self.round_id,
            "state": self.state,
            "close_reason": self.close_reason,
            "below_quorum": self.below_quorum,
            "deadline": self.deadline,
            "participants": {
                m.participant_id: {
                    "submitted": m.submitted,
                    "accepted": m.accepted,
                    "rejected": m.rejected,
                    "reward_mean": m.reward_mean,
                    "eval_accuracy": m.eval_accuracy,
                    "train": dict(m.train_metrics),
                    "strikes": m.strikes,
                    "quarantined": m.quarantined,
                    "capability": m.capability,
                }
                for m in self.participants
            },
        }

    def console_line(self) -> str:
        """One line per round, e.g. `round 3 closed (quorum): a reward 0.62 eval 0.55 P 0.60 | b ...`."""
        parts = []
        for m in self.participants:
            text = (
                f"{m.participant_id} reward {_fmt(m.reward_mean)} eval {_fmt(m.eval_accuracy)} P {_fmt(m.capability)}"
            )
            text += f" acc {m.accepted} rej {m.rejected}"
            if m.quarantined:
                text += " QUARANTINED"
            parts.append(text)
        reason = f" ({self.close_reason}{', below quorum' if self.below_quorum else ''})" if self.close_reason else ""
        return f"round {self.round_id} {self.state.lower()}{reason}: " + " | ".join(parts)


def build_round_summary(
    record: RoundRecord, participants: list[ParticipantRecord], stats: Mapping[str, Mapping[str, Any]],
    submitters: Mapping[str, int],
) -> RoundSummary:
    """Pure assembly from journal reads (`Journal.round_stats`, `Journal.submitters`)."""
    caps = record.capabilities or {}
    measured = {pid for pid, rates in ((record.tracker_state or {}).get("history") or {}).items() if rates}
    rows = []
    for p in participants:
        s = stats.get(p.participant_id, {})
        report = s.get("report") or {}
        rows.append(
            ParticipantRoundMetrics(
                participant_id=p.participant_id,
                round_id=record.round_id,
                submitted=p.participant_id in submitters,
                accepted=int(s.get("accepted", 0)),
                rejected=int(s.get("rejected", 0)),
                reward_mean=s.get("reward_mean"),
                eval_accuracy=report.get("eval_accuracy"),
                train_metrics=dict(report.get("metrics", {})),
                strikes=p.strikes,
                quarantined=p.quarantined,
                capability=caps.get(p.participant_id) if p.participant_id in measured else None,
            )
        )
    return RoundSummary(
        record.round_id, record.state, record.close_reason, record.below_quorum, record.deadline, tuple(rows)
    )


def append_jsonl(path: str | Path, summary: RoundSummary) -> None:
    """Append one JSON line per round (the metrics file); flushed so a tail -f sees it at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(summary.to_json_dict(), sort_keys=True) + "\n")
        fh.flush()


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
