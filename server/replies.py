"""How the round driver takes a lab's reply apart and answers every submission in it.

Runs in the coordinator's ServerApp process: a part of `hacfed.server.driver.FederationDriver`
(mixed in), which owns the coordinator, the key registry, the answer queue and the console.

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
verifier's workers) and finished by `_finish_judging` (verdicts, journal, answer), which the driver
calls after it has begun the next reply of the same pull (`FederationDriver.on_replies`), so the
workers verify one lab's samples while the next lab's are decoded and checked. A lab's second
submission (a reply's resends come first) is begun only after its first is finished.
Also here: trust on first use (key requests and offers) and the notice to a node whose id is not
registered (carried by its next hello).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from hacfed.envelope import DOMAIN_SUBMIT, DOMAIN_UPDATE, open_envelope, seal
from hacfed.exchange import open_lab_reply
from hacfed.identity import printable
from hacfed.keys import KEY_REQUEST_TYPE
from hacfed.messages import Submission
from hacfed.server.answers import AnswerQueue
from hacfed.server.coordinator.errors import ErrorCode, safe_text
from hacfed.server.coordinator.results import SubmissionResult
from hacfed.server.reporting import StepTimes, rejection_line
from hacfed.wire import PayloadType, WireError, decode_submission

FINAL = -1  # the round number of the final (plan-less) exchange in `_Sent`
ACK = -2  # ... and of the final acknowledgement
ANSWERS = -3  # ... and of a delivery that carries answers only
NOTICE_INTERVAL_S = 30.0  # at most how often a node whose id is not registered is told so


@dataclass(frozen=True)
class _Sent:
    participant_id: str
    round_id: int | None  # a coordinator round, FINAL, ACK, ANSWERS, or None for a key request
    at: float  # monotonic
    answers: tuple[bytes, ...] = ()  # the signed answers the delivery carried


class LabReplies:
    """The reply-handling half of `FederationDriver` (see the module docstring)."""

    _begun: deque[tuple[str, Callable[[], None]]]  # begun submissions: (participant, finish and answer)

    def _take_reply(self, sent: _Sent, payload: bytes, round_trip_s: float) -> None:
        """A LabReply: its resends (oldest first), then the submission answering the request."""
        pid = sent.participant_id
        try:
            reply, kid = open_lab_reply(payload, self.membership.keys())
            signer = self.membership.owner(kid)
        except WireError as exc:  # unknown key, bad signature, malformed payload
            self._refuse(sent, str(exc.code), f"reply refused: {exc.message}")
            return
        if signer != pid:  # the key of one participant used by the node of another (T5)
            self._refuse(sent, ErrorCode.IDENTITY_MISMATCH.value,
                         f"envelope signed with the key of {signer}, sent by the node of {pid}")
            return
        for item in reply.resends:
            self._judge(sent, item, primary=False, round_trip_s=round_trip_s)
        if reply.submission:
            self._judge(sent, reply.submission, primary=True, round_trip_s=round_trip_s)
        elif sent.round_id not in (ANSWERS, ACK):
            self._refuse(sent, ErrorCode.SCHEMA.value, "the reply to an update carries no submission")

    def _judge(self, sent: _Sent, item: bytes, *, primary: bool, round_trip_s: float) -> None:
        """One signed submission of a reply: caps, signature, then the coordinator; always answered."""
        pid = sent.participant_id
        if any(begun_pid == pid for begun_pid, _ in self._begun):
            # one submission of a lab at a time (the coordinator refuses a second while it judges the
            # first), and a lab's answers in the order of its submissions
            self._finish_judging()
        problem = self.coordinator.admit(pid, len(item))  # caps first: before verifying or decoding (T8)
        if problem is not None:
            self._refuse(sent, problem.code.value, problem.detail, primary=primary, journaled=True,
                         retry_after_s=problem.retry_after_s)
            return
        opened = self._open_submission(sent, item, primary)
        if opened is None:
            return
        submission, body = opened
        if (sent.round_id == FINAL or self.coordinator.finished) and submission.round_id == self.cfg.rounds \
                and not submission.trajectories:
            self._final_report(sent, submission, primary)
            return
        finish = self.coordinator.begin_submit(submission, sender=pid, admitted=True, encoded=body)
        self._begun.append((pid, lambda: self._answer(sent, submission, finish(), primary, round_trip_s)))

    def _finish_judging(self, keep: int = 0) -> None:
        """Finish the submissions begun (`Coordinator.begin_submit`), oldest first, all but the
        last `keep`: each waits for its verdicts, is journaled and answered (`_answer`)."""
        while len(self._begun) > keep:
            _, finish = self._begun.popleft()
            finish()

    def _answer(self, sent: _Sent, submission: Submission, result: SubmissionResult, primary: bool,
                round_trip_s: float) -> None:
        """The answer to a judged submission: its receipt (built from what the journal stored, after
        its COMMIT: R2) or its refusal, and its console lines."""
        pid = sent.participant_id
        if result.refusal is not None:
            refusal = result.rejected[0]
            self._refuse(sent, refusal.code.value, refusal.detail, primary=primary, journaled=True,
                         round_id=submission.round_id, nonce=submission.nonce, retry_after_s=refusal.retry_after_s)
            return
        self.answers.receipt(pid, result)  # built from what the journal stored, after its COMMIT (R2)
        what = _what(sent) if primary else f"round {submission.round_id} (resent from the outbox)"
        if primary:
            report = submission.report.metrics if submission.report is not None else {}
            self._steps[pid] = StepTimes.from_report(report, round_trip_s)
        self.console(f"{what} {pid}: submitted {len(submission.trajectories)} trajectories, accepted "
                     f"{len(result.accepted_ids)} (receipt seq {result.receipt.seq}"
                     f"{', identical resend' if result.replayed else ''})")
        if result.rejected and not result.replayed:
            self.console(rejection_line(submission.round_id, pid, result.rejected, len(submission.trajectories)))

    def _open_submission(self, sent: _Sent, item: bytes, primary: bool) -> tuple[Submission, bytes] | None:
        """The envelope (a registered key, a valid signature, signed by the participant whose node
        sent it), then decoding: the submission and the signed bytes it was decoded from; None
        when refused (answered here)."""
        pid = sent.participant_id
        try:
            body, kid = open_envelope(item, self.membership.keys(), DOMAIN_SUBMIT, PayloadType.SUBMISSION)
            signer = self.membership.owner(kid)
        except WireError as exc:
            self._refuse(sent, str(exc.code), exc.message, primary=primary)
            return None
        if signer != pid:  # checked before decoding: nothing signed by another lab is parsed for this node
            self._refuse(sent, ErrorCode.IDENTITY_MISMATCH.value,
                         f"envelope signed with the key of {signer}, sent by the node of {pid}", primary=primary)
            return None
        try:  # more trajectories than a full plan are refused before any is built (T8, security.md S4)
            return decode_submission(body, max_trajectories=self.coordinator.max_trajectories), body
        except WireError as exc:
            self._refuse(sent, str(exc.code), exc.message, primary=primary)
            return None

    def _final_report(self, sent: _Sent, submission: Submission, primary: bool) -> None:
        pid = sent.participant_id
        if pid not in self._final_reports():  # a resend of a recorded report changes nothing
            problem = self.coordinator.record_final_report(submission, sender=pid)
            if problem is not None:
                self._refuse(sent, problem.code.value, problem.detail, primary=primary, journaled=False,
                             round_id=submission.round_id, nonce=submission.nonce)
                return
            accuracy = submission.report.eval_accuracy if submission.report else None
            self.console(f"final report {pid}: eval {_fmt(accuracy)}")
        self._acks.add(pid)  # the final acknowledgement answers it

    def _refuse(
        self, sent: _Sent, code: str, detail: str, *, primary: bool = True, journaled: bool = False,
        round_id: int | None = None, nonce: str = "", retry_after_s: float | None = None,
    ) -> None:
        """A submission (or a whole reply) refused: journaled, answered with a signed refusal, named
        on the console. A refused primary submission is not asked for again this round (a retry
        would bring the same bytes), unless the refusal carries a retry-after."""
        pid = sent.participant_id
        if round_id is None and sent.round_id is not None and sent.round_id >= 0:
            round_id = sent.round_id
        if not journaled:
            self.journal.record_rejection(pid, round_id, code, safe_text(detail, 500), self.coordinator.now())
        self.answers.refusal(pid, code, detail, round_id=round_id or 0, nonce=nonce, retry_after_s=retry_after_s)
        if primary:
            wait = float("inf") if retry_after_s is None else retry_after_s
            self._retry_at[pid] = self._monotonic() + wait
        what = _what(sent) if primary else f"round {round_id} (resent from the outbox)"
        self.console(f"{what} {pid}: REFUSED {code}: {safe_text(detail, 300)}")

    def _unknown_notice(self, pid: str) -> bytes | None:
        """The signed notice telling a node that its participant id is not registered (sent with its
        next hello, `FederationDriver.hello`), or None for an id that cannot even be encoded."""
        if self.membership.trust_on_first_use:
            return None
        detail = (f"{pid} is not registered with this coordinator: the operator registers a lab with "
                  f"hacfed-server register <its enrolment.txt> (hacfed-client keys prints it)")
        queue = AnswerQueue(self._key, self.cfg.run_id)  # not kept: the notice is simply repeated
        try:
            return queue.refusal(pid, ErrorCode.UNKNOWN_PARTICIPANT.value, detail)
        except (WireError, ValueError):
            return None

    # -- trust on first use ------------------------------------------------------------------------

    def _key_requests(self, unknown: set[str]) -> dict[int, bytes]:
        if not self.membership.trust_on_first_use or not unknown:
            return {}
        now = self._monotonic()
        busy = {s.participant_id for s in self._sent.values()}
        targets = {node: pid for node, pid in self._nodes.items()
                   if pid in unknown and pid not in busy and self._retry_at.get(pid, 0.0) <= now}
        if not targets:
            return {}
        now, request = self._monotonic(), seal(b"", KEY_REQUEST_TYPE, self._key, DOMAIN_UPDATE)
        self._sent.update({node: _Sent(pid, None, now) for node, pid in targets.items()})
        return {node: request for node in targets}

    def _accept_key_offer(self, participant_id: str, payload: bytes) -> None:
        try:
            self.membership.accept_offer(participant_id, payload)
        except (WireError, ValueError) as exc:
            self._retry_at[participant_id] = float("inf")
            self.console(f"REFUSED key offer of {printable(participant_id)}: {safe_text(str(exc), 300)}")


def _what(sent: _Sent) -> str:
    names = {FINAL: "final report", ACK: "final acknowledgement", ANSWERS: "answers", None: "key request"}
    return names.get(sent.round_id, f"round {sent.round_id}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
