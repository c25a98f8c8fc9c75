"""How the coordinator takes in submissions: caps, gates, judging, journaling, refusals.

Runs in the coordinator's ServerApp process (the Flower ServerApp that hacfed-server's SuperLink
starts, through `hacfed.server.driver`) and, in-process, in `hacfed sim`. `SubmissionIntake` is
built by `Coordinator` (`hacfed.server.coordinator.state`), which hands it the config, task,
journal, limiter, its lock and clock, its plans and open round, the fail-closed state
(`FailClosed`, shared by both) and where committed samples go for the next pool; the intake owns
the set of participants whose submission is being judged.

Order, cheapest first (security.md T8): the caps of `limits` (the Flower driver applies the rate
limit and the byte quota with `admit` before it verifies or decodes anything; the trajectory quota
comes right after decoding), then the whole-submission gates (identity, run, size, identical
resend, nonce reuse, registration, quarantine, round state, one submission per round), and only
then validation and reward re-verification (`validation`). Where the transport journals what it
sends each lab (`sent_journaled`: the Flower driver wherever the engine journals each lab's steps),
the round gates also refuse an open round the journal never sent to that lab (UNSENT_ROUND). Every
refusal is journaled and audited under the authenticated sender, never under the id a submission
claims (S10); a recorded submission returns only after its COMMIT (the ACK point, R2).
"""

from __future__ import annotations

import json
import logging
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Sequence

from hacfed.crashpoints import crash_point
from hacfed.messages import RoundPlan, Submission
from hacfed.response_format import response_format
from hacfed.server.coordinator.config import CoordinatorConfig
from hacfed.server.coordinator.errors import AuditError, ErrorCode, safe_text
from hacfed.server.coordinator.journal import Journal, SubmissionRecord
from hacfed.server.coordinator.limits import SubmissionLimiter
from hacfed.server.coordinator.results import Receipt, SubmissionResult
from hacfed.server.coordinator.success_credit import SuccessCredits
from hacfed.server.coordinator.validation import (
    AcceptedTrajectory,
    Rejection,
    ValidationLimits,
    ValidationOutcome,
    check_report,
    is_short_id,
    quick_size_rejection,
    report_to_dict,
    start_validation,
    submission_digest,
)
from hacfed.tasks.base import Task
from hacfed.trajectory import Trajectory
from hacfed.wire.pool_splice import submission_pool_records

log = logging.getLogger("hacfed.server.coordinator")
JUDGING_RETRY_S = 1.0  # the retry-after of a submission refused while another of its lab is judged


class FailClosed:
    """Why the audit log or the journal could not be written, once that happened (security.md S10;
    `JournalWriteError` is an `AuditError`): from then on the coordinator refuses every submission
    with AUDIT_UNAVAILABLE until restarted."""

    def __init__(self) -> None:
        self.reason: str | None = None

    @contextmanager
    def audited(self) -> Iterator[None]:
        """A write whose audit line fails puts the coordinator in the fail-closed state."""
        try:
            yield
        except AuditError as exc:
            if self.reason is None:
                self.reason = str(exc)
                log.error("WRITE FAILED, the coordinator stops accepting submissions: %s", exc)
            raise

    def rejection(self) -> Rejection:
        detail = f"the coordinator's audit log or journal failed ({self.reason}); it accepts nothing until restarted"
        return Rejection(None, ErrorCode.AUDIT_UNAVAILABLE, safe_text(detail, 500))


class SubmissionIntake:
    """Judges and journals submissions for `Coordinator` (see the module docstring)."""

    def __init__(
        self, cfg: CoordinatorConfig, task: Task, journal: Journal, limiter: SubmissionLimiter, *,
        lock: threading.RLock, clock: Callable[[], float], fail: FailClosed,
        plan_for: Callable[[int], RoundPlan], current_round: Callable[[], int | None],
        on_committed: Callable[[int, Sequence[AcceptedTrajectory], Mapping[int, bytes] | None], None],
    ) -> None:
        """lock: the coordinator's, held by every call. on_committed(round, accepted, records): a
        submission's accepted samples after its COMMIT, with their pool records by `id()` of the
        decoded sample when its bytes were given (`KeptSamples.remember`)."""
        self.cfg, self.task, self.journal, self.limiter = cfg, task, journal, limiter
        self._lock, self._clock, self._fail = lock, clock, fail
        self._plan_for, self._current_round, self._on_committed = plan_for, current_round, on_committed
        self._judging: set[str] = set()  # participants with a submission begun and not finished (`begin_submit`)
        # a lab may submit only for a round the journal shows as sent to it (`sent_steps`); set by the
        # Coordinator when its transport journals what it sends (`Coordinator(sent_journaled=True)`)
        self.sent_journaled = False
        # what each accepted sample is credited for P̂ and the successes choice, with `dedup_successes`
        # or `format_gate`
        keep = 2 + getattr(cfg, "max_staleness", 0)  # the rounds open at once, and the pool being published
        fits = response_format(task).fits if cfg.format_gate else None
        self.credits = SuccessCredits(journal, keep_rounds=keep, dedup=cfg.dedup_successes, fits=fits) \
            if cfg.dedup_successes or cfg.format_gate else None

    def scored_rewards(self, round_id: int, rewards: list[tuple[str, float]]) -> list[tuple[str, float]]:
        """What P̂ counts of the round's accepted samples: their verified `rewards` as given
        (`KeptSamples.accepted_rewards`), or with `dedup_successes` or `format_gate` each sample's
        credited reward (`success_credit`: a repeated or replayed success, or a success of a group
        outside the task's response format, counts 0)."""
        return rewards if self.credits is None else self.credits.rewards(round_id)

    def group_credit(self, pool_round: int | None) -> dict[tuple[str, str], float] | None:
        """(prompt id, lab) -> the credited reward of each group of the pool of `pool_round`, which
        the `successes` choice ranks by with `dedup_successes` or `format_gate` (`PoolShares`); None
        without them (the choice then ranks by the verified rewards in the pool) or without a pool."""
        return None if self.credits is None or pool_round is None else self.credits.group_credit(pool_round)

    @property
    def judging(self) -> frozenset[str]:
        """The participants with a submission begun and not finished."""
        return frozenset(self._judging)

    @property
    def max_trajectories(self) -> int:
        """The most trajectories one submission may carry: a full plan, prompts x G. A transport
        that decodes bytes passes it to the decoder, which refuses more before building any (T8)."""
        return self.cfg.prompts_per_round * self.cfg.group_size

    def admit(self, participant_id: str, n_bytes: int) -> Rejection | None:
        """The caps a transport applies to `n_bytes` of raw input from an authenticated participant
        BEFORE it verifies or decodes anything: one token of its rate limit and its byte quota for
        the open round. A refusal is journaled (and audited); pass `admitted=True` to `submit` after
        this returned None."""
        with self._lock:
            if self._fail.reason is not None:
                return self._fail.rejection()
            problem = self.limiter.take_token(participant_id) or \
                self.limiter.charge_bytes(participant_id, self._current_round(), n_bytes)
            if problem is not None:
                self._journal_refusal(participant_id, self._current_round(), problem)
            return problem

    def submit(
        self, sub: Submission, sender: str | None = None, *, admitted: bool = False, encoded: bytes | None = None,
    ) -> SubmissionResult:
        """Judge and journal one submission; returns only after the journal commit (the ACK point).

        sender: the authenticated identity the transport verified (mTLS / envelope key), if any;
        a refusal is journaled under it (else under the id the submission claims).
        admitted: the transport already applied `admit` to this submission's raw bytes.
        encoded: the wire bytes (`hacfed.wire.decode_submission`'s input) that `sub` was decoded
        from, when the transport has them: hashed for the digest as they are, and the accepted
        samples' pool records are cut from them (`pool_splice.submission_pool_records`) instead of
        being encoded again for the next round's update. Only ever the bytes `sub` came from.
        An identical resend returns the stored result and receipt; nothing is written twice.
        """
        return self.begin_submit(sub, sender, admitted=admitted, encoded=encoded)()

    def begin_submit(
        self, sub: Submission, sender: str | None = None, *, admitted: bool = False, encoded: bytes | None = None,
    ) -> Callable[[], SubmissionResult]:
        """`submit` in two halves. Now: the gates, the cheap checks, and the start of reward
        verification (the verifier's workers decide while the caller goes on). The function
        returned (call it once) waits for the verdicts, journals the submission and returns its
        result only after the COMMIT (the ACK point, R2), as `submit` does.

        Between the two the caller may begin another participant's submission: the driver begins
        the next lab's while the workers verify this one (`hacfed.server.replies`). A second
        submission of the same participant is refused (DUPLICATE) until the first is finished, so
        no gate ever reads the journal without a submission of the same participant it should see."""
        with self._lock:
            if self._fail.reason is not None:
                return _finished(SubmissionResult((), (self._fail.rejection(),), None))
            try:
                gate = self._gate(sub, sender, admitted, encoded)
                if isinstance(gate, SubmissionResult):
                    return _finished(gate)
                if isinstance(gate, Rejection):  # (a NamedTuple: test it before the plain tuple)
                    rid = sub.round_id if isinstance(sub, Submission) and isinstance(sub.round_id, int) else None
                    self._journal_refusal(_refused_sender(sub, sender), rid, gate)
                    return _finished(SubmissionResult((), (gate,), None))
            except AuditError:
                return _finished(SubmissionResult((), (self._fail.rejection(),), None))
            n_bytes, digest = gate
            received = self._clock()
            outcome = self._start_judging(sub)
            self._judging.add(sub.participant_id)

        def finish() -> SubmissionResult:
            with self._lock:
                try:
                    if self._fail.reason is None:  # (it may have failed while this one was verified)
                        with self._fail.audited():
                            result = self._record(sub, received, n_bytes, digest, outcome(), encoded)
                        crash_point("after_commit_before_ack")
                        return result
                except AuditError:
                    pass
                finally:
                    self._judging.discard(sub.participant_id)
                return SubmissionResult((), (self._fail.rejection(),), None)

        return finish

    def _journal_refusal(self, pid: str | None, round_id: int | None, problem: Rejection) -> None:
        with self._fail.audited():
            self.journal.record_rejection(pid, round_id, problem.code.value, problem.detail, self._clock())
        log.info("submission from %s for round %s refused: %s %s", pid, round_id, problem.code, problem.detail)

    def _gate(
        self, sub: object, sender: str | None, admitted: bool, encoded: bytes | None = None,
    ) -> Rejection | SubmissionResult | tuple[int, str]:
        """Whole-submission checks, cheapest first. Returns the refusal, the stored result of an
        identical resend, or (size in bytes, content hash) of a submission to judge."""
        if not isinstance(sub, Submission):
            return Rejection(None, ErrorCode.SCHEMA, f"a {type(sub).__name__} is not a Submission")
        pid = sub.participant_id
        if not is_short_id(pid):
            return Rejection(None, ErrorCode.SCHEMA, f"participant_id {safe_text(pid)} is not a short text")
        if sender is not None and sender != pid:
            return Rejection(None, ErrorCode.IDENTITY_MISMATCH, f"sent by {safe_text(sender)} but claims {pid}")
        if not admitted and (problem := self.limiter.take_token(pid)) is not None:
            return problem
        if not isinstance(sub.trajectories, tuple):
            return Rejection(None, ErrorCode.SCHEMA, "trajectories must be a tuple")
        round_key = self._current_round()
        if (problem := self.limiter.charge_trajectories(pid, round_key, len(sub.trajectories))) is not None:
            return problem
        if sub.run_id != self.cfg.run_id:
            return Rejection(None, ErrorCode.WRONG_RUN, f"run {safe_text(sub.run_id)} != {self.cfg.run_id}")
        too_big = quick_size_rejection(sub, self.max_trajectories, self.cfg.max_submission_bytes)
        if too_big is not None:
            return too_big
        try:
            n_bytes, digest = submission_digest(sub, encoded)
        except ValueError as exc:  # an in-process object of types the wire cannot carry
            return Rejection(None, ErrorCode.SCHEMA, str(exc))
        if n_bytes > self.cfg.max_submission_bytes:
            return Rejection(
                None, ErrorCode.SIZE, f"{n_bytes} bytes > max_submission_bytes {self.cfg.max_submission_bytes}"
            )
        if not admitted and (problem := self.limiter.charge_bytes(pid, round_key, n_bytes)) is not None:
            return problem
        stored = self.journal.stored_result(digest)
        if stored is not None:
            return SubmissionResult.from_json(stored, replayed=True)
        if sub.nonce and self.journal.hash_for_nonce(pid, sub.nonce) is not None:
            return Rejection(None, ErrorCode.NONCE_REUSE, f"nonce {sub.nonce} was used for a different payload")
        participant = self.journal.participant(pid)
        if participant is None:
            return Rejection(None, ErrorCode.UNKNOWN_PARTICIPANT, f"participant {pid} is not registered")
        if participant.quarantined:
            detail = f"participant {pid} quarantined since round {participant.quarantined_round}"
            return Rejection(None, ErrorCode.QUARANTINED, detail)
        record = self.journal.round(sub.round_id)
        if record is None:
            return Rejection(None, ErrorCode.UNKNOWN_ROUND, f"round {sub.round_id} was never opened")
        if record.state != "OPEN":
            latest_closed = self.journal.latest_closed_round()
            latest_is_this = latest_closed and latest_closed.round_id == sub.round_id
            code = ErrorCode.ROUND_CLOSED if latest_is_this else ErrorCode.STALE_ROUND
            return Rejection(None, code, f"round {sub.round_id} is {record.state.lower()}")
        if self.sent_journaled and not self.journal.was_sent(pid, sub.round_id):
            return Rejection(None, ErrorCode.UNSENT_ROUND, f"round {sub.round_id} was never sent to {pid}")
        if pid in self._judging:
            detail = f"another submission of {pid} is being judged; resend this one after it"
            return Rejection(None, ErrorCode.DUPLICATE, detail, retry_after_s=JUDGING_RETRY_S)
        seq = self.journal.submission_seq(pid, sub.round_id)
        if seq is not None:
            return Rejection(
                None, ErrorCode.DUPLICATE, f"{pid} already submitted for round {sub.round_id} (receipt seq {seq})"
            )
        return n_bytes, digest

    def _start_judging(self, sub: Submission) -> Callable[[], ValidationOutcome]:
        """The cheap checks of every trajectory now, the reward verification started
        (`start_validation`); the function returned gives the outcome."""
        pid, round_id = sub.participant_id, sub.round_id
        plan = self._plan_for(round_id)
        limits = ValidationLimits(
            group_size=plan.group_size,
            max_new_tokens=plan.sampling.max_new_tokens,
            max_response_chars=self.cfg.max_response_chars,
            min_mean_logp=self.cfg.min_mean_logp,
            min_policy_version=self.journal.last_policy_version(pid),
            verify_threads=self.cfg.verify_threads,
            verify_budget_s=self.cfg.verify_budget_s,
        )
        used = self.journal.used_trajectory_ids(
            pid, [t.trajectory_id for t in sub.trajectories if isinstance(t, Trajectory)]
        )
        return start_validation(sub, plan, self.task, limits, used)

    def _record(
        self, sub: Submission, now: float, n_bytes: int, digest: str, outcome: ValidationOutcome,
        encoded: bytes | None = None,
    ) -> SubmissionResult:
        pid, round_id = sub.participant_id, sub.round_id
        strikes = outcome.strikes
        window_start = round_id - self.cfg.strike_window_rounds + 1
        quarantine = bool(strikes) and (
            self.journal.count_strikes(pid, window_start) + len(strikes) >= self.cfg.max_strikes
        )
        rejections = outcome.rejections + ((outcome.report_rejection,) if outcome.report_rejection else ())
        report_json = None
        if sub.report is not None and outcome.report_rejection is None:
            report_json = json.dumps(report_to_dict(sub.report), sort_keys=True)
        accepted_ids = tuple(a.trajectory.trajectory_id for a in outcome.accepted)

        def result_for(seq: int) -> SubmissionResult:
            receipt = Receipt(
                self.cfg.run_id, round_id, pid, seq, digest, len(accepted_ids), len(rejections), sub.nonce
            )
            return SubmissionResult(accepted_ids, rejections, receipt)

        record = SubmissionRecord(
            pid, round_id, digest, sub.nonce, n_bytes, now, outcome.accepted, rejections, strikes, quarantine,
            report_json,
        )
        judged = self.credits.judge(outcome.accepted) if self.credits is not None else None
        seq = self.journal.record_submission(record, lambda seq: result_for(seq).to_json())
        self._on_committed(round_id, outcome.accepted, _records_by_sample(sub, encoded))  # after the COMMIT
        if judged is not None:
            self.credits.committed(round_id, outcome.accepted, judged)
        if strikes:
            log.warning("participant %s: %d strike(s) in round %d", pid, len(strikes), round_id)
        if quarantine:
            log.warning(
                "participant %s QUARANTINED: reached %d strikes within %d rounds",
                pid, self.cfg.max_strikes, self.cfg.strike_window_rounds,
            )
        log.info(
            "round %d: %s accepted %d, rejected %d (seq %d)", round_id, pid, len(accepted_ids), len(rejections), seq
        )
        return result_for(seq)

    def record_final_report(self, sub: Submission, sender: str | None = None) -> Rejection | None:
        """The answer to the last update (no plan): a Submission for round `cfg.rounds` with no
        trajectories, carrying the StepReport of training on the final pool. None when stored."""
        with self._lock:
            if not isinstance(sub, Submission) or sub.trajectories or sub.round_id != self.cfg.rounds:
                detail = f"a final report is a Submission for round {self.cfg.rounds} without trajectories"
                return Rejection(None, ErrorCode.SCHEMA, detail)
            if sender is not None and sender != sub.participant_id:
                detail = f"sent by {safe_text(sender)} but claims {safe_text(sub.participant_id)}"
                return Rejection(None, ErrorCode.IDENTITY_MISMATCH, detail)
            if sub.run_id != self.cfg.run_id:
                return Rejection(None, ErrorCode.WRONG_RUN, f"run {safe_text(sub.run_id)} != {self.cfg.run_id}")
            if self.journal.participant(sub.participant_id) is None:
                detail = f"participant {safe_text(sub.participant_id)} is not registered"
                return Rejection(None, ErrorCode.UNKNOWN_PARTICIPANT, detail)
            problem = check_report(sub.report, sub.participant_id, sub.round_id)
            if problem is not None or sub.report is None:
                return problem or Rejection(None, ErrorCode.SCHEMA, "final submission carries no report")
            if self._fail.reason is not None:
                return self._fail.rejection()
            try:
                with self._fail.audited():
                    self.journal.record_report(
                        sub.participant_id, sub.round_id, json.dumps(report_to_dict(sub.report), sort_keys=True)
                    )
            except AuditError:
                return self._fail.rejection()
            return None


def _records_by_sample(sub: Submission, encoded: bytes | None) -> dict[int, bytes] | None:
    """The pool record of each decoded sample of `sub`, by `id()` (the samples are alive while the
    caller uses the map), cut from the bytes it was decoded from; None without them, or when they
    do not hold exactly one record per sample."""
    if encoded is None:
        return None
    records = submission_pool_records(encoded)
    if records is None or len(records) != len(sub.trajectories):
        return None
    return {id(t): record for t, record in zip(sub.trajectories, records)}


def _refused_sender(sub: object, sender: str | None) -> str | None:
    """Whose record a gate refusal goes on: the authenticated sender, so that a lab claiming another
    lab's id refuses itself, not that lab (S10); without one (an in-process caller that authenticated
    nothing), the id the submission claims."""
    if sender is not None:
        return safe_text(sender)
    return safe_text(sub.participant_id) if isinstance(sub, Submission) else None


def _finished(result: SubmissionResult) -> Callable[[], SubmissionResult]:
    """The second half of a `begin_submit` decided by the gates alone."""
    return lambda: result
