"""The wire layer's own vocabulary: protocol constants, error codes, payload types, reply records.

Shared by both sides (the coordinator's driver and a lab's participant service speak it); part of
the `hacfed.wire` family, without protobuf: the conversions live in `hacfed.wire.convert`, the
framing and checks in `hacfed.wire.framing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Mapping

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # per-message cap (security.md T8, S5)
NONCE_BYTES = 16
CONTENT_HASH_BYTES = 32
MAX_DELIVERY_ITEMS = 64  # answers in one Delivery, resends in one LabReply: the rest waits its turn
# Repeated fields a peer could make huge within the byte cap: each is counted on the parsed message,
# before any of its entries is built (security.md S4). A planned prompt holds one or two messages, a
# lab's StepReport a few metrics.
MAX_PROMPT_MESSAGES = 64  # chat messages in one trajectory's prompt
MAX_REPORT_METRICS = 256  # metrics in one StepReport


class ErrorCode(StrEnum):
    """Closed set of codes this layer (wire + envelope) reports; sent as `hacfed-error-code`."""

    SCHEMA = "HACFED-E-SCHEMA"
    SIZE = "HACFED-E-SIZE"
    VERSION = "HACFED-E-VERSION"
    LOGPROB_RANGE = "HACFED-E-LOGPROB-RANGE"
    UNAUTHENTICATED = "HACFED-E-UNAUTHENTICATED"
    SIGNATURE = "HACFED-E-SIGNATURE"
    PAYLOAD_TYPE = "HACFED-E-PAYLOAD-TYPE"
    IDENTITY_MISMATCH = "HACFED-E-IDENTITY-MISMATCH"  # signed by one participant, claimed by another


# gRPC status names for each code (security.md "How a refusal reaches a lab": never UNKNOWN or INTERNAL).
GRPC_STATUS: Mapping[ErrorCode, str] = {
    ErrorCode.SCHEMA: "INVALID_ARGUMENT",
    ErrorCode.SIZE: "RESOURCE_EXHAUSTED",
    ErrorCode.VERSION: "FAILED_PRECONDITION",
    ErrorCode.LOGPROB_RANGE: "OUT_OF_RANGE",
    ErrorCode.UNAUTHENTICATED: "UNAUTHENTICATED",
    ErrorCode.SIGNATURE: "UNAUTHENTICATED",
    ErrorCode.PAYLOAD_TYPE: "INVALID_ARGUMENT",
    ErrorCode.IDENTITY_MISMATCH: "PERMISSION_DENIED",
}


class WireError(Exception):
    """Bytes from a peer that hacfed refuses; `code` is an `ErrorCode`, `message` says why."""

    def __init__(self, code: str, message: str) -> None:
        self.code = ErrorCode(code)
        self.message = message
        super().__init__(f"{self.code}: {message}")


class PayloadType(StrEnum):
    """What an envelope carries (signed with it): the protobuf full name of the message."""

    ROUND_PLAN = "hacfed.v1.RoundPlan"
    ROUND_UPDATE = "hacfed.v1.RoundUpdate"
    SUBMISSION = "hacfed.v1.Submission"
    STEP_REPORT = "hacfed.v1.StepReport"
    TRAJECTORY = "hacfed.v1.Trajectory"
    TRAJECTORY_BATCH = "hacfed.v1.TrajectoryBatch"
    RECEIPT = "hacfed.v1.SubmissionReceipt"
    ERROR = "hacfed.v1.ErrorReply"
    REFUSAL = "hacfed.v1.SubmissionRefusal"
    DELIVERY = "hacfed.v1.Delivery"
    LAB_REPLY = "hacfed.v1.LabReply"


# ---- domain types that exist only as replies (receipts, errors) and the raw envelope -------------


def _is_code(code: object) -> bool:
    return isinstance(code, str) and code.startswith("HACFED-E-") and len(code) > len("HACFED-E-")


@dataclass(frozen=True)
class Rejection:
    """Why one trajectory (or, with trajectory_id "", the whole submission) was refused."""

    code: str
    detail: str
    trajectory_id: str = ""

    def __post_init__(self) -> None:
        if not _is_code(self.code):
            raise ValueError(f"Rejection.code must look like HACFED-E-..., got {self.code!r}")


@dataclass(frozen=True)
class SubmissionReceipt:
    """The coordinator's acknowledgement, sent only once the submission is durable (security.md 3.3).

    content_hash: the coordinator's sha256 (hex) of the submission; seq: its journal sequence number;
    nonce: the submission's nonce (hex, empty for a submission without one).
    """

    run_id: str
    round_id: int
    participant_id: str
    accepted_trajectory_ids: tuple[str, ...]
    rejections: tuple[Rejection, ...]
    seq: int
    content_hash: str
    nonce: str = ""

    def __post_init__(self) -> None:
        for name in ("run_id", "participant_id"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"SubmissionReceipt.{name} must be a non-empty string, got {getattr(self, name)!r}")
        for name in ("round_id", "seq"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"SubmissionReceipt.{name} must be an int >= 0, got {value!r}")
        h = self.content_hash
        if not (isinstance(h, str) and len(h) == 2 * CONTENT_HASH_BYTES and all(c in "0123456789abcdef" for c in h)):
            raise ValueError(f"SubmissionReceipt.content_hash must be 64 lowercase hex chars, got {h!r}")
        _check_nonce(self.nonce, "SubmissionReceipt")


@dataclass(frozen=True)
class SubmissionRefusal:
    """The coordinator's answer to a submission it refused as a whole: the code says why.
    round_id / nonce: those of the refused submission when it could be read (else 0 / "").
    retry_after_ms > 0: the same submission may pass later (a rate limit or a round quota)."""

    run_id: str
    round_id: int
    participant_id: str
    nonce: str
    code: str
    message: str
    retry_after_ms: int = 0

    def __post_init__(self) -> None:
        if not _is_code(self.code):
            raise ValueError(f"SubmissionRefusal.code must look like HACFED-E-..., got {self.code!r}")
        for name in ("round_id", "retry_after_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"SubmissionRefusal.{name} must be an int >= 0, got {value!r}")
        _check_nonce(self.nonce, "SubmissionRefusal")


@dataclass(frozen=True)
class Delivery:
    """Coordinator -> participant: signed answers to earlier submissions (receipt / refusal
    envelopes) and the exchange's signed request envelope (b"": answers only)."""

    answers: tuple[bytes, ...]
    request: bytes = b""

    def __post_init__(self) -> None:
        _check_blobs(self.answers, "Delivery.answers")
        if not isinstance(self.request, bytes):
            raise ValueError(f"Delivery.request must be bytes, got {type(self.request).__name__}")


@dataclass(frozen=True)
class LabReply:
    """Participant -> coordinator: the signed submission answering the request (b"": none) and the
    signed, still unacknowledged submissions of its outbox, resent byte for byte."""

    submission: bytes = b""
    resends: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        _check_blobs(self.resends, "LabReply.resends")
        if not isinstance(self.submission, bytes):
            raise ValueError(f"LabReply.submission must be bytes, got {type(self.submission).__name__}")


def _check_nonce(nonce: object, what: str) -> None:
    hex_digits = "0123456789abcdef"
    if not (isinstance(nonce, str) and len(nonce) in (0, 2 * NONCE_BYTES) and all(c in hex_digits for c in nonce)):
        raise ValueError(f"{what}.nonce must be empty or {2 * NONCE_BYTES} lowercase hex chars, got {nonce!r}")


def _check_blobs(items: object, what: str) -> None:
    if not isinstance(items, tuple) or not all(isinstance(x, bytes) and x for x in items):
        raise ValueError(f"{what} must be a tuple of non-empty bytes")
    if len(items) > MAX_DELIVERY_ITEMS:
        raise ValueError(f"{what} holds {len(items)} items > {MAX_DELIVERY_ITEMS}")


@dataclass(frozen=True)
class ErrorReply:
    code: str
    message: str

    def __post_init__(self) -> None:
        if not _is_code(self.code):
            raise ValueError(f"ErrorReply.code must look like HACFED-E-..., got {self.code!r}")


@dataclass(frozen=True)
class RawEnvelope:
    """The envelope's fields as bytes; hacfed.envelope signs and verifies them."""

    payload: bytes
    sig: bytes
    key_id: bytes
    payload_type: str
    version: int = PROTOCOL_VERSION
