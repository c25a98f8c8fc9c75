"""Framing and the decoding boundary: size cap, parse, version, message kind, counts, canonical encoding.

Shared by both sides, inside the `hacfed.wire` family. Every payload travels in a `WireMessage`
frame holding the protocol version and exactly one message; the `Envelope` that carries it signed
is encoded and structurally checked here too (`hacfed.envelope` does the crypto). The field-by-field
conversions are `hacfed.wire.convert`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from google.protobuf.message import DecodeError, Message

from hacfed.messages import RoundPlan, RoundUpdate, StepReport, Submission
from hacfed.proto import hacfed_v1_pb2 as pb
from hacfed.trajectory import Trajectory
from hacfed.wire.convert import (
    count_submission,
    fill_batch,
    fill_error,
    fill_lab_reply,
    fill_plan,
    fill_receipt,
    fill_refusal,
    fill_report,
    fill_submission,
    fill_trajectory,
    fill_update,
    read_batch,
    read_delivery,
    read_error,
    read_lab_reply,
    read_plan,
    read_receipt,
    read_refusal,
    read_report,
    read_submission,
    read_trajectory,
    read_update,
)
from hacfed.wire.types import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    Delivery,
    ErrorCode,
    ErrorReply,
    LabReply,
    RawEnvelope,
    SubmissionReceipt,
    SubmissionRefusal,
    WireError,
)

# ---- framing --------------------------------------------------------------------------------------


def _check_size(data: object, max_bytes: int) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(ErrorCode.SCHEMA, f"expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise WireError(ErrorCode.SIZE, f"message of {len(data)} bytes exceeds the cap of {max_bytes} bytes")
    return bytes(data)


def _require_canonical(message: Message, raw: bytes, what: str) -> None:
    """Accept only the exact deterministic encoding of what was parsed.

    Unknown fields mean a skewed or tampered sender, and duplicate fields (the last one silently
    wins) could make the signed, hashed bytes say something other than what hacfed acts on; both
    are refused rather than dropped. Re-serializing runs in C: ~10 ms for 700 kB, where walking
    the tree in Python costs ~40x more.
    """
    message.DiscardUnknownFields()
    if message.SerializeToString(deterministic=True) != raw:
        raise WireError(
            ErrorCode.SCHEMA,
            f"{what} carries fields unknown to protocol v{PROTOCOL_VERSION} or is not canonically encoded",
        )


def _encode(body: str, kind: type, fill: Callable[[Any, Any], None], obj: Any) -> bytes:
    if not isinstance(obj, kind):
        raise TypeError(f"encode {body}: expected {kind.__name__}, got {type(obj).__name__}")
    frame = pb.WireMessage(version=PROTOCOL_VERSION)
    try:
        getattr(frame, body).SetInParent()  # an empty batch is still a batch
        fill(getattr(frame, body), obj)
    except (ValueError, TypeError, KeyError) as exc:  # e.g. an int beyond uint64
        raise WireError(ErrorCode.SCHEMA, f"cannot encode {body}: {exc!r}") from exc
    return frame.SerializeToString(deterministic=True)


def _decode(
    body: str, build: Callable[[Any], Any], data: object, max_bytes: int,
    count: Callable[[Any], None] | None = None,
) -> Any:
    """count: checks the parsed message's repeated fields against their caps (raising SIZE) before
    the canonical re-serialization and before anything is built."""
    raw = _check_size(data, max_bytes)
    frame = pb.WireMessage()
    try:
        frame.ParseFromString(raw)
    except DecodeError as exc:
        raise WireError(ErrorCode.SCHEMA, f"not a valid hacfed message: {exc}") from exc
    if frame.version != PROTOCOL_VERSION:
        raise WireError(ErrorCode.VERSION, f"protocol version {frame.version}, this build speaks {PROTOCOL_VERSION}")
    kind = frame.WhichOneof("body")
    if kind != body:
        raise WireError(ErrorCode.SCHEMA, f"expected a {body} message, got {kind or 'an empty frame'}")
    if count is not None:
        count(getattr(frame, body))
    _require_canonical(frame, raw, "message")
    try:
        return build(getattr(frame, body))
    except (ValueError, TypeError) as exc:
        raise WireError(ErrorCode.SCHEMA, f"invalid {body}: {exc}") from exc


# ---- public codecs --------------------------------------------------------------------------------


def encode_round_plan(plan: RoundPlan) -> bytes:
    return _encode("round_plan", RoundPlan, fill_plan, plan)


def decode_round_plan(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> RoundPlan:
    return _decode("round_plan", read_plan, data, max_bytes)


def encode_round_update(update: RoundUpdate) -> bytes:
    return _encode("round_update", RoundUpdate, fill_update, update)


def decode_round_update(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> RoundUpdate:
    return _decode("round_update", read_update, data, max_bytes)


def encode_submission(submission: Submission) -> bytes:
    return _encode("submission", Submission, fill_submission, submission)


def decode_submission(
    data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES, max_trajectories: int | None = None,
) -> Submission:
    """max_trajectories: the most trajectories the receiver takes in one submission (the coordinator:
    a full plan, prompts x G); more, like too many prompt messages or report metrics, is refused
    with SIZE right after parsing, before any trajectory is built."""
    return _decode("submission", read_submission, data, max_bytes, lambda m: count_submission(m, max_trajectories))


def encode_step_report(report: StepReport) -> bytes:
    return _encode("step_report", StepReport, fill_report, report)


def decode_step_report(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> StepReport:
    return _decode("step_report", read_report, data, max_bytes)


def encode_trajectory(trajectory: Trajectory) -> bytes:
    return _encode("trajectory", Trajectory, fill_trajectory, trajectory)


def decode_trajectory(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Trajectory:
    return _decode("trajectory", read_trajectory, data, max_bytes)


def encode_trajectory_batch(trajectories: tuple[Trajectory, ...]) -> bytes:
    batch = tuple(trajectories)
    for t in batch:
        if not isinstance(t, Trajectory):
            raise TypeError(f"encode trajectory_batch: expected Trajectory items, got {type(t).__name__}")
    return _encode("trajectory_batch", tuple, fill_batch, batch)


def decode_trajectory_batch(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[Trajectory, ...]:
    return _decode("trajectory_batch", read_batch, data, max_bytes)


def encode_receipt(receipt: SubmissionReceipt) -> bytes:
    return _encode("receipt", SubmissionReceipt, fill_receipt, receipt)


def decode_receipt(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> SubmissionReceipt:
    return _decode("receipt", read_receipt, data, max_bytes)


def encode_error(error: ErrorReply) -> bytes:
    return _encode("error", ErrorReply, fill_error, error)


def decode_error(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> ErrorReply:
    return _decode("error", read_error, data, max_bytes)


def encode_refusal(refusal: SubmissionRefusal) -> bytes:
    return _encode("refusal", SubmissionRefusal, fill_refusal, refusal)


def decode_refusal(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> SubmissionRefusal:
    return _decode("refusal", read_refusal, data, max_bytes)


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of an int >= 0."""
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def length_delimited(field_number: int, body: bytes) -> bytes:
    """One length-delimited field record (tag, length, bytes), as deterministic serialization writes it."""
    return varint(field_number << 3 | 2) + varint(len(body)) + body


_TAG_1, _TAG_2 = varint(1 << 3 | 2), varint(2 << 3 | 2)
_FRAME_PREFIX = pb.WireMessage(version=PROTOCOL_VERSION).SerializeToString(deterministic=True)


def frame_parts(body: str, parts: Sequence[bytes]) -> list[bytes]:
    """`_encode(body, ...)`'s WireMessage frame around a body already written as `parts` (the
    body's deterministic encoding is their concatenation), as pieces: nothing is copied."""
    number = pb.WireMessage.DESCRIPTOR.fields_by_name[body].number
    return [_FRAME_PREFIX, varint(number << 3 | 2), varint(sum(len(p) for p in parts)), *parts]


def delivery_parts(delivery: Delivery) -> list[bytes]:
    """`encode_delivery(delivery)` as pieces whose concatenation it is: a delivery wraps a round
    update of up to MAX_MESSAGE_BYTES and the coordinator writes one per lab, so it hashes and
    copies the pieces once (`hacfed.envelope.seal_parts`) instead of copying the request through
    protobuf (tests/unit/test_pool_splice.py checks the identity with the generic encoding)."""
    if not isinstance(delivery, Delivery):
        raise TypeError(f"encode delivery: expected Delivery, got {type(delivery).__name__}")
    return delivery_parts_of(delivery.answers, (delivery.request,))


def delivery_parts_of(answers: Sequence[bytes], request_parts: Sequence[bytes]) -> list[bytes]:
    """`delivery_parts(Delivery(answers, b"".join(request_parts)))` without joining the request:
    a lab's sealed round update arrives as the pieces of its envelope (`hacfed.envelope.seal_pieces`)
    and is copied only once, into the delivery's envelope (tests/unit/test_delivery_pieces.py)."""
    answers = Delivery(tuple(answers)).answers  # Delivery's own checks: non-empty bytes, at most MAX_DELIVERY_ITEMS
    for piece in request_parts:
        if not isinstance(piece, bytes):
            raise ValueError(f"Delivery.request must be bytes, got a part of type {type(piece).__name__}")
    parts = [part for a in answers for part in (_TAG_1, varint(len(a)), a)]
    size = sum(map(len, request_parts))
    if size:  # proto3: an empty singular bytes field is not written
        parts += (_TAG_2, varint(size), *request_parts)
    return frame_parts("delivery", parts)


def encode_delivery(delivery: Delivery) -> bytes:
    return b"".join(delivery_parts(delivery))


def decode_delivery(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Delivery:
    return _decode("delivery", read_delivery, data, max_bytes)


def encode_lab_reply(reply: LabReply) -> bytes:
    return _encode("lab_reply", LabReply, fill_lab_reply, reply)


def decode_lab_reply(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> LabReply:
    return _decode("lab_reply", read_lab_reply, data, max_bytes)


def envelope_parts(payload_parts: Sequence[bytes], sig: bytes, key_id: bytes, payload_type: str,
                   version: int = PROTOCOL_VERSION) -> list[bytes]:
    """The deterministic encoding of an Envelope whose payload is the concatenation of
    `payload_parts`, as pieces: the payload (field 1, up to MAX_MESSAGE_BYTES) is never copied
    through protobuf; identical bytes (tests/unit/test_pool_splice.py)."""
    rest = pb.Envelope(sig=sig, key_id=key_id, payload_type=str(payload_type), version=version)
    tail = rest.SerializeToString(deterministic=True)
    for part in payload_parts:
        if not isinstance(part, bytes):
            raise TypeError(f"Envelope.payload must be bytes, got {type(part).__name__}")
    size = sum(len(p) for p in payload_parts)
    if not size:  # proto3: an empty singular bytes field is not written
        return [tail]
    return [_TAG_1, varint(size), *payload_parts, tail]


def encode_envelope(envelope: RawEnvelope) -> bytes:
    return b"".join(envelope_parts((envelope.payload,), envelope.sig, envelope.key_id, envelope.payload_type,
                                   envelope.version))


def decode_envelope(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> RawEnvelope:
    """Structure only (size, parse, version, no unknown fields); hacfed.envelope does the crypto."""
    raw = _check_size(data, max_bytes)
    m = pb.Envelope()
    try:
        m.ParseFromString(raw)
    except DecodeError as exc:
        raise WireError(ErrorCode.SCHEMA, f"not a valid hacfed envelope: {exc}") from exc
    if m.version != PROTOCOL_VERSION:
        raise WireError(ErrorCode.VERSION, f"envelope version {m.version}, this build speaks {PROTOCOL_VERSION}")
    _require_canonical(m, raw, "envelope")
    return RawEnvelope(m.payload, m.sig, m.key_id, m.payload_type, m.version)
