"""What a lab holds and how it builds a reply, what a hostile case is, and the coordinator it talks to.

Shared by the hostile-corpus tests (test_hostile_corpus.py, test_hostile_server.py) and the case
table (hostile_cases.py): a `Ctx` signs whatever a case builds with the lab's key, a `Case` names the
codes its answers may carry, and a `DriverHarness` is the coordinator's round driver in this process
over a real journal, which `HonestParticipant`s and hostile labs reach with signed hellos and replies.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.clients.service import ParticipantService
from hacfed.envelope import (
    DOMAIN_SUBMIT,
    DOMAIN_UPDATE,
    generate_key,
    key_id,
    open_envelope,
    save_public_key,
    signed_message,
)
from hacfed.exchange import open_answer, open_delivery, seal_lab_reply
from hacfed.hello import HELLO_REQUEST_TYPE, prove_identity
from hacfed.keys import ensure_key_pair
from hacfed.messages import RoundPlan, RoundUpdate, StepReport, Submission
from hacfed.proto import hacfed_v1_pb2 as pb  # only to craft hostile frames
from hacfed.server.config import ServerConfig, ServerSettings
from hacfed.server.coordinator.errors import ErrorCode
from hacfed.server.driver import FederationDriver
from hacfed.trajectory import Trajectory
from hacfed.wire import ErrorCode as WireCode
from hacfed.wire import (
    PayloadType,
    RawEnvelope,
    SubmissionReceipt,
    SubmissionRefusal,
    decode_round_update,
    encode_envelope,
    encode_submission,
)
from tests.unit.test_coordinator_fakes import FakeClock, make_config, scripted_submission, scripted_trajectories

CLOSED_CODES = frozenset(c.value for c in ErrorCode) | frozenset(c.value for c in WireCode)
E = ErrorCode  # short names in the case table and the tests
W = WireCode


# ---- what a lab holds, and how it builds a reply ---------------------------------------------------


@dataclass(frozen=True)
class Lab:
    pid: str
    key: Ed25519PrivateKey


@dataclass(frozen=True)
class Attack:
    """What a case sends: signed items packed into the lab's own LabReply, or a whole LabReply."""

    items: tuple[bytes, ...] = ()
    outer: bytes | None = None


@dataclass
class Ctx:
    """What a lab knows when it answers: its keys, the plan, another lab, a key nobody registered."""

    lab: Lab
    plan: RoundPlan
    other: Lab
    stranger: Ed25519PrivateKey

    @property
    def pid(self) -> str:
        return self.lab.pid

    def trajectories(self) -> list[Trajectory]:
        return scripted_trajectories(self.plan, self.pid)

    def submission(self, trajectories: list[Trajectory] | None = None, **changes: object) -> Submission:
        sub = scripted_submission(self.plan, self.pid, nonce=secrets.token_hex(16), created_at_ms=1)
        if trajectories is not None:
            sub = dataclasses.replace(sub, trajectories=tuple(trajectories))
        return dataclasses.replace(sub, **changes)

    def seal(self, payload: bytes, payload_type: str = PayloadType.SUBMISSION, key: Ed25519PrivateKey | None = None,
             domain: bytes = DOMAIN_SUBMIT, version: int = 1) -> bytes:
        """A validly signed envelope around any payload (no size check: hostile sizes included)."""
        key = key or self.lab.key
        sig = key.sign(signed_message(domain, str(payload_type), payload))
        return encode_envelope(RawEnvelope(payload, sig, key_id(key.public_key()), str(payload_type), version))

    def sealed(self, sub: Submission | None = None) -> bytes:
        return self.seal(encode_submission(sub or self.submission()))

    def frame(self, sub: Submission | None = None) -> pb.WireMessage:
        return pb.WireMessage.FromString(encode_submission(sub or self.submission()))

    def mutated(self, edit: Callable[[pb.Submission], None], sub: Submission | None = None) -> bytes:
        """The lab's submission, edited where the dataclasses would refuse, then signed."""
        frame = self.frame(sub)
        edit(frame.submission)
        return self.seal(frame.SerializeToString(deterministic=True))

    def with_raw_bytes(self, sub: Submission, marker: str, raw: bytes) -> bytes:
        """`sub` signed with the bytes `raw` where its encoding holds the text `marker` (same length,
        so every length prefix still fits): how invalid UTF-8 gets into a string field."""
        data = encode_submission(sub)
        assert len(marker.encode()) == len(raw) and data.count(marker.encode()) == 1
        return self.seal(data.replace(marker.encode(), raw))

    def reply(self, items: tuple[bytes, ...], key: Ed25519PrivateKey | None = None) -> bytes:
        """The LabReply: the last item answers the request, the others ride as resends."""
        return seal_lab_reply(items[-1], items[:-1], key or self.lab.key)


# ---- a case of the corpus (the cases: hostile_cases.py) ----------------------------------------------


@dataclass(frozen=True)
class Case:
    """`codes`: every code the case's answers may carry; `must`: the one that has to be there.
    `early`: refused before the journal records a submission (so several can come from one lab)."""

    name: str
    build: Callable[[Ctx], Attack]
    must: str
    codes: frozenset[str] = frozenset()
    early: bool = True
    setup: Callable[[Ctx], Attack] | None = None  # an honest first exchange (the replays)

    def allowed(self) -> frozenset[str]:
        return self.codes | {self.must}


def items(build: Callable[[Ctx], bytes]) -> Callable[[Ctx], Attack]:
    return lambda ctx: Attack((build(ctx),))


def outer(build: Callable[[Ctx], bytes]) -> Callable[[Ctx], Attack]:
    return lambda ctx: Attack(outer=build(ctx))


# ---- the coordinator's round driver in this process, and an honest lab ---------------------------


class HonestParticipant:
    """Answers every plan with the scripted honest submission (see tests/unit/test_coordinator_fakes)."""

    def __init__(self, participant_id: str) -> None:
        self.participant_id = participant_id
        self.last_round: int | None = None
        self.last_pool_round: int | None = None

    def step(self, update: RoundUpdate, before_checkpoint: Callable[[Submission], None] | None = None) -> Submission:
        pid, plan = self.participant_id, update.next_plan
        if plan is None:
            sub = Submission(update.run_id, pid, update.pool_round + 1, (),
                             StepReport(pid, update.pool_round + 1, {"loss": 0.1}, 0.5), nonce=secrets.token_hex(16))
        else:
            self.last_round = plan.round_id
            sub = scripted_submission(plan, pid, nonce=secrets.token_hex(16))
        self.last_pool_round = update.pool_round
        if before_checkpoint is not None:
            before_checkpoint(sub)
        return sub


class DriverHarness:
    """A FederationDriver over a real journal in tmp_path; every lab identified by a signed hello."""

    def __init__(self, tmp_path: Path, labs: list[str]) -> None:
        state = tmp_path / "server"
        self.clock = FakeClock()
        coordinator = ensure_key_pair(state, "coordinator")
        self.coordinator_public = coordinator.load().public_key()
        self.trusted = {key_id(self.coordinator_public): self.coordinator_public}
        keys_dir = state / "keys"
        keys_dir.mkdir(parents=True, exist_ok=True)
        self.cfg = make_config(state, rounds=2, prompts_per_round=2, group_size=2, expected_participants=1,
                               min_participants=1, round_deadline_s=100.0)
        settings = ServerConfig(self.cfg, ServerSettings(insecure=True, retry_interval_s=5.0), state)
        self.labs = {pid: Lab(pid, generate_key()) for pid in labs}
        for lab in self.labs.values():
            save_public_key(lab.key.public_key(), keys_dir / f"{lab.pid}.pub")
        self.nodes = {100 + i: pid for i, pid in enumerate(labs)}
        self.lines: list[str] = []
        self.driver = FederationDriver(settings, clock=self.clock, monotonic=self.clock, console=self.lines.append)
        self.mapped: dict[int, str] = {}
        self.answered: list[tuple[str, bytes]] = []  # every signed answer the driver made: (lab, bytes)
        for name in ("receipt", "refusal"):
            self._record(name)

    def _record(self, name: str) -> None:
        make = getattr(self.driver.answers, name)

        def recorded(participant_id: str, *args: object, **kwargs: object) -> bytes:
            answer = make(participant_id, *args, **kwargs)
            self.answered.append((participant_id, answer))
            return answer
        setattr(self.driver.answers, name, recorded)

    def node_of(self, pid: str) -> int:
        return next(n for n, p in self.nodes.items() if p == pid)

    def hello_all(self, services: dict[str, ParticipantService]) -> None:
        for node, pid in self.nodes.items():
            request = self.driver.hello(node)
            if pid in services:
                proof = services[pid].handle(request)
            else:
                challenge, _ = open_envelope(request, self.trusted, DOMAIN_UPDATE, HELLO_REQUEST_TYPE)
                proof = prove_identity(challenge, pid, self.labs[pid].key)
            assert self.driver.identify(node, pid, proof), self.lines[-3:]
            self.mapped[node] = pid

    def exchange(self) -> dict[int, bytes]:
        return dict(self.driver.next_round(self.mapped) or {})

    def plan_in(self, delivery: bytes) -> RoundPlan:
        request = open_delivery(delivery, self.trusted).request
        payload, _ = open_envelope(request, self.trusted, DOMAIN_UPDATE, PayloadType.ROUND_UPDATE)
        plan = decode_round_update(payload).next_plan
        assert plan is not None
        return plan

    def send(self, pid: str, reply: bytes) -> tuple[float, list[SubmissionReceipt | SubmissionRefusal]]:
        """The reply as the round loop hands it over; (seconds taken, the new signed answers)."""
        mark = len(self.answered)
        started = time.perf_counter()
        self.driver.on_replies([(self.node_of(pid), reply)])
        seconds = time.perf_counter() - started
        new = [a for p, a in self.answered[mark:] if p == pid]
        assert len(new) == len(self.answered) - mark, "an answer went to another lab"
        return seconds, [open_answer(a, self.trusted) for a in new]
