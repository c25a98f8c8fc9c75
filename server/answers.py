"""The coordinator's answers to submissions: signed receipts and refusals, queued per lab until a
reply proves the lab received them (security.md "Nothing lost", S3, T12).

Runs in the coordinator's ServerApp process, inside the round driver (`hacfed.server.driver`).

Every submission a lab sends gets exactly one answer: a `SubmissionReceipt` once the journal has
committed it (built from the result the journal stored, so an identical resend gets a byte-identical
receipt: the encoding is deterministic and so is Ed25519), or a `SubmissionRefusal` with its closed
HACFED-E code. Answers ride on the next `Delivery` to that lab (with the next request, or alone) and
stay queued until the lab replies to a delivery that carried them; if the coordinator dies first, the
lab still holds the submission in its outbox, resends it, and gets the stored receipt again.
"""

from __future__ import annotations

import math

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.exchange import seal_answer
from hacfed.server.coordinator.errors import safe_text
from hacfed.server.coordinator.results import SubmissionResult
from hacfed.wire import MAX_DELIVERY_ITEMS, Rejection, SubmissionReceipt, SubmissionRefusal

MAX_QUEUED = 4 * MAX_DELIVERY_ITEMS  # per lab; beyond it the oldest go (the lab's outbox asks again)


def wire_receipt(result: SubmissionResult) -> SubmissionReceipt:
    """The wire form of a recorded submission's receipt (the result the journal stored)."""
    r = result.receipt
    if r is None:
        raise ValueError("only a recorded submission has a receipt")
    return SubmissionReceipt(
        run_id=r.run_id, round_id=r.round_id, participant_id=r.participant_id,
        accepted_trajectory_ids=tuple(result.accepted_ids),
        rejections=tuple(Rejection(x.code.value, x.detail, x.trajectory_id or "") for x in result.rejected),
        seq=r.seq, content_hash=r.content_hash, nonce=r.nonce,
    )


class AnswerQueue:
    def __init__(self, key: Ed25519PrivateKey, run_id: str) -> None:
        self._key = key
        self.run_id = run_id
        self._queued: dict[str, list[bytes]] = {}

    def receipt(self, participant_id: str, result: SubmissionResult) -> bytes:
        return self._queue(participant_id, seal_answer(wire_receipt(result), self._key))

    def refusal(
        self, participant_id: str, code: str, detail: str, *, round_id: int = 0, nonce: str = "",
        retry_after_s: float | None = None,
    ) -> bytes:
        retry_ms = 0 if retry_after_s is None else max(1, math.ceil(retry_after_s * 1000))
        refusal = SubmissionRefusal(self.run_id, max(round_id, 0), participant_id, nonce, code,
                                    safe_text(detail, 500), retry_ms)
        return self._queue(participant_id, seal_answer(refusal, self._key))

    def pending(self, participant_id: str) -> tuple[bytes, ...]:
        return tuple(self._queued.get(participant_id, ())[:MAX_DELIVERY_ITEMS])

    def delivered(self, participant_id: str, answers: tuple[bytes, ...]) -> None:
        """The lab replied to a delivery carrying `answers`: it has them."""
        left = [a for a in self._queued.get(participant_id, []) if a not in answers]
        if left:
            self._queued[participant_id] = left
        else:
            self._queued.pop(participant_id, None)

    def _queue(self, participant_id: str, answer: bytes) -> bytes:
        queue = self._queued.setdefault(participant_id, [])
        if answer not in queue:  # the same receipt twice (an identical resend) is delivered once
            queue.append(answer)
            del queue[:-MAX_QUEUED]
        return answer
