"""The envelopes of one exchange, as both sides wrap and unwrap them (security.md "Nothing lost", S3).

Shared by both sides: the coordinator's driver (`hacfed.server.driver`) seals deliveries and
answers and opens lab replies; a lab's participant service (`hacfed.clients.service`) does the
reverse.

    coordinator -> lab   Delivery{answers, request}        signed, update domain
                           answers: SubmissionReceipt / SubmissionRefusal envelopes, receipt domain
                           request: a RoundUpdate or FinalAck envelope, update domain (b"": none)
    lab -> coordinator   LabReply{submission, resends}     signed, submit domain
                           submission / resends: Submission envelopes, submit domain, byte-identical
                           to what was first sent

Every part is signed on its own: a receipt is a document the lab keeps and can show later (T12),
a resent submission must be the same bytes as the first send (an identical resend gets the original
receipt back), and the outer envelope binds the combination to its sender. Each uses its own domain
tag (`hacfed.envelope`), so no signature made for one purpose passes for another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hacfed.envelope import DOMAIN_RECEIPT, DOMAIN_SUBMIT, DOMAIN_UPDATE, EnvelopeError, open_envelope, seal, seal_parts
from hacfed.wire import (
    Delivery,
    ErrorCode,
    LabReply,
    PayloadType,
    SubmissionReceipt,
    SubmissionRefusal,
    WireError,
    decode_delivery,
    decode_envelope,
    decode_lab_reply,
    decode_receipt,
    decode_refusal,
    encode_lab_reply,
    encode_receipt,
    encode_refusal,
)
from hacfed.wire.framing import delivery_parts

Answer = SubmissionReceipt | SubmissionRefusal


def seal_answer(answer: Answer, key: Ed25519PrivateKey) -> bytes:
    """A receipt or refusal, signed by the coordinator with the receipt domain tag."""
    if isinstance(answer, SubmissionReceipt):
        return seal(encode_receipt(answer), PayloadType.RECEIPT, key, DOMAIN_RECEIPT)
    if isinstance(answer, SubmissionRefusal):
        return seal(encode_refusal(answer), PayloadType.REFUSAL, key, DOMAIN_RECEIPT)
    raise TypeError(f"an answer is a SubmissionReceipt or a SubmissionRefusal, got {type(answer).__name__}")


def open_answer(data: bytes, trusted: Mapping[bytes, Ed25519PublicKey]) -> Answer:
    """Verify and decode a receipt or refusal (WireError / EnvelopeError when it is not one)."""
    payload_type = decode_envelope(data).payload_type
    if payload_type == PayloadType.RECEIPT:
        payload, _ = open_envelope(data, trusted, DOMAIN_RECEIPT, PayloadType.RECEIPT)
        return decode_receipt(payload)
    payload, _ = open_envelope(data, trusted, DOMAIN_RECEIPT, PayloadType.REFUSAL)
    return decode_refusal(payload)


def seal_delivery(answers: Sequence[bytes], request: bytes, key: Ed25519PrivateKey) -> bytes:
    """The signed delivery; its request (a round update of up to MAX_MESSAGE_BYTES) is copied once."""
    return seal_parts(delivery_parts(Delivery(tuple(answers), request)), PayloadType.DELIVERY, key, DOMAIN_UPDATE)


def open_delivery(data: bytes, trusted: Mapping[bytes, Ed25519PublicKey]) -> Delivery:
    payload, _ = open_envelope(data, trusted, DOMAIN_UPDATE, PayloadType.DELIVERY)
    return decode_delivery(payload)


def seal_lab_reply(submission: bytes, resends: Sequence[bytes], key: Ed25519PrivateKey) -> bytes:
    return seal(encode_lab_reply(LabReply(submission, tuple(resends))), PayloadType.LAB_REPLY, key, DOMAIN_SUBMIT)


def open_lab_reply(data: bytes, trusted: Mapping[bytes, Ed25519PublicKey]) -> tuple[LabReply, bytes]:
    """(the reply, its signer's key id); the submissions inside are still sealed."""
    payload, kid = open_envelope(data, trusted, DOMAIN_SUBMIT, PayloadType.LAB_REPLY)
    return decode_lab_reply(payload), kid


def request_type(data: bytes, allowed: Sequence[str]) -> str:
    """The payload type a request envelope declares, if it is one of `allowed` (checked again,
    signed, when it is opened)."""
    payload_type = decode_envelope(data).payload_type
    if payload_type not in allowed:
        raise EnvelopeError(ErrorCode.PAYLOAD_TYPE, f"expected one of {list(allowed)}, got {payload_type!r}")
    return payload_type


__all__ = [
    "Answer", "EnvelopeError", "WireError", "open_answer", "open_delivery", "open_lab_reply", "request_type",
    "seal_answer", "seal_delivery", "seal_lab_reply",
]
