"""The participant side of the exchange: what `hacfed-client` serves to its Flower relay.

Runs in a lab's hacfed-client process, served on loopback behind the ClientApp relay
(`hacfed.clients.relay`).

    service = ParticipantService(participant, task, participant_key, coordinator_public_key, state_dir)
    server, port = serve_participant(service.handle)   # hacfed.clients.relay, loopback only

`handle(request) -> reply` takes the bytes the coordinator sent (a sealed `RoundUpdate`) and returns
a sealed `Submission`. Checks, in order, each refused with a `ParticipantRejection` (a gRPC status
plus a `HACFED-E-...` code that reaches the coordinator through the relay), never a crash:

1. the envelope: structure, the coordinator's key, signature, domain, payload type;
2. the update: wire decoding and its own validation;
3. the run: a state directory serves one run (its checkpoints belong to it);
4. the plan: every prompt must be one of the local task's, with the same text ("task mismatch");
5. retries: the reply to (run, pool round, plan round) is cached on disk, so a retried update gets
   the same bytes back and the participant never trains twice on one pool, even across a restart;
   an update older than the last plan rolled out is stale.

Besides round updates the coordinator may send a key request (trust on first use: answered with a
self-signed key offer) and, once it has recorded the final report, a final acknowledgement (its
payload is the run id): only then may a participant leave, since Flower turns a reply that is not
yet pulled into a "node unavailable" error when its node goes away.

Requests are served one at a time: the participant holds one model.
"""

from __future__ import annotations

import base64
import dataclasses
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
from hacfed.clients.relay import ParticipantRejection
from hacfed.envelope import DOMAIN_SUBMIT, DOMAIN_UPDATE, key_id, open_envelope, seal
from hacfed.keys import FINAL_ACK_TYPE, KEY_OFFER_TYPE, KEY_REQUEST_TYPE, raw_public_bytes
from hacfed.messages import RoundUpdate, Submission
from hacfed.tasks.base import Task
from hacfed.wire import GRPC_STATUS, PayloadType, WireError, decode_envelope, decode_round_update, encode_submission

CACHE_FILE = "last-reply.json"
RUN_FILE = "run.json"
TASK_MISMATCH = "HACFED-E-TASK-MISMATCH"
WRONG_RUN = "HACFED-E-WRONG-RUN"
STALE_UPDATE = "HACFED-E-STALE-ROUND"
_ACCEPTED_TYPES = (str(PayloadType.ROUND_UPDATE), KEY_REQUEST_TYPE, FINAL_ACK_TYPE)

UpdateKey = tuple[str, int | None, int | None]  # (run id, pool round, plan round)


class SteppingParticipant(Protocol):
    """What the service drives: `hacfed.clients.participant.Participant` (or a test double)."""

    participant_id: str
    last_round: int | None

    def step(self, update: RoundUpdate) -> Submission: ...


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


def falsify_rewards(submission: Submission) -> Submission:
    """Claim the opposite of every reward (test-only cheating, HACFED_TEST_FALSIFY_REWARDS=1)."""
    flipped = tuple(dataclasses.replace(t, reward=1.0 - t.reward) for t in submission.trajectories)
    return dataclasses.replace(submission, trajectories=flipped)


class ParticipantService:
    def __init__(
        self,
        participant: SteppingParticipant,
        task: Task,
        private_key: Ed25519PrivateKey,
        coordinator_key: Ed25519PublicKey,
        state_dir: Path,
        *,
        cheat: bool = False,
        on_answer: Callable[[Answered], None] | None = None,
        on_finished: Callable[[], None] | None = None,
    ) -> None:
        self.participant = participant
        self.task = task
        self._key = private_key
        self._trusted = {key_id(coordinator_key): coordinator_key}
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._cheat = cheat
        self._on_answer = on_answer
        self._on_finished = on_finished
        self.finished = False  # the coordinator's final acknowledgement arrived: the run is over
        self._lock = threading.Lock()
        self.steps = 0  # how many updates were really trained on (not cached)

    def handle(self, request: bytes) -> bytes:
        with self._lock:
            payload_type, payload = self._open(request)
            if payload_type == KEY_REQUEST_TYPE:
                return make_key_offer(self._key)
            if payload_type == FINAL_ACK_TYPE:
                self._check_run(payload.decode("utf-8", errors="replace"))
                self.finished = True
                if self._on_finished is not None:
                    self._on_finished()
                return b""
            update = self._decode(payload)
            key = update_key(update)
            cached = self._cached_reply(key)
            if cached is not None:
                self._notify(Answered(update, None, 0.0, True))
                return cached
            self._check_run(update.run_id)
            self._check_fresh(key)
            self._check_plan(update)
            started = time.perf_counter()
            submission = self.participant.step(update)
            self.steps += 1
            if self._cheat:
                submission = falsify_rewards(submission)
            reply = seal(encode_submission(submission), PayloadType.SUBMISSION, self._key, DOMAIN_SUBMIT)
            self._store_reply(key, reply)
            self._notify(Answered(update, submission, time.perf_counter() - started, False))
            return reply

    # -- checks ----------------------------------------------------------------------------------

    def _open(self, request: bytes) -> tuple[str, bytes]:
        try:
            payload_type = decode_envelope(request).payload_type
            expected = payload_type if payload_type in _ACCEPTED_TYPES else str(PayloadType.ROUND_UPDATE)
            payload, _ = open_envelope(request, self._trusted, DOMAIN_UPDATE, expected)
        except WireError as exc:  # EnvelopeError included
            what = "not signed by the coordinator key given with --coordinator-key" \
                if exc.code in ("HACFED-E-UNAUTHENTICATED", "HACFED-E-SIGNATURE") else "refused"
            raise _rejection(exc, f"update envelope {what}: {exc.message}") from None
        return payload_type, payload

    def _decode(self, payload: bytes) -> RoundUpdate:
        try:
            return decode_round_update(payload)
        except WireError as exc:
            raise _rejection(exc, f"round update refused: {exc.message}") from None

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

    def _check_fresh(self, key: UpdateKey) -> None:
        plan_round, last = key[2], self.participant.last_round
        if plan_round is not None and last is not None and plan_round <= last:
            raise ParticipantRejection(
                grpc.StatusCode.FAILED_PRECONDITION, STALE_UPDATE,
                f"plan of round {plan_round} is not newer than the last plan this participant rolled out ({last})",
            )

    def _check_plan(self, update: RoundUpdate) -> None:
        if update.next_plan is None:
            return
        for planned in update.next_plan.prompts:
            try:
                problem = self.task.problem(planned.prompt_id)
            except KeyError:
                raise _task_mismatch(f"plan prompt {planned.prompt_id!r} is unknown to this client's task "
                                     f"{self.task.name}") from None
            if tuple(problem.messages) != tuple(planned.messages):
                raise _task_mismatch(f"plan prompt {planned.prompt_id!r} has other text than this client's task "
                                     f"{self.task.name}")

    # -- the reply cache ---------------------------------------------------------------------------

    def _cached_reply(self, key: UpdateKey) -> bytes | None:
        path = self.state_dir / CACHE_FILE
        if not path.exists():
            return None
        entry = json.loads(path.read_text(encoding="utf-8"))
        if tuple(entry["key"]) != key:
            return None
        return base64.b64decode(entry["reply"])

    def _store_reply(self, key: UpdateKey, reply: bytes) -> None:
        entry = {"key": list(key), "reply": base64.b64encode(reply).decode("ascii")}
        atomic_write_text(self.state_dir / CACHE_FILE, json.dumps(entry) + "\n")

    def _notify(self, answered: Answered) -> None:
        if self._on_answer is not None:
            self._on_answer(answered)


def _rejection(exc: WireError, message: str) -> ParticipantRejection:
    status = grpc.StatusCode[GRPC_STATUS.get(exc.code, "INVALID_ARGUMENT")]
    return ParticipantRejection(status, str(exc.code), message)


def _task_mismatch(detail: str) -> ParticipantRejection:
    return ParticipantRejection(
        grpc.StatusCode.FAILED_PRECONDITION, TASK_MISMATCH,
        f"task mismatch: {detail}; the client's task (--task / [task]) must equal the coordinator's [task]",
    )
