"""The participant side of the exchange: what `hacfed-client` serves to its Flower relay.

Runs in a lab's hacfed-client process, served on a Unix socket only the lab's user can open, behind
the ClientApp relay (`hacfed.clients.relay`, `hacfed.clients.local_socket`).

    service = ParticipantService(participant, task, participant_key, coordinator_public_key, state_dir)
    server = serve_participant_unix(service.handle, relay_socket_place(state_dir).path)  # 0600 socket, 0700 dir

`handle(request) -> reply` takes what the coordinator sent, a signed `Delivery` (hacfed.exchange):
answers to earlier submissions, then the request of this exchange (a signed `RoundUpdate`, the final
acknowledgement, or nothing). It returns a signed `LabReply`: the signed `Submission` answering the
update, plus every submission of the outbox that no answer acknowledged yet, byte for byte
(security.md "Nothing lost"). Checks, in order, each refused with a `ParticipantRejection` (a gRPC status plus
a `HACFED-E-...` code that reaches the coordinator through the relay), never a crash:

1. the envelopes: structure, the coordinator's key, signature, domain, payload type;
2. the update: wire decoding and its own validation;
3. the run: a state directory serves one run (its checkpoints belong to it);
4. the plan: every prompt must be one of the local task's, with the same text ("task mismatch"),
   unless the coordinator holds the answer keys (`RoundPlan.answer_keys`): then the local task is
   only what the lab evaluates on;
5. retries: an update already answered is answered again with the same signed bytes from the
   outbox (`hacfed.clients.outbox`), even across a restart, so the participant never trains twice on
   one pool and a resend carries the same nonce; an update older than the last one answered is stale.

Answers: a signed receipt settles its outbox entry and is kept; a signed refusal too (unless it
carries a retry-after: then the entry stays pending and is resent); each is printed through
`on_notice`. What means this lab cannot take part as it is goes to `on_refused` instead, one line:
the coordinator's notice that its id is not registered, and a plan of another task (the coordinator
gets the HACFED-E-TASK-MISMATCH refusal too, and stops waiting for this lab). A second, different
receipt for the same submission is reported (T12). The outbox entry
is written before the participant's checkpoint of the same step (`Participant.step`'s
`before_checkpoint`), so a lab killed after its checkpoint resends the same submission instead of
losing the round, and one killed before it redoes the step (`Outbox.discard_uncovered`).

Besides deliveries the coordinator may send a hello (a challenge: answered with this participant's
id and the challenge signed with its key, `hacfed.hello`, at once, even while a step runs; a hello
inside a delivery carries a notice, e.g. that this lab's id is not registered) and a key request
(trust on first use: answered with a self-signed key offer). The final acknowledgement (its payload
is the run id) arrives once the coordinator has recorded the final report: only then may a
participant leave, since Flower turns a reply that is not yet pulled into a "node unavailable"
error when its node goes away.

Requests are served one at a time: the participant holds one model.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hacfed.clients.checkpoints import atomic_write_text
from hacfed.clients.outbox import Outbox, UpdateKey
from hacfed.clients.relay import ParticipantRejection
from hacfed.envelope import DOMAIN_SUBMIT, DOMAIN_UPDATE, key_id, open_envelope, seal
from hacfed.exchange import open_answer, open_delivery, request_type, seal_lab_reply
from hacfed.hello import HELLO_REQUEST_TYPE, prove_identity
from hacfed.keys import FINAL_ACK_TYPE, KEY_OFFER_TYPE, KEY_REQUEST_TYPE, raw_public_bytes
from hacfed.messages import RoundUpdate, Submission
from hacfed.tasks.base import Task
from hacfed.wire import (
    GRPC_STATUS,
    MAX_MESSAGE_BYTES,
    PayloadType,
    SubmissionReceipt,
    WireError,
    decode_round_update,
    encode_submission,
)

OUTBOX_FILE = "outbox.sqlite"
RUN_FILE = "run.json"
TASK_MISMATCH = "HACFED-E-TASK-MISMATCH"
REFUSALS_OF_THE_LAB = ("HACFED-E-UNKNOWN-PARTICIPANT",)  # notices (no submission) that end this lab's run
WRONG_RUN = "HACFED-E-WRONG-RUN"
STALE_UPDATE = "HACFED-E-STALE-ROUND"
_OUTER_TYPES = (str(PayloadType.DELIVERY), HELLO_REQUEST_TYPE, KEY_REQUEST_TYPE)
_REQUEST_TYPES = (str(PayloadType.ROUND_UPDATE), FINAL_ACK_TYPE, HELLO_REQUEST_TYPE)
_REPLY_HEADROOM = 64 * 1024  # what the LabReply frame and its signature add around the submissions


class SteppingParticipant(Protocol):
    """What the service drives: `hacfed.clients.participant.Participant` (or a test double).
    `step` calls `before_checkpoint(submission)` before it checkpoints (see the module docstring)."""

    participant_id: str
    last_round: int | None
    last_pool_round: int | None

    def step(
        self, update: RoundUpdate, before_checkpoint: Callable[[Submission], None] | None = None
    ) -> Submission: ...


@dataclass(frozen=True)
class Answered:
    """One answered update, for the client's console: `cached` when it was a retry."""

    update: RoundUpdate
    submission: Submission | None  # None for a cached reply
    seconds: float
    cached: bool

    @property
    def final(self) -> bool:
        return self.update.next_plan is None


def update_key(update: RoundUpdate) -> UpdateKey:
    plan_round = update.next_plan.round_id if update.next_plan is not None else None
    return (update.run_id, update.pool_round, plan_round)


def make_key_offer(private_key: Ed25519PrivateKey) -> bytes:
    """A participant's answer to a key request: its public key, signed by itself."""
    return seal(raw_public_bytes(private_key.public_key()), KEY_OFFER_TYPE, private_key, DOMAIN_SUBMIT)


class ParticipantService:
    def __init__(
        self,
        participant: SteppingParticipant,
        task: Task,
        private_key: Ed25519PrivateKey,
        coordinator_key: Ed25519PublicKey,
        state_dir: Path,
        *,
        on_answer: Callable[[Answered], None] | None = None,
        on_finished: Callable[[], None] | None = None,
        on_notice: Callable[[str], None] | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.participant = participant
        self.task = task
        self._key = private_key
        self._trusted = {key_id(coordinator_key): coordinator_key}
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._on_answer = on_answer
        self._on_finished = on_finished
        self._on_notice = on_notice
        self._on_refused = on_refused
        self.finished = False  # the coordinator's final acknowledgement arrived: the run is over
        self._lock = threading.Lock()
        self.steps = 0  # how many updates were really trained on (not answered from the outbox)
        self.outbox = Outbox(self.state_dir / OUTBOX_FILE)
        for key in self.outbox.discard_uncovered(self._covered):
            self._notice(f"dropped the unsent reply to the update {list(key)}: its step did not reach its "
                         f"checkpoint, so the step runs again when the coordinator resends the update")

    def handle(self, request: bytes) -> bytes:
        outer = self._checked(lambda: request_type(request, _OUTER_TYPES), "request")
        if outer == HELLO_REQUEST_TYPE:  # needs only the key: answered at once, even while a step runs
            return self._hello(request)
        with self._lock:
            if outer == KEY_REQUEST_TYPE:
                self._checked(lambda: open_envelope(request, self._trusted, DOMAIN_UPDATE, KEY_REQUEST_TYPE), "request")
                return make_key_offer(self._key)
            delivery = self._checked(lambda: open_delivery(request, self._trusted), "delivery")
            for answer in delivery.answers:
                self._take_answer(answer)
            key, submission = None, b""
            if delivery.request:
                kind = self._checked(lambda: request_type(delivery.request, _REQUEST_TYPES), "request")
                payload, _ = self._checked(
                    lambda: open_envelope(delivery.request, self._trusted, DOMAIN_UPDATE, kind), "update envelope")
                if kind == HELLO_REQUEST_TYPE:  # a hello that came with notices (answered above)
                    return self._hello(delivery.request)
                if kind == FINAL_ACK_TYPE:
                    self._finish(payload.decode("utf-8", errors="replace"), delivery.request)
                else:
                    key, submission = self._answer_update(payload, delivery.request)
            return self._reply(key, submission)

    def _hello(self, request: bytes) -> bytes:
        """This participant's signed answer to the coordinator's hello challenge (`hacfed.hello`)."""
        challenge, _ = self._checked(
            lambda: open_envelope(request, self._trusted, DOMAIN_UPDATE, HELLO_REQUEST_TYPE), "hello")
        return self._checked(lambda: prove_identity(challenge, self.participant.participant_id, self._key), "hello")

    # -- the update ------------------------------------------------------------------------------

    def _answer_update(self, payload: bytes, raw: bytes) -> tuple[UpdateKey, bytes]:
        update = self._decode(payload)
        key = update_key(update)
        entry = self.outbox.entry_for(key)
        if entry is not None and entry.envelope is not None:  # answered before: the same bytes again
            self._notify(Answered(update, None, 0.0, True))
            return key, entry.envelope
        self._check_run(update.run_id)
        self._check_fresh(key, answered=entry is not None)
        self._check_plan(update)
        self.outbox.remember_update(key, raw)  # the pool, kept for a local replay after a purge (R11)
        started = time.perf_counter()
        sealed: dict[str, tuple[Submission, bytes]] = {}

        def keep_in_outbox(submission: Submission) -> None:  # runs before the participant's checkpoint
            envelope = seal(encode_submission(submission), PayloadType.SUBMISSION, self._key, DOMAIN_SUBMIT)
            self.outbox.add(key, submission.round_id, submission.nonce, envelope)
            sealed["reply"] = (submission, envelope)

        try:
            submission = self.participant.step(update, before_checkpoint=keep_in_outbox)
            if "reply" not in sealed:  # a participant without checkpoints that skipped the hook
                keep_in_outbox(submission)
        except BaseException:
            self.outbox.discard(key)  # never sent: the retried update runs the step again
            raise
        self.steps += 1
        self._notify(Answered(update, sealed["reply"][0], time.perf_counter() - started, False))
        return key, sealed["reply"][1]

    def _reply(self, key: UpdateKey | None, submission: bytes) -> bytes:
        """The LabReply: the submission plus the outbox's unanswered entries, within the size cap."""
        room = MAX_MESSAGE_BYTES - _REPLY_HEADROOM - len(submission)
        resends = []
        for entry in self.outbox.pending(exclude=key):
            if entry.envelope is None or len(entry.envelope) > room:
                continue
            room -= len(entry.envelope)
            resends.append(entry)
        sent = [e.key for e in resends] + ([key] if key is not None else [])
        self.outbox.mark_sent(sent)
        return seal_lab_reply(submission, [e.envelope for e in resends if e.envelope], self._key)

    def _finish(self, run_id: str, ack: bytes) -> None:
        self._check_run(run_id)
        self.finished = True
        for entry in self.outbox.pending(limit=1 << 20):
            if entry.key[2] is None:  # the final report: the acknowledgement is its answer
                self.outbox.settle(entry.nonce, "acked", ack)
        left = self.outbox.counts()["pending"]
        if left:
            self._notice(f"{left} submission(s) were never acknowledged by the coordinator; they stay in "
                         f"{self.outbox.path}")
        if self._on_finished is not None:
            self._on_finished()

    # -- answers ---------------------------------------------------------------------------------

    def _take_answer(self, data: bytes) -> None:
        try:
            answer = open_answer(data, self._trusted)
        except WireError as exc:
            self._notice(f"ignored an answer that is not a valid signed receipt or refusal: {exc}")
            return
        if answer.participant_id not in ("", self.participant.participant_id):
            self._notice(f"ignored an answer addressed to {answer.participant_id!r}")
            return
        where = f"round {answer.round_id}" if answer.nonce else "the coordinator"
        if isinstance(answer, SubmissionReceipt):
            before = self.outbox.settle(answer.nonce, "acked", data)
            if before is not None and before.state != "pending":
                if before.answer is not None and before.answer != data:
                    self._notice(f"WARNING: {where}: the coordinator sent a second, DIFFERENT receipt for the same "
                                 f"submission (seq {answer.seq}); the first one is kept in {self.outbox.path}")
                return
            rejected = f"; rejected {len(answer.rejections)}: {_codes(answer)}" if answer.rejections else ""
            self._notice(f"{where}: receipt seq {answer.seq} (content {answer.content_hash[:12]}): accepted "
                         f"{len(answer.accepted_trajectory_ids)}{rejected}")
            return
        if answer.retry_after_ms > 0:  # a rate limit or a quota: the entry stays pending and is resent
            self._notice(f"{where}: REFUSED {answer.code}: {answer.message} (resent in a later reply; retry after "
                         f"{answer.retry_after_ms / 1000:.1f}s)")
            return
        if not answer.nonce and answer.code in REFUSALS_OF_THE_LAB:  # a notice: this lab cannot take part
            self._refused(f"the coordinator refused this lab ({answer.code}): {answer.message}")
            return
        before = (
            self.outbox.settle(answer.nonce, "refused", data, answer.code, answer.message) if answer.nonce else None
        )
        if before is not None and before.state != "pending":
            return
        self._notice(f"{where}: REFUSED {answer.code}: {answer.message}")

    # -- checks ----------------------------------------------------------------------------------

    def _checked(self, call: Callable, what: str):  # noqa: ANN202 - returns what `call` returns
        try:
            return call()
        except WireError as exc:  # EnvelopeError included
            detail = "not signed by the coordinator key given with --coordinator-key" \
                if exc.code in ("HACFED-E-UNAUTHENTICATED", "HACFED-E-SIGNATURE") else "refused"
            raise _rejection(exc, f"{what} {detail}: {exc.message}") from None

    def _decode(self, payload: bytes) -> RoundUpdate:
        return self._checked(lambda: decode_round_update(payload), "round update")

    def _covered(self, key: UpdateKey) -> bool:
        """Whether the participant's checkpoint (its progress) includes the step answering `key`."""
        _, pool_round, plan_round = key
        last_plan, last_pool = self.participant.last_round, getattr(self.participant, "last_pool_round", None)
        return (plan_round is None or (last_plan is not None and last_plan >= plan_round)) and \
            (pool_round is None or (last_pool is not None and last_pool >= pool_round))

    def _check_run(self, run_id: str) -> None:
        path = self.state_dir / RUN_FILE
        if path.exists():
            bound = json.loads(path.read_text(encoding="utf-8"))["run_id"]
            if bound != run_id:
                raise ParticipantRejection(
                    grpc.StatusCode.FAILED_PRECONDITION, WRONG_RUN,
                    f"this participant's state dir {self.state_dir} belongs to run {bound!r}, the coordinator "
                    f"runs {run_id!r}; start hacfed-client with a fresh --state-dir",
                )
        else:
            atomic_write_text(path, json.dumps({"run_id": run_id}) + "\n")

    def _check_fresh(self, key: UpdateKey, answered: bool) -> None:
        _, pool_round, plan_round = key
        last_plan, last_pool = self.participant.last_round, getattr(self.participant, "last_pool_round", None)
        if answered or (plan_round is not None and last_plan is not None and plan_round <= last_plan) or \
                (plan_round is None and pool_round is not None and last_pool is not None and pool_round <= last_pool):
            raise ParticipantRejection(
                grpc.StatusCode.FAILED_PRECONDITION, STALE_UPDATE,
                f"the update {list(key)} is not newer than the last one this participant answered "
                f"(plan {last_plan}, pool {last_pool})",
            )

    def _check_plan(self, update: RoundUpdate) -> None:
        if update.next_plan is None or update.next_plan.answer_keys == "coordinator":
            return  # the coordinator holds the problems: its prompts need not be in the local task
        for planned in update.next_plan.prompts:
            try:
                problem = self.task.problem(planned.prompt_id)
            except KeyError:
                problem = None
            if problem is None or tuple(problem.messages) != tuple(planned.messages):
                what = "is unknown to" if problem is None else "has other text than"
                mismatch = _task_mismatch(f"plan prompt {planned.prompt_id!r} {what} this client's task "
                                          f"{self.task.name}")
                self._refused(mismatch.message)
                raise mismatch

    def _notify(self, answered: Answered) -> None:
        if self._on_answer is not None:
            self._on_answer(answered)

    def _notice(self, line: str) -> None:
        if self._on_notice is not None:
            self._on_notice(line)

    def _refused(self, line: str) -> None:
        if self._on_refused is not None:
            self._on_refused(line)
        else:
            self._notice(line)


def _codes(receipt: SubmissionReceipt) -> str:
    counts: dict[str, int] = {}
    for r in receipt.rejections:
        counts[r.code] = counts.get(r.code, 0) + 1
    return ", ".join(f"{code} x{n}" for code, n in sorted(counts.items()))


def _rejection(exc: WireError, message: str) -> ParticipantRejection:
    status = grpc.StatusCode[GRPC_STATUS.get(exc.code, "INVALID_ARGUMENT")]
    return ParticipantRejection(status, str(exc.code), message)


def _task_mismatch(detail: str) -> ParticipantRejection:
    return ParticipantRejection(
        grpc.StatusCode.FAILED_PRECONDITION, TASK_MISMATCH,
        f"task mismatch: {detail}; the client's task (--task / [task]) must equal the coordinator's [task]",
    )
