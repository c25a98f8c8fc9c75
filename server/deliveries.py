"""What the round driver has sent to which Flower node, and when a lab may be asked again.

Runs in the coordinator's ServerApp process, owned by `hacfed.server.driver.FederationDriver`.
Every exchange the driver starts is recorded here as a `Sent` until its reply or error comes back:
a lab with a delivery in flight is busy and is sent nothing else. A lab whose exchange failed, or
whose submission was refused, is held until a retry time (`hold`); a lab whose answers-only
delivery failed is held apart (`hold_answers`), so its answers wait without delaying its rounds.
Deliveries carry the lab's queued answers (`hacfed.server.answers`) before the request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.envelope import DOMAIN_UPDATE, seal_parts
from hacfed.exchange import seal_delivery
from hacfed.server.answers import AnswerQueue
from hacfed.wire import PayloadType
from hacfed.wire.framing import delivery_parts_of

T, R = TypeVar("T"), TypeVar("R")

FINAL = -1  # the round number of the final (plan-less) exchange in `Sent`
ACK = -2  # ... and of the final acknowledgement
ANSWERS = -3  # ... and of a delivery that carries answers only


@dataclass(frozen=True)
class Sent:
    participant_id: str
    round_id: int | None  # a coordinator round, FINAL, ACK, ANSWERS, or None for a key request
    at: float  # monotonic
    answers: tuple[bytes, ...] = ()  # the signed answers the delivery carried


def what(sent: Sent) -> str:
    """How the console names the exchange `sent` started."""
    names = {FINAL: "final report", ACK: "final acknowledgement", ANSWERS: "answers", None: "key request"}
    return names.get(sent.round_id, f"round {sent.round_id}")


def submission_label(sent: Sent, round_id: int | None, primary: bool) -> str:
    """How the console names a submission of the reply to `sent`: as the exchange it answered, unless
    it is a resend from the lab's outbox or a submission of another round than the one `sent` asked
    for (a lab's node that answers round r with its reply of round r-1)."""
    if not primary:
        return f"round {round_id} (resent from the outbox)"
    if round_id is not None and sent.round_id is not None and sent.round_id >= 0 and round_id != sent.round_id:
        return f"round {round_id} (sent as the reply to round {sent.round_id})"
    return what(sent)


class Deliveries:
    """The exchanges in flight (node id -> `Sent`) and the labs' retry times."""

    def __init__(self, key: Ed25519PrivateKey, answers: AnswerQueue, monotonic: Callable[[], float]) -> None:
        self._key = key
        self._answers = answers
        self._monotonic = monotonic
        self._sent: dict[int, Sent] = {}
        self._retry_at: dict[str, float] = {}
        self._answers_retry_at: dict[str, float] = {}  # after a failed answers-only delivery

    # -- in flight -------------------------------------------------------------------------------

    def busy(self) -> set[str]:
        """The labs with an exchange in flight."""
        return {s.participant_id for s in self._sent.values()}

    def record(self, node_id: int, sent: Sent) -> None:
        self._sent[node_id] = sent

    def take(self, node_id: int) -> Sent | None:
        """What node `node_id` was sent, now that its reply or error came back (None: nothing)."""
        return self._sent.pop(node_id, None)

    def forget_round(self, round_id: int) -> None:
        """Drop the exchanges of a round that closed: a late reply to one is ignored."""
        self._sent = {n: s for n, s in self._sent.items() if s.round_id != round_id}

    # -- retry times -----------------------------------------------------------------------------

    def hold(self, participant_id: str, seconds: float) -> None:
        """Ask the lab nothing for `seconds` (inf: not again until the holds are cleared)."""
        self._retry_at[participant_id] = self._monotonic() + seconds

    def may_ask(self, participant_id: str, now: float) -> bool:
        return self._retry_at.get(participant_id, 0.0) <= now

    def clear_holds(self) -> None:
        """A new round (or the final exchange) asks every lab again."""
        self._retry_at = {}

    def hold_answers(self, participant_id: str, seconds: float) -> None:
        self._answers_retry_at[participant_id] = self._monotonic() + seconds

    def may_send_answers(self, participant_id: str, now: float) -> bool:
        return self._answers_retry_at.get(participant_id, 0.0) <= now

    # -- sending ---------------------------------------------------------------------------------

    def send(
        self, targets: Mapping[int, str], round_id: int | None, request: bytes | Callable[[str], Sequence[bytes]],
    ) -> dict[int, bytes]:
        """A delivery per node: its lab's queued answers plus `request` (sealed once for all, or one
        per lab: a callable from participant id to the sealed request as the pieces of its envelope,
        `RoundUpdates.pieces_for_lab`, spliced into the delivery without joining them first). Per-lab
        requests are sealed over SEAL_THREADS threads: hashing a lab's update and its delivery
        (SHA-256 of ~6 MB each at 64 labs, bench/coordinator_scale.py) releases the GIL, so two labs
        are sealed at once."""
        now = self._monotonic()
        jobs = [(node, pid, self._answers.pending(pid)) for node, pid in targets.items()]

        def seal(job: tuple[int, str, tuple[bytes, ...]]) -> bytes:
            _, pid, answers = job
            if not callable(request):
                return seal_delivery(answers, request, self._key)
            return seal_parts(delivery_parts_of(answers, request(pid)), PayloadType.DELIVERY, self._key, DOMAIN_UPDATE)

        sealed = in_threads(seal, jobs, SEAL_THREADS if callable(request) else 1)
        for node, pid, answers in jobs:  # only once every delivery is sealed
            self._sent[node] = Sent(pid, round_id, now, answers)
        return {node: data for (node, _, _), data in zip(jobs, sealed)}

    def send_bare(self, targets: Mapping[int, str], round_id: int | None, payload: bytes) -> dict[int, bytes]:
        """`payload` as it is (no delivery, no answers) to every node of `targets`: a key request."""
        now = self._monotonic()
        self._sent.update({node: Sent(pid, round_id, now) for node, pid in targets.items()})
        return {node: payload for node in targets}


SEAL_THREADS = 2  # threads sealing per-lab deliveries (`Deliveries.send`)
_SEALERS: ThreadPoolExecutor | None = None


def in_threads(fn: Callable[[T], R], items: Sequence[T], threads: int) -> list[R]:
    """`[fn(x) for x in items]`, the items split in up to `threads` contiguous slices, the first in
    the calling thread and the rest in helper threads; the first exception is raised."""
    global _SEALERS
    n = max(1, min(threads, len(items)))
    if n == 1:
        return [fn(x) for x in items]
    if _SEALERS is None:
        _SEALERS = ThreadPoolExecutor(max_workers=SEAL_THREADS - 1, thread_name_prefix="hacfed-seal")
    bounds = [len(items) * i // n for i in range(n + 1)]
    futures = [_SEALERS.submit(lambda part: [fn(x) for x in part], items[bounds[i]:bounds[i + 1]])
               for i in range(1, n)]
    first = [fn(x) for x in items[bounds[0]:bounds[1]]]
    return first + [r for f in futures for r in f.result()]
