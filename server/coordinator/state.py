"""The coordinator's round state machine, transport-independent and torch-free.

Runs in the coordinator's ServerApp process (the Flower ServerApp that hacfed-server's SuperLink
starts, through `hacfed.server.driver`) and, in-process, in `hacfed sim`.

    journal = Journal(cfg.journal_path)
    coord = Coordinator(cfg, task, journal); coord.resume()
    coord.register("lab-a"); plan = coord.open_round(0); update = coord.engine.update_for("lab-a", 0).update
    result = coord.submit(submission)                 # returns after the journal commit (the ACK point)
    if coord.poll(): coord.close_round(coord.poll())  # quorum or deadline

Rounds go OPEN -> CLOSED(quorum|deadline) -> PUBLISHED (its pool was handed out). All state lives in
the journal; this object only caches immutable things (plans; the accepted samples and the latest
pool in its `KeptSamples`, `kept_pool`) and the capability tracker, which is restored from the
journal on construction. Submissions go to its `SubmissionIntake` (`intake`), which it builds and
hands the journal, its lock, clock and plans. A transport (in-process `transport.run_rounds` or
Flower) drives it; every method is safe to call from several threads.

Closing rules: a round may close early once every active (registered, not quarantined, not
`withdrawn`: revoked) participant has answered and at least `expected_participants` have, less one
per withdrawn participant (never below `min_participants`). Once the deadline passes it closes if at
least `min_participants` contributed accepted groups; otherwise the deadline is extended by
`round_deadline_s` up to `max_deadline_extensions` times (journaled), after which it closes with what
it has, flagged below quorum and logged as a warning. Submissions are accepted until the round is
closed, even after its deadline.

With `max_staleness` K >= 1 (docs/staleness.md) up to K + 1 rounds are open at once: round r opens
once round r - K - 1 closed, rounds close oldest first by the same rules, and a lab's update is
`engine.update_for(lab, step)` (`engine`). K = 0 is the synchronous federation above.

Capability (issue 9, "capability inflation by omission"): when a round closes, every participant
with a recorded submission is scored over ALL of its assigned samples (prompts x G): each sample
that was not accepted (a planned prompt it left out, or a group that was rejected) counts as
reward 0 in P̂. Rejecting a whole submission for one missing prompt was the alternative; it was not
chosen because it does not stop the same attack made with a spoiled group instead of a missing one
(send an invalid sample so that a group it got wrong is rejected), unless any invalid group also
rejected the whole submission, which would throw away an honest lab's round for one malformed
sample. Zero-reward accounting removes the gain of both with one rule and keeps the good groups.

Caps (`limits`) run before any costly work; a coordinator whose audit log cannot be written fails
closed (`failed_closed`): it refuses every submission with AUDIT_UNAVAILABLE until restarted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Callable

from hacfed.capability import CapabilityTracker
from hacfed.messages import RoundPlan, Submission
from hacfed.server.coordinator.config import CoordinatorConfig
from hacfed.server.coordinator.engine import RoundEngine
from hacfed.server.coordinator.errors import CoordinatorStateError, safe_text
from hacfed.server.coordinator.intake import FailClosed, SubmissionIntake
from hacfed.server.coordinator.journal import Journal, ParticipantRecord, RoundRecord
from hacfed.server.coordinator.kept_pool import KeptSamples
from hacfed.server.coordinator.limits import SubmissionLimiter
from hacfed.server.coordinator.metrics import RoundSummary, build_round_summary
from hacfed.server.coordinator.plan import make_plan, plan_from_json, plan_to_json
from hacfed.server.coordinator.results import ResumeReport, RoundClosed, SubmissionResult
from hacfed.server.coordinator.validation import MAX_ID_CHARS, Rejection, is_short_id
from hacfed.tasks.base import Task

log = logging.getLogger("hacfed.server.coordinator")
CLOSE_REASONS = ("quorum", "deadline")


class Coordinator:
    def __init__(
        self, cfg: CoordinatorConfig, task: Task, journal: Journal, clock: Callable[[], float] = time.time,
        *, sent_journaled: bool = False,
    ) -> None:
        """sent_journaled: the transport sends every update over a network (the Flower driver), so where
        the engine journals what each lab is sent (max_staleness >= 1 or round_join "newest") a lab may
        submit only for a round the journal shows as sent to it (`SubmissionIntake`, UNSENT_ROUND); the
        in-process transport, whose labs are direct calls, does not ask."""
        journal.bind_run(cfg.run_id, cfg.plan_fingerprint())
        self.cfg, self.task, self.journal, self._clock = cfg, task, journal, clock
        self._lock = threading.RLock()
        self._plans: dict[int, RoundPlan] = {}
        self.kept = KeptSamples(journal)  # called under self._lock only
        self._tracker = self._restore_tracker()
        self.limiter = SubmissionLimiter(
            rate_per_s=cfg.rate_limit_per_s, burst=cfg.rate_limit_burst, quota_bytes=cfg.quota_bytes,
            quota_trajectories=cfg.quota_trajectories, clock=clock, round_retry_s=self._round_retry_s,
        )
        self._fail = FailClosed()
        # Journaled participants whose registration was revoked (set by the driver, which re-reads the
        # registry): a round no longer waits for them, and the early close needs that many fewer labs.
        self.withdrawn: frozenset[str] = frozenset()
        self.intake = SubmissionIntake(
            cfg, task, journal, self.limiter, lock=self._lock, clock=clock, fail=self._fail, plan_for=self.plan_for,
            current_round=lambda: self.current_round, on_committed=self.kept.remember,
        )
        # Which step each lab may start and what it is sent for it (`engine`): `engine.update_for(lab, step)`.
        self.engine = RoundEngine(cfg, journal, self.kept, lock=self._lock, capabilities=self.capabilities,
                                  plan_for=self.plan_for, clock=clock, audited=self._fail.audited,
                                  credit=self.intake.group_credit)
        self.intake.sent_journaled = sent_journaled and self.engine.journaled

    @property
    def failed_closed(self) -> str | None:
        """Why the audit log failed (`FailClosed`); then every submission is refused."""
        return self._fail.reason

    @failed_closed.setter
    def failed_closed(self, reason: str | None) -> None:
        self._fail.reason = reason

    # -- submissions (`SubmissionIntake`) ---------------------------------------------------------

    @property
    def max_trajectories(self) -> int:
        return self.intake.max_trajectories

    def admit(self, participant_id: str, n_bytes: int) -> Rejection | None:
        return self.intake.admit(participant_id, n_bytes)

    def submit(
        self, sub: Submission, sender: str | None = None, *, admitted: bool = False, encoded: bytes | None = None,
    ) -> SubmissionResult:
        return self.intake.submit(sub, sender, admitted=admitted, encoded=encoded)

    def begin_submit(
        self, sub: Submission, sender: str | None = None, *, admitted: bool = False, encoded: bytes | None = None,
    ) -> Callable[[], SubmissionResult]:
        return self.intake.begin_submit(sub, sender, admitted=admitted, encoded=encoded)

    def record_final_report(self, sub: Submission, sender: str | None = None) -> Rejection | None:
        return self.intake.record_final_report(sub, sender)

    # -- rounds ----------------------------------------------------------------------------------

    @property
    def current_round(self) -> int | None:
        """The open round's id, or None between rounds."""
        latest = self.journal.latest_round()
        return latest.round_id if latest and latest.state == "OPEN" else None

    def open_rounds(self) -> list[int]:
        """The open rounds, oldest first: at most one with max_staleness 0, up to K + 1 with K."""
        oldest, latest = self._oldest_open(), self.journal.latest_round()
        return [] if oldest is None else list(range(oldest.round_id, latest.round_id + 1))

    def _oldest_open(self) -> RoundRecord | None:
        """The oldest open round (rounds close in order, so every later one is open too), or None."""
        latest = self.journal.latest_round()
        if latest is None or latest.state != "OPEN":
            return None
        if self.cfg.max_staleness == 0:
            return latest
        closed = self.journal.latest_closed_round()
        first = 0 if closed is None else closed.round_id + 1
        return latest if first == latest.round_id else self.journal.round(first)

    @property
    def next_round_id(self) -> int:
        latest = self.journal.latest_round()
        return 0 if latest is None else latest.round_id + 1

    @property
    def finished(self) -> bool:
        return self.current_round is None and self.next_round_id >= self.cfg.rounds

    def round_record(self, round_id: int) -> RoundRecord | None:
        return self.journal.round(round_id)

    def resume(self) -> ResumeReport:
        """Pick up after a crash: an open round whose deadline has not passed continues with the
        same id and deadline; one whose deadline passed is closed with what was accepted. Nothing
        is re-opened; the capability tracker is the one journaled at the last close."""
        with self._lock:
            self._tracker = self._restore_tracker()
            closed = None
            oldest = self._oldest_open()
            while oldest is not None and self._clock() >= oldest.deadline:
                log.warning("resume: round %d passed its deadline while down; closing it", oldest.round_id)
                closed = self.close_round("deadline")
                oldest = self._oldest_open()
            return ResumeReport(self.current_round, closed, self.next_round_id)

    def open_round(self, round_id: int | None = None) -> RoundPlan:
        """Open the next round (idempotent for the round already open) and journal its plan and deadline."""
        with self._lock:
            current = self.current_round
            if round_id is None:
                round_id = current if current is not None else self.next_round_id
            if current is not None:
                oldest = self._oldest_open().round_id
                if oldest <= round_id <= current:
                    return self.plan_for(round_id)
                # With max_staleness K, round r may open while r - K .. r - 1 are still open.
                if round_id != self.next_round_id or oldest <= round_id - self.cfg.max_staleness - 1:
                    why = f" (max_staleness {self.cfg.max_staleness})" if self.cfg.max_staleness else ""
                    raise CoordinatorStateError(f"cannot open round {round_id}: round {oldest} is still open{why}")
            if round_id != self.next_round_id:
                raise CoordinatorStateError(f"cannot open round {round_id}: the next round is {self.next_round_id}")
            if round_id >= self.cfg.rounds:
                raise CoordinatorStateError(f"cannot open round {round_id}: the run has {self.cfg.rounds} rounds")
            plan = make_plan(self.cfg, self.task, round_id)
            now = self._clock()
            with self._fail.audited():
                self.journal.insert_round(round_id, now, now + self.cfg.round_deadline_s, plan_to_json(plan))
            self._plans[round_id] = plan
            self.limiter.refill()
            log.info(
                "round %d open: %d prompts x G=%d, deadline in %.0f s",
                round_id, len(plan.prompts), plan.group_size, self.cfg.round_deadline_s,
            )
            return plan

    def plan_for(self, round_id: int) -> RoundPlan:
        """The journaled plan of an opened round, else the deterministic plan it will get."""
        if round_id not in self._plans:
            record = self.journal.round(round_id)
            if record is None:
                return make_plan(self.cfg, self.task, round_id)
            self._plans[round_id] = plan_from_json(record.plan_json)
        return self._plans[round_id]

    def quorum(self, round_id: int) -> tuple[int, int, Callable[[], set[str]]]:
        """(the submissions round `round_id` needs for its quorum, the contributors below which it closes
        flagged below quorum, a function giving the participants it waits for). With round_join "newest",
        once no other lab can take the round (`RoundEngine.takers`, from the journal): its takers that are
        still awaited, all of them, and at most min_participants; otherwise every expected lab not withdrawn, at least
        min_participants."""
        takers = self.engine.takers(round_id) if self.cfg.round_join == "newest" else None
        if takers is None:
            needed = max(self.cfg.min_participants, self.cfg.expected_participants - len(self.withdrawn))
            return needed, self.cfg.min_participants, self.awaited
        awaited = self.awaited() & set(takers)
        return len(awaited), min(self.cfg.min_participants, len(takers)), lambda: awaited

    def ready_to_close(self, now: float | None = None) -> str | None:
        """"quorum" or "deadline" if the open round may close now (see module docstring), else None."""
        record = self._oldest_open()
        if record is None:
            return None
        now = self._clock() if now is None else now
        # Who submitted is enough for the quorum; how many samples each got accepted (a count over
        # the round's trajectories) only matters once the deadline passed. The ServerApp polls
        # this every 0.2 s while a round is open (bench/coordinator_scale.py).
        submitted = self.journal.submitter_ids(record.round_id)
        needed, least, awaited = self.quorum(record.round_id)
        if len(submitted) >= needed and awaited() <= submitted:
            return "quorum"
        if now >= record.deadline:
            submitters = self.journal.submitters(record.round_id)
            contributors = sum(1 for n in submitters.values() if n > 0)
            if contributors >= least or record.extensions >= self.cfg.max_deadline_extensions:
                return "deadline"
        return None

    def poll(self, now: float | None = None) -> str | None:
        """`ready_to_close`, extending a passed deadline once per allowed extension while below quorum."""
        with self._lock:
            now = self._clock() if now is None else now
            reason = self.ready_to_close(now)
            record = self._oldest_open()
            if reason is None and record is not None and now >= record.deadline:
                deadline = now + self.cfg.round_deadline_s
                detail = f"below quorum ({self.cfg.min_participants}) at deadline; extended to {deadline:.3f}"
                with self._fail.audited():
                    self.journal.extend_deadline(record.round_id, deadline, now, detail)
                log.warning("round %d: %s", record.round_id, detail)
            return reason

    def close_round(self, reason: str) -> RoundClosed:
        """Close the open round: update the capability tracker ONCE with all its accepted (verified)
        rewards and journal the result in the same transaction as the state change."""
        if reason not in CLOSE_REASONS:
            raise ValueError(f"close reason must be one of {CLOSE_REASONS}, got {reason!r}")
        with self._lock:
            oldest = self._oldest_open()  # with max_staleness K, rounds close oldest first
            if oldest is None:
                raise CoordinatorStateError("no round is open")
            round_id = oldest.round_id
            pairs = self.intake.scored_rewards(round_id, self.kept.accepted_rewards(round_id))  # dedup_successes
            submitters = self.journal.submitters(round_id)
            scored = pairs + self._unaccepted_as_zero(round_id, pairs, submitters)
            tracker = self._copy_tracker()
            if scored:
                tracker.update([r for _, r in scored], [p for p, _ in scored])
            capabilities = tracker.capabilities()
            contributors = tuple(sorted(p for p, n in submitters.items() if n > 0))
            below = len(contributors) < self.quorum(round_id)[1]
            with self._fail.audited():
                self.journal.close_round(round_id, reason, self._clock(), below, capabilities, tracker.state_dict())
            self._tracker = tracker  # only after the commit: a crash before it leaves the round OPEN
            self.limiter.forget_round(round_id)
            if below:
                log.warning(
                    "round %d closed by %s below quorum: %d of %d contributors",
                    round_id, reason, len(contributors), self.cfg.min_participants,
                )
            log.info("round %d closed (%s): %d accepted from %s", round_id, reason, len(pairs), list(contributors))
            return RoundClosed(round_id, reason, below, len(pairs), contributors, capabilities)

    def _unaccepted_as_zero(
        self, round_id: int, pairs: list[tuple[str, float]], submitters: dict[str, int]
    ) -> list[tuple[str, float]]:
        """A reward of 0 for every assigned sample a submitter did not get accepted (see the module
        docstring: leaving out or spoiling the groups it got wrong must not raise its P̂)."""
        plan = self.plan_for(round_id)
        assigned = len(plan.prompts) * plan.group_size
        accepted = Counter(p for p, _ in pairs)
        return [(pid, 0.0) for pid in sorted(submitters) for _ in range(max(assigned - accepted[pid], 0))]

    def take_pool_records(self, pool_round: int) -> tuple[bytes, ...] | None:
        """The records of the pool `engine.round_update(pool_round + 1)` published (`KeptSamples.take_records`)."""
        with self._lock:
            return self.kept.take_records(pool_round)

    # -- participants ----------------------------------------------------------------------------

    def register(self, participant_id: str) -> ParticipantRecord:
        """Join or rejoin (after a crash, or late): idempotent; a quarantined participant stays so."""
        if not is_short_id(participant_id):
            raise ValueError(
                f"participant id must be 1-{MAX_ID_CHARS} printable characters, got {safe_text(participant_id)}"
            )
        with self._lock, self._fail.audited():
            record = self.journal.upsert_participant(participant_id, self._clock())
            if participant_id not in self._tracker.agent_ids:
                self._tracker.add_agent(participant_id)
            return record

    def participants(self) -> list[ParticipantRecord]:
        return self.journal.participants()

    def awaited(self) -> set[str]:
        """The participants an open round waits for: journaled, not quarantined, not withdrawn."""
        return {p.participant_id for p in self.journal.participants() if not p.quarantined} - self.withdrawn

    def has_submitted(self, participant_id: str, round_id: int) -> bool:
        return self.journal.submission_seq(participant_id, round_id) is not None

    # -- metrics ---------------------------------------------------------------------------------

    def now(self) -> float:
        """The coordinator's clock (wall-clock epoch seconds, or a test's fake clock)."""
        return self._clock()

    def capabilities(self) -> dict[str, float]:
        return self._tracker.capabilities()

    def round_summary(self, round_id: int) -> RoundSummary:
        record = self.journal.round(round_id)
        if record is None:
            raise ValueError(f"round {round_id} was never opened")
        return build_round_summary(record, self.journal.participants(), self.journal.round_stats(round_id),
                                   self.journal.submitters(round_id))

    # -- internals -------------------------------------------------------------------------------

    def _round_retry_s(self) -> float:
        """A retry-after hint for a round quota: when the open round's deadline passes."""
        record = self.journal.latest_round()
        if record is None or record.state != "OPEN":
            return 1.0
        return max(record.deadline - self._clock(), 1.0)

    def _restore_tracker(self) -> CapabilityTracker:
        tracker = CapabilityTracker([], window=self.cfg.hacpo.capability_window)
        closed = self.journal.latest_closed_round()
        if closed is not None and closed.tracker_state is not None:
            tracker.load_state_dict(closed.tracker_state)
        for p in self.journal.participants():
            if p.participant_id not in tracker.agent_ids:
                tracker.add_agent(p.participant_id)
        return tracker

    def _copy_tracker(self) -> CapabilityTracker:
        tracker = CapabilityTracker([], window=self.cfg.hacpo.capability_window)
        tracker.load_state_dict(self._tracker.state_dict())
        return tracker

