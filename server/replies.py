"""How the round driver takes a lab's reply apart and answers every submission in it.

Runs in the coordinator's ServerApp process, owned by `hacfed.server.driver.FederationDriver`,
which hands it the coordinator, the journal, the key registry, the answer queue, the deliveries,
the run's end and the console. `LabReplies` owns the submissions begun and not yet finished.

A reply to a delivery is a signed `LabReply` (hacfed.exchange). Its resends come first (the
oldest unanswered submissions of the lab's outbox), then the submission answering the delivery's
request. Each signed submission in it goes through, in this order:
  1. the caps (`Coordinator.admit`: one token of the lab's rate limit, its byte quota), on the raw
     bytes, before any signature is verified or anything is parsed (T8);
  2. the envelope: a registered key, a valid signature, and the signer must be the participant
     whose node sent the reply (T5);
  3. decoding, which refuses more trajectories than a full plan (`Coordinator.max_trajectories`),
     too many prompt messages or report metrics before building any (`hacfed.wire`, S4);
  4. the coordinator (`Coordinator.begin_submit`, or `record_final_report` after the last round).
and gets exactly one answer (`hacfed.server.answers`): a signed receipt or a signed refusal.
A submission is judged in two halves: begun here (gates, cheap checks, reward requests sent to the
verifier's workers) and finished by `finish_judging` (verdicts, journal, answer), which the driver
calls after it has begun the next reply of the same pull (`FederationDriver.on_replies`), so the
workers verify one lab's samples while the next lab's are decoded and checked. A lab's second
submission (a reply's resends come first) is begun only after its first is finished.
Also here: trust on first use (key requests and offers).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.envelope import DOMAIN_SUBMIT, DOMAIN_UPDATE, open_envelope, seal
from hacfed.exchange import open_lab_reply
from hacfed.identity import printable
from hacfed.keys import KEY_REQUEST_TYPE
from hacfed.messages import Submission
from hacfed.server.answers import AnswerQueue
from hacfed.server.coordinator import Coordinator, Journal
from hacfed.server.coordinator.errors import ErrorCode, safe_text
from hacfed.server.coordinator.results import SubmissionResult
from hacfed.server.coordinator.validation import check_report
from hacfed.server.deliveries import ACK, ANSWERS, FINAL, Deliveries, Sent, submission_label
from hacfed.server.membership import Membership
from hacfed.server.reporting import StepTimes, rejection_line, sane_metrics
from hacfed.server.run_end import RunEnd
from hacfed.wire import PayloadType, WireError, decode_submission


class LabReplies:
    """Judges and answers the submissions of labs' replies (see the module docstring)."""

    def __init__(
        self, *, coordinator: Coordinator, journal: Journal, membership: Membership, answers: AnswerQueue,
        deliveries: Deliveries, run_end: RunEnd, key: Ed25519PrivateKey, rounds: int,
        console: Callable[[str], None], monotonic: Callable[[], float],
        on_step_times: Callable[[str, int, StepTimes], None],
    ) -> None:
        self._coordinator = coordinator
        self._journal = journal
        self._membership = membership
        self._answers = answers
        self._deliveries = deliveries
        self._run_end = run_end
        self._key = key
        self._rounds = rounds
        self._console = console
        self._monotonic = monotonic
        self._on_step_times = on_step_times  # (lab, round, a primary submission's reported step times): its rows
        self._begun: deque[tuple[str, Callable[[], None]]] = deque()  # (participant, finish and answer)
        self._told_dropped: set[str] = set()  # labs whose out-of-range report metrics were named once

    @property
    def unfinished(self) -> int:
        """How many submissions are begun and not finished (`finish_judging`)."""
        return len(self._begun)

    def take(self, sent: Sent, payload: bytes, round_trip_s: float) -> None:
        """A LabReply to the delivery `sent`, from a lab still registered: its resends (oldest first),
        then the submission answering the request."""
        pid = sent.participant_id
        try:
            reply, kid = open_lab_reply(payload, self._membership.keys())
            signer = self._membership.owner(kid)
        except WireError as exc:  # unknown key, bad signature, malformed payload
            self.refuse(sent, str(exc.code), f"reply refused: {exc.message}")
            return
        if signer != pid:  # the key of one participant used by the node of another (T5)
            self.refuse(sent, ErrorCode.IDENTITY_MISMATCH.value,
                        f"envelope signed with the key of {signer}, sent by the node of {pid}")
            return
        for item in reply.resends:
            self._judge(sent, item, primary=False, round_trip_s=round_trip_s)
        if reply.submission:
            self._judge(sent, reply.submission, primary=True, round_trip_s=round_trip_s)
        elif sent.round_id not in (ANSWERS, ACK):
            self.refuse(sent, ErrorCode.SCHEMA.value, "the reply to an update carries no submission")

    def _judge(self, sent: Sent, item: bytes, *, primary: bool, round_trip_s: float) -> None:
        """One signed submission of a reply: caps, signature, then the coordinator; always answered."""
        pid = sent.participant_id
        if any(begun_pid == pid for begun_pid, _ in self._begun):
            # one submission of a lab at a time (the coordinator refuses a second while it judges the
            # first), and a lab's answers in the order of its submissions
            self.finish_judging()
        problem = self._coordinator.admit(pid, len(item))  # caps first: before verifying or decoding (T8)
        if problem is not None:
            self.refuse(sent, problem.code.value, problem.detail, primary=primary, journaled=True,
                        retry_after_s=problem.retry_after_s)
            return
        opened = self._open_submission(sent, item, primary)
        if opened is None:
            return
        submission, body = opened
        if (sent.round_id == FINAL or self._coordinator.finished) and submission.round_id == self._rounds \
                and not submission.trajectories:
            self._final_report(sent, submission, primary)
            return
        finish = self._coordinator.begin_submit(submission, sender=pid, admitted=True, encoded=body)
        self._begun.append((pid, lambda: self._answer(sent, submission, finish(), primary, round_trip_s)))

    def finish_judging(self, keep: int = 0) -> None:
        """Finish the submissions begun (`Coordinator.begin_submit`), oldest first, all but the
        last `keep`: each waits for its verdicts, is journaled and answered (`_answer`)."""
        while len(self._begun) > keep:
            _, finish = self._begun.popleft()
            finish()

    def _answer(self, sent: Sent, submission: Submission, result: SubmissionResult, primary: bool,
                round_trip_s: float) -> None:
        """The answer to a judged submission: its receipt (built from what the journal stored, after
        its COMMIT: R2) or its refusal, and its console lines."""
        pid = sent.participant_id
        if result.refusal is not None:
            refusal = result.rejected[0]
            self.refuse(sent, refusal.code.value, refusal.detail, primary=primary, journaled=True,
                        round_id=submission.round_id, nonce=submission.nonce, retry_after_s=refusal.retry_after_s)
            return
        self._answers.receipt(pid, result)  # built from what the journal stored, after its COMMIT (R2)
        label = submission_label(sent, submission.round_id, primary)
        if primary and submission.round_id == sent.round_id:  # an older round's report: not this round's times
            self._on_step_times(pid, submission.round_id,
                                StepTimes.from_report(self._sane_report(pid, submission), round_trip_s))
        self._console(f"{label} {pid}: submitted {len(submission.trajectories)} trajectories, accepted "
                      f"{len(result.accepted_ids)} (receipt seq {result.receipt.seq}"
                      f"{', identical resend' if result.replayed else ''})")
        if result.rejected and not result.replayed:
            self._console(rejection_line(submission.round_id, pid, result.rejected, len(submission.trajectories)))

    def _sane_report(self, pid: str, submission: Submission) -> dict[str, float]:
        """The report's metrics in their ranges (`reporting.metric_problem`); nothing from a report the
        coordinator refused. What is dropped is named once per lab."""
        if submission.report is None or check_report(submission.report, pid, submission.round_id) is not None:
            return {}
        kept, dropped = sane_metrics(submission.report.metrics)
        if dropped and pid not in self._told_dropped:
            self._told_dropped.add(pid)
            self._console(f"{pid}: report values dropped (named once per lab): {safe_text('; '.join(dropped), 300)}")
        return kept

    def _open_submission(self, sent: Sent, item: bytes, primary: bool) -> tuple[Submission, bytes] | None:
        """The envelope (a registered key, a valid signature, signed by the participant whose node
        sent it), then decoding: the submission and the signed bytes it was decoded from; None
        when refused (answered here)."""
        pid = sent.participant_id
        try:
            body, kid = open_envelope(item, self._membership.keys(), DOMAIN_SUBMIT, PayloadType.SUBMISSION)
            signer = self._membership.owner(kid)
        except WireError as exc:
            self.refuse(sent, str(exc.code), exc.message, primary=primary)
            return None
        if signer != pid:  # checked before decoding: nothing signed by another lab is parsed for this node
            self.refuse(sent, ErrorCode.IDENTITY_MISMATCH.value,
                        f"envelope signed with the key of {signer}, sent by the node of {pid}", primary=primary)
            return None
        try:  # more trajectories than a full plan are refused before any is built (T8, security.md S4)
            return decode_submission(body, max_trajectories=self._coordinator.max_trajectories), body
        except WireError as exc:
            self.refuse(sent, str(exc.code), exc.message, primary=primary)
            return None

    def _final_report(self, sent: Sent, submission: Submission, primary: bool) -> None:
        problem = self._run_end.take_report(sent.participant_id, submission)
        if problem is not None:
            self.refuse(sent, problem.code.value, problem.detail, primary=primary, journaled=False,
                        round_id=submission.round_id, nonce=submission.nonce)

    def refuse(
        self, sent: Sent, code: str, detail: str, *, primary: bool = True, journaled: bool = False,
        round_id: int | None = None, nonce: str = "", retry_after_s: float | None = None,
    ) -> None:
        """A submission (or a whole reply) refused: journaled, answered with a signed refusal, named
        on the console. A refused primary submission is not asked for again this round (a retry
        would bring the same bytes), unless the refusal carries a retry-after."""
        pid = sent.participant_id
        if round_id is None and sent.round_id is not None and sent.round_id >= 0:
            round_id = sent.round_id
        if not journaled:
            self._journal.record_rejection(pid, round_id, code, safe_text(detail, 500), self._coordinator.now())
        self._answers.refusal(pid, code, detail, round_id=round_id or 0, nonce=nonce, retry_after_s=retry_after_s)
        if primary:
            self._deliveries.hold(pid, float("inf") if retry_after_s is None else retry_after_s)
        self._console(f"{submission_label(sent, round_id, primary)} {pid}: REFUSED {code}: {safe_text(detail, 300)}")

    # -- trust on first use ------------------------------------------------------------------------

    def key_requests(self, nodes: Mapping[int, str], unknown: set[str]) -> dict[int, bytes]:
        """A key request to the node of each lab of `unknown` (valid ids not registered yet) that is
        not busy nor held, with trust on first use."""
        if not self._membership.trust_on_first_use or not unknown:
            return {}
        now, busy = self._monotonic(), self._deliveries.busy()
        targets = {node: pid for node, pid in nodes.items()
                   if pid in unknown and pid not in busy and self._deliveries.may_ask(pid, now)}
        if not targets:
            return {}
        return self._deliveries.send_bare(targets, None, seal(b"", KEY_REQUEST_TYPE, self._key, DOMAIN_UPDATE))

    def accept_key_offer(self, participant_id: str, payload: bytes) -> None:
        try:
            self._membership.accept_offer(participant_id, payload)
        except (WireError, ValueError) as exc:
            self._deliveries.hold(participant_id, float("inf"))
            self._console(f"REFUSED key offer of {printable(participant_id)}: {safe_text(str(exc), 300)}")
