"""The coordinator's round state machine, transport-independent and torch-free.

Runs in the coordinator's ServerApp process (the Flower ServerApp that hacfed-server's SuperLink
starts, through `hacfed.server.driver`) and, in-process, in `hacfed sim`.

    journal = Journal(cfg.journal_path)
    coord = Coordinator(cfg, task, journal); coord.resume()
    coord.register("lab-a"); plan = coord.open_round(0); update = coord.make_update(0)
    result = coord.submit(submission)                 # returns after the journal commit (the ACK point)
    if coord.poll(): coord.close_round(coord.poll())  # quorum or deadline

Rounds go OPEN -> CLOSED(quorum|deadline) -> PUBLISHED (its pool was handed out). All state lives in
the journal; this object only caches immutable things (plans, pools) and the capability tracker,
which is restored from the journal on construction. A transport (in-process `transport.run_rounds`
or Flower) drives it; every method is safe to call from several threads.

Closing rules: a round may close early once every active (registered, not quarantined) participant
has answered and at least `expected_participants` have. Once the deadline passes it closes if at
least `min_participants` contributed accepted groups; otherwise the deadline is extended by
`round_deadline_s` up to `max_deadline_extensions` times (journaled), after which it closes with what
it has, flagged below quorum and logged as a warning. Submissions are accepted until the round is
closed, even after its deadline.

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
import math
import threading
import time
from collections import Counter
from contextlib import contextmanager
from operator import itemgetter
from typing import Callable, Iterator, Mapping, Sequence

from hacfed.capability import CapabilityTracker
from hacfed.messages import RoundPlan, RoundUpdate
from hacfed.server.coordinator.config import CoordinatorConfig
from hacfed.server.coordinator.errors import AuditError, CoordinatorStateError, safe_text
from hacfed.server.coordinator.intake import SubmissionIntake
from hacfed.server.coordinator.journal import Journal, ParticipantRecord, RoundRecord
from hacfed.server.coordinator.limits import SubmissionLimiter
from hacfed.server.coordinator.metrics import RoundSummary, build_round_summary
from hacfed.server.coordinator.plan import make_plan, plan_from_json, plan_to_json
from hacfed.server.coordinator.results import ResumeReport, RoundClosed
from hacfed.server.coordinator.validation import MAX_ID_CHARS, AcceptedTrajectory, is_short_id
from hacfed.tasks.base import Task
from hacfed.trajectory import ChatMessage, Trajectory

log = logging.getLogger("hacfed.server.coordinator")
CLOSE_REASONS = ("quorum", "deadline")
_POOL_KEY = itemgetter(0, 1, 2)  # the journal's pool order: participant, prompt position, sample index


class Coordinator(SubmissionIntake):
    def __init__(self, cfg: CoordinatorConfig, task: Task, journal: Journal, clock: Callable[[], float] = time.time) -> None:
        journal.bind_run(cfg.run_id, cfg.plan_fingerprint())
        self.cfg, self.task, self.journal, self._clock = cfg, task, journal, clock
        self._lock = threading.RLock()
        self._plans: dict[int, RoundPlan] = {}
        self._pools: dict[int, tuple[Trajectory, ...]] = {}
        self._pool_records: dict[int, tuple[bytes, ...]] = {}  # the pool's records, when all kept (`take_pool_records`)
        # round -> (participant, prompt position, sample index, trajectory, its pool record or None)
        # of every sample this process saw committed as accepted in that round (`_remember_accepted`,
        # `_pool_of`).
        self._accepted: dict[int, list[tuple[str, int, int, Trajectory, bytes | None]]] = {}
        self._tracker = self._restore_tracker()
        self.limiter = SubmissionLimiter(
            rate_per_s=cfg.rate_limit_per_s, burst=cfg.rate_limit_burst, quota_bytes=cfg.quota_bytes,
            quota_trajectories=cfg.quota_trajectories, clock=clock, round_retry_s=self._round_retry_s,
        )
        self.failed_closed: str | None = None  # why the audit log failed; then every submission is refused
        self._judging: set[str] = set()  # participants with a submission begun and not finished (`begin_submit`)

    @contextmanager
    def _audited(self) -> Iterator[None]:
        """A write whose audit line fails puts the coordinator in the fail-closed state (S10)."""
        try:
            yield
        except AuditError as exc:
            if self.failed_closed is None:
                self.failed_closed = str(exc)
                log.error("AUDIT LOG FAILED, the coordinator stops accepting submissions: %s", exc)
            raise

    # -- rounds ----------------------------------------------------------------------------------

    @property
    def current_round(self) -> int | None:
        """The open round's id, or None between rounds."""
        latest = self.journal.latest_round()
        return latest.round_id if latest and latest.state == "OPEN" else None

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
            latest = self.journal.latest_round()
            if latest is not None and latest.state == "OPEN" and self._clock() >= latest.deadline:
                log.warning("resume: round %d passed its deadline while down; closing it", latest.round_id)
                closed = self.close_round("deadline")
            return ResumeReport(self.current_round, closed, self.next_round_id)

    def open_round(self, round_id: int | None = None) -> RoundPlan:
        """Open the next round (idempotent for the round already open) and journal its plan and deadline."""
        with self._lock:
            current = self.current_round
            if round_id is None:
                round_id = current if current is not None else self.next_round_id
            if current is not None:
                if current != round_id:
                    raise CoordinatorStateError(f"cannot open round {round_id}: round {current} is still open")
                return self.plan_for(round_id)
            if round_id != self.next_round_id:
                raise CoordinatorStateError(f"cannot open round {round_id}: the next round is {self.next_round_id}")
            if round_id >= self.cfg.rounds:
                raise CoordinatorStateError(f"cannot open round {round_id}: the run has {self.cfg.rounds} rounds")
            plan = make_plan(self.cfg, self.task, round_id)
            now = self._clock()
            with self._audited():
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

    def ready_to_close(self, now: float | None = None) -> str | None:
        """"quorum" or "deadline" if the open round may close now (see module docstring), else None."""
        record = self.journal.latest_round()
        if record is None or record.state != "OPEN":
            return None
        now = self._clock() if now is None else now
        # Who submitted is enough for the quorum; how many samples each got accepted (a count over
        # the round's trajectories) only matters once the deadline passed. The ServerApp polls
        # this every 0.2 s while a round is open (bench/coordinator_scale.py).
        submitted = self.journal.submitter_ids(record.round_id)
        active = {p.participant_id for p in self.journal.participants() if not p.quarantined}
        if len(submitted) >= self.cfg.expected_participants and active <= submitted:
            return "quorum"
        if now >= record.deadline:
            submitters = self.journal.submitters(record.round_id)
            contributors = sum(1 for n in submitters.values() if n > 0)
            if contributors >= self.cfg.min_participants or record.extensions >= self.cfg.max_deadline_extensions:
                return "deadline"
        return None

    def poll(self, now: float | None = None) -> str | None:
        """`ready_to_close`, extending a passed deadline once per allowed extension while below quorum."""
        with self._lock:
            now = self._clock() if now is None else now
            reason = self.ready_to_close(now)
            record = self.journal.latest_round()
            if reason is None and record is not None and record.state == "OPEN" and now >= record.deadline:
                deadline = now + self.cfg.round_deadline_s
                detail = f"below quorum ({self.cfg.min_participants}) at deadline; extended to {deadline:.3f}"
                with self._audited():
                    self.journal.extend_deadline(record.round_id, deadline, now, detail)
                log.warning("round %d: %s", record.round_id, detail)
            return reason

    def close_round(self, reason: str) -> RoundClosed:
        """Close the open round: update the capability tracker ONCE with all its accepted (verified)
        rewards and journal the result in the same transaction as the state change."""
        if reason not in CLOSE_REASONS:
            raise ValueError(f"close reason must be one of {CLOSE_REASONS}, got {reason!r}")
        with self._lock:
            round_id = self.current_round
            if round_id is None:
                raise CoordinatorStateError("no round is open")
            pairs = self._accepted_rewards(round_id)
            submitters = self.journal.submitters(round_id)
            scored = pairs + self._unaccepted_as_zero(round_id, pairs, submitters)
            tracker = self._copy_tracker()
            if scored:
                tracker.update([r for _, r in scored], [p for p, _ in scored])
            capabilities = tracker.capabilities()
            contributors = tuple(sorted(p for p, n in submitters.items() if n > 0))
            below = len(contributors) < self.cfg.min_participants
            with self._audited():
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

    def make_update(self, next_round: int) -> RoundUpdate:
        """Pool and capabilities of round next_round-1 (closed) plus the plan of next_round (opened
        first), or no plan after the last round. Marks the pool's round PUBLISHED."""
        if isinstance(next_round, bool) or not isinstance(next_round, int) or not 0 <= next_round <= self.cfg.rounds:
            raise ValueError(f"next_round must be an int in [0, {self.cfg.rounds}], got {next_round!r}")
        with self._lock:
            active = tuple(p.participant_id for p in self.journal.participants() if not p.quarantined)
            capabilities = {pid: 1.0 for pid in active} | self._tracker.capabilities()
            pool_round, pool = None, ()
            if next_round > 0:
                pool_round = next_round - 1
                record = self.journal.round(pool_round)
                if record is None or record.state == "OPEN":
                    raise CoordinatorStateError(f"round {pool_round} must be closed before its pool is published")
                if pool_round not in self._pools:  # only the latest: memory does not grow with the rounds
                    pool, records = self._pool_of(pool_round)
                    self._pools = {pool_round: pool}
                    self._pool_records = {pool_round: records} if records is not None else {}
                pool = self._pools[pool_round]
                capabilities = {pid: 1.0 for pid in active} | dict(record.capabilities or {})
            next_plan = None
            if next_round < self.cfg.rounds:
                if self.journal.round(next_round) is None:
                    raise CoordinatorStateError(f"open round {next_round} before sending its plan")
                next_plan = self.plan_for(next_round)
            if pool_round is not None:
                self.journal.mark_published(pool_round)
            return RoundUpdate(self.cfg.run_id, pool_round, pool, capabilities, next_plan, active, self.cfg.hacpo)

    def _remember_accepted(
        self, round_id: int, accepted: Sequence[AcceptedTrajectory], records: Mapping[int, bytes] | None = None,
    ) -> None:
        """Keep a committed submission's accepted samples for `_pool_of` (called after the COMMIT:
        nothing is kept that the journal does not hold). Rounds before round_id - 1 are dropped.
        `records`: the pool record of each sample as submitted, by `id()` of the decoded sample; a
        sample is kept with its record only when it is that very object (judging left it as
        submitted: the verified reward equals the claim, no local ids), so the record is its own."""
        for old in [r for r in self._accepted if r < round_id - 1]:
            del self._accepted[old]
        kept = self._accepted.setdefault(round_id, [])
        records = records or {}
        kept.extend((a.trajectory.source_id, a.prompt_pos, a.idx, a.trajectory, records.get(id(a.trajectory)))
                    for a in accepted)

    def _kept(self, round_id: int) -> list[tuple[str, int, int, Trajectory, bytes | None]] | None:
        """The samples kept at intake for the round, in pool order, when they are exactly what the
        journal holds: every accepted sample of the round was committed by this process (no restart
        in between) and none was purged since (the journal's count of the round's samples, and of
        purged ones, must agree); else None."""
        kept = self._accepted.get(round_id)
        if kept is None or self.journal.round_sample_counts(round_id) != (len(kept), 0):
            return None
        kept.sort(key=_POOL_KEY)
        return kept

    def _accepted_rewards(self, round_id: int) -> list[tuple[str, float]]:
        """`journal.accepted_rewards(round_id)`, from the samples kept at intake when they are the
        journal's (`_kept`): the verified rewards, as the journal stored them (`float`), in pool order."""
        kept = self._kept(round_id)
        if kept is None:
            return self.journal.accepted_rewards(round_id)
        return [(pid, float(t.reward)) for pid, _, _, t, _ in kept]

    def take_pool_records(self, pool_round: int) -> tuple[bytes, ...] | None:
        """The `RoundUpdate.pool` record of each sample of the pool that `make_update(pool_round + 1)`
        published, aligned with it, cut from the bytes its labs submitted
        (`hacfed.wire.pool_splice.submission_pool_records`), for the round driver's updates
        (`hacfed.server.round_updates`), which keep them as blocks: handed over once and then
        dropped here (~48 MB at 64 labs), so a second ask gets None. None when the pool was read
        back from the journal or some sample came without its bytes (in-process submissions): it
        is then encoded."""
        with self._lock:
            return self._pool_records.pop(pool_round, None)

    def _pool_of(self, round_id: int) -> tuple[tuple[Trajectory, ...], tuple[bytes, ...] | None]:
        """`journal.pool(round_id)`, from the samples kept at intake when they are the journal's
        (`_kept`) and every field has the type and value the journal would give back
        (`_as_journaled`); otherwise the journal is read: the same trajectories in the same order
        (tests/unit/test_pool_from_intake.py), without reading back and rebuilding the round's
        samples (bench/coordinator_scale.py). The kept samples are released. With the pool, the
        records of its samples when every one was kept with one (`take_pool_records`), else None."""
        kept = self._kept(round_id)
        self._accepted.pop(round_id, None)
        if kept is not None and _as_journaled([t for _, _, _, t, _ in kept]):
            records = tuple(r for _, _, _, _, r in kept)
            return tuple(t for _, _, _, t, _ in kept), (records if None not in records else None)
        return self.journal.pool(round_id), None

    # -- participants ----------------------------------------------------------------------------

    def register(self, participant_id: str) -> ParticipantRecord:
        """Join or rejoin (after a crash, or late): idempotent; a quarantined participant stays so."""
        if not is_short_id(participant_id):
            raise ValueError(f"participant id must be 1-{MAX_ID_CHARS} printable characters, got {safe_text(participant_id)}")
        with self._lock, self._audited():
            record = self.journal.upsert_participant(participant_id, self._clock())
            if participant_id not in self._tracker.agent_ids:
                self._tracker.add_agent(participant_id)
            return record

    def participants(self) -> list[ParticipantRecord]:
        return self.journal.participants()

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
        return build_round_summary(
            record, self.journal.participants(), self.journal.round_stats(round_id), self.journal.submitters(round_id)
        )

    # -- internals -------------------------------------------------------------------------------

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


def _as_journaled(pool: Sequence[Trajectory]) -> bool:
    """Whether every trajectory of `pool` is field for field what `Journal.pool` would build from its
    row: exact built-in types (SQLite gives back a float for REAL, an int for INTEGER, a str for
    TEXT, a prompt of ChatMessage of two strs) and no negative zero (which a REAL column does not
    keep, and which protobuf encodes differently). Each distinct prompt object is checked once."""
    prompts: set[int] = set()  # ids of prompts checked (every object is alive during the call)
    for t in pool:
        reward, lp = t.reward, t.source_logp_sum
        if not (
            type(reward) is float and type(lp) is float and type(t.source_token_count) is int
            and type(t.policy_version) is int and type(t.response_text) is str and type(t.trajectory_id) is str
            and type(t.prompt_id) is str and type(t.source_id) is str and type(t.finish_reason) is str
            and (reward != 0.0 or math.copysign(1.0, reward) > 0) and (lp != 0.0 or math.copysign(1.0, lp) > 0)
        ):
            return False
        prompt = t.prompt
        if id(prompt) not in prompts:
            if type(prompt) is not tuple or not all(
                    type(m) is ChatMessage and type(m.role) is str and type(m.content) is str for m in prompt):
                return False
            prompts.add(id(prompt))
    return True
