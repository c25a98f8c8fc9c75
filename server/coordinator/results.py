"""What the coordinator answers: a submission's result and its receipt, a closed round's summary, and
what a transport reports of a round and of each lab's step (`RoundOutcome`, `StepRecord`).

Runs in the coordinator's ServerApp process (the Flower ServerApp that hacfed-server's SuperLink
starts, through `hacfed.server.driver`) and, in-process, in `hacfed sim`.

A `Receipt` exists only for a submission the journal has committed (security.md "Nothing lost": accepted ⇔
ACKed ⇔ durable). Its JSON form is stored with the submission, so an identical resend gets a
byte-identical receipt back. Signing it (T12) is the transport's job.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from hacfed.server.coordinator.errors import ErrorCode
from hacfed.server.coordinator.validation import Rejection

if TYPE_CHECKING:
    from hacfed.server.coordinator.metrics import RoundSummary


@dataclass(frozen=True)
class Receipt:
    run_id: str
    round_id: int
    participant_id: str
    seq: int  # the journal's submission sequence number
    content_hash: str  # sha256 of the submission's canonical encoding (validation.submission_digest)
    accepted: int
    rejected: int
    nonce: str = ""  # the submission's nonce (hex): which of the lab's outbox entries this answers

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class SubmissionResult:
    """accepted_ids: trajectory ids now in the journal (verified rewards).
    rejected: `(trajectory_id or None, code, detail)` for every refused trajectory, missing group,
      invalid report, or (alone, with receipt None) the gate that refused the whole submission.
    receipt: present iff the submission was recorded. replayed: this is the stored answer to an
      identical earlier submission (nothing new was written)."""

    accepted_ids: tuple[str, ...]
    rejected: tuple[Rejection, ...]
    receipt: Receipt | None
    replayed: bool = field(default=False, compare=False)

    @property
    def recorded(self) -> bool:
        return self.receipt is not None

    @property
    def refusal(self) -> ErrorCode | None:
        """The code that refused the whole submission before anything was recorded, else None."""
        if self.receipt is None and self.rejected:
            return self.rejected[0].code
        return None

    def to_json(self) -> str:
        return json.dumps(
            {
                "accepted_ids": list(self.accepted_ids),
                "rejected": [[r.trajectory_id, r.code.value, r.detail] for r in self.rejected],
                "receipt": json.loads(self.receipt.to_json()) if self.receipt else None,
            },
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str, replayed: bool = False) -> "SubmissionResult":
        data: Mapping[str, Any] = json.loads(text)
        receipt = Receipt(**data["receipt"]) if data["receipt"] else None
        return cls(
            accepted_ids=tuple(data["accepted_ids"]),
            rejected=tuple(Rejection(tid, ErrorCode(code), detail) for tid, code, detail in data["rejected"]),
            receipt=receipt,
            replayed=replayed,
        )


@dataclass(frozen=True)
class RoundClosed:
    round_id: int
    reason: str  # "quorum" (every expected participant answered) or "deadline"
    below_quorum: bool  # fewer than min_participants contributed accepted groups
    accepted: int  # accepted trajectories, all counted in the capability update
    contributors: tuple[str, ...]
    capabilities: Mapping[str, float]


@dataclass(frozen=True)
class ResumeReport:
    """What `Coordinator.resume` found: the open round that continues (same id and deadline), or
    the round it closed because its deadline had passed, and the next round to open."""

    open_round: int | None
    closed_on_resume: RoundClosed | None
    next_round: int


@dataclass(frozen=True)
class StepRecord:
    """One lab's step on the transport's clock (simulated seconds; 0 on the real clock) and what it trained on."""

    participant_id: str
    step: int  # the round whose plan it rolled out; `rounds` for the final update
    start: float
    finish: float
    idle: float  # waited since its previous step finished
    compute: float  # cost x speed factor
    staleness: tuple[int, ...]  # of each sample it was sent (0: the round just before its step)
    own_step: int | None = None  # round_join "newest": how many rounds the lab rolled out before this step
    skipped: int = 0  # round_join "newest": accepted samples of peer rounds skipped for this step

    def metrics(self) -> dict[str, float]:
        """The metrics row's `sim/*` keys (docs/experiments.md)."""
        out = {"sim/start_s": self.start, "sim/finish_s": self.finish, "sim/idle_s": self.idle,
               "sim/compute_s": self.compute, "sim/trained_samples": float(len(self.staleness))}
        if self.staleness:
            out["sim/staleness_mean"] = sum(self.staleness) / len(self.staleness)
            out["sim/staleness_max"] = float(max(self.staleness))
        for s in sorted(set(self.staleness)):
            out[f"sim/staleness_{s}"] = float(self.staleness.count(s))
        if self.own_step is not None:
            out["sim/own_step"] = float(self.own_step)
            out["sim/skipped_samples"] = float(self.skipped)
        return out


@dataclass(frozen=True)
class RoundOutcome:
    round_id: int
    closed: RoundClosed
    results: Mapping[str, SubmissionResult]  # participant -> what its submission got
    failures: Mapping[str, str]  # participant -> why it produced no submission
    summary: RoundSummary
    steps: Mapping[str, StepRecord] = field(default_factory=dict)  # participant -> its step of this round
