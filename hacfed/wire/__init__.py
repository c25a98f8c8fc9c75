"""The one serde module: hacfed domain types <-> versioned protobuf bytes (style.md rule 6).

    data = encode_submission(submission)          # deterministic bytes, ready to seal
    submission = decode_submission(data)          # validated domain object, or WireError

Every payload travels in a `WireMessage` frame (proto/hacfed_v1.proto) holding the protocol version
and exactly one message, so bytes of one kind can never be decoded as another. Encoding is
deterministic (map keys sorted): the same object always gives the same bytes, which keeps content
hashes stable and makes the receipt of an identical resend byte-identical (security.md S3).

Decoding is the validation boundary (security.md T8, T9, S4), in this order: size cap before
parsing, parse, protocol version, canonical encoding (no unknown or duplicate fields), the expected
message kind, closed enums, required sub-messages and settings present, then the domain
dataclasses' own `__post_init__` checks. Every failure becomes a `WireError` with a closed code, never a protobuf traceback.

No other module imports the generated `*_pb2` code. The local relay service
(`hacfed.v1.ParticipantRelay/Exchange`) carries serialized `Envelope` bytes untouched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, Callable, Mapping

from google.protobuf.message import DecodeError, Message

from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import PlannedPrompt, RoundPlan, RoundUpdate, SamplingParams, StepReport, Submission
from hacfed.proto import hacfed_v1_pb2 as pb
from hacfed.trajectory import LOGP_EPS, ChatMessage, Trajectory

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # per-message cap (security.md T8, S5)
NONCE_BYTES = 16
CONTENT_HASH_BYTES = 32


class ErrorCode(StrEnum):
    """Closed set of codes this layer (wire + envelope) reports; sent as `hacfed-error-code`."""

    SCHEMA = "HACFED-E-SCHEMA"
    SIZE = "HACFED-E-SIZE"
    VERSION = "HACFED-E-VERSION"
    LOGPROB_RANGE = "HACFED-E-LOGPROB-RANGE"
    UNAUTHENTICATED = "HACFED-E-UNAUTHENTICATED"
    SIGNATURE = "HACFED-E-SIGNATURE"
    PAYLOAD_TYPE = "HACFED-E-PAYLOAD-TYPE"


# gRPC status names for each code (security.md §4 conventions: never UNKNOWN or INTERNAL).
GRPC_STATUS: Mapping[ErrorCode, str] = {
    ErrorCode.SCHEMA: "INVALID_ARGUMENT",
    ErrorCode.SIZE: "RESOURCE_EXHAUSTED",
    ErrorCode.VERSION: "FAILED_PRECONDITION",
    ErrorCode.LOGPROB_RANGE: "OUT_OF_RANGE",
    ErrorCode.UNAUTHENTICATED: "UNAUTHENTICATED",
    ErrorCode.SIGNATURE: "UNAUTHENTICATED",
    ErrorCode.PAYLOAD_TYPE: "INVALID_ARGUMENT",
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

    content_hash: the coordinator's sha256 (hex) of the submission; seq: its journal sequence number.
    """

    run_id: str
    round_id: int
    participant_id: str
    accepted_trajectory_ids: tuple[str, ...]
    rejections: tuple[Rejection, ...]
    seq: int
    content_hash: str

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


# ---- enum tables ---------------------------------------------------------------------------------

_ROLE_TO_PB = {"system": pb.ROLE_SYSTEM, "user": pb.ROLE_USER, "assistant": pb.ROLE_ASSISTANT}
_FINISH_TO_PB = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}
_MODE_TO_PB = {"hacpo": pb.HACPO_MODE_HACPO, "naive": pb.HACPO_MODE_NAIVE, "gspo": pb.HACPO_MODE_GSPO}
_ROLE_FROM_PB = {v: k for k, v in _ROLE_TO_PB.items()}
_FINISH_FROM_PB = {v: k for k, v in _FINISH_TO_PB.items()}
_MODE_FROM_PB = {v: k for k, v in _MODE_TO_PB.items()}


def _from_enum(table: Mapping[int, str], value: int, what: str) -> str:
    if value not in table:
        raise WireError(ErrorCode.SCHEMA, f"{what}: unknown or unset enum value {value}")
    return table[value]


def _require(message: Message, name: str, what: str) -> None:
    if not message.HasField(name):
        raise WireError(ErrorCode.SCHEMA, f"{what}.{name} is missing")


# ---- domain -> protobuf (fill a message in place; no copies of large pools) ---------------------


def _fill_chat(m: Any, c: ChatMessage) -> None:
    m.role = _ROLE_TO_PB[c.role]
    m.content = c.content


def _fill_trajectory(m: Any, t: Trajectory) -> None:
    # response_token_ids are local-only and deliberately not written (security.md T11).
    m.trajectory_id, m.prompt_id, m.source_id = t.trajectory_id, t.prompt_id, t.source_id
    m.policy_version = t.policy_version
    for c in t.prompt:
        _fill_chat(m.prompt.add(), c)
    m.response_text = t.response_text
    m.reward = t.reward
    m.source_logp_sum = t.source_logp_sum
    m.source_token_count = t.source_token_count
    m.finish_reason = _FINISH_TO_PB[t.finish_reason]


def _fill_hacpo(m: Any, h: HacpoConfig) -> None:
    for f in fields(HacpoConfig):
        value = getattr(h, f.name)
        setattr(m, f.name, _MODE_TO_PB[value] if f.name == "mode" else value)


def _fill_plan(m: Any, p: RoundPlan) -> None:
    m.SetInParent()  # present even when every field holds its default
    m.run_id, m.round_id, m.group_size, m.evaluate = p.run_id, p.round_id, p.group_size, p.evaluate
    for prompt in p.prompts:
        pm = m.prompts.add()
        pm.prompt_id = prompt.prompt_id
        for c in prompt.messages:
            _fill_chat(pm.messages.add(), c)
    s = p.sampling
    m.sampling.temperature, m.sampling.top_p, m.sampling.max_new_tokens = s.temperature, s.top_p, s.max_new_tokens
    _fill_hacpo(m.hacpo, p.hacpo)


def _fill_update(m: Any, u: RoundUpdate) -> None:
    m.run_id = u.run_id
    if u.pool_round is not None:
        m.pool_round = u.pool_round
    for t in u.pool:
        _fill_trajectory(m.pool.add(), t)
    m.capabilities.update(u.capabilities)
    if u.next_plan is not None:
        _fill_plan(m.next_plan, u.next_plan)
    m.participants.extend(u.participants)
    _fill_hacpo(m.hacpo, u.hacpo)


def _fill_report(m: Any, r: StepReport) -> None:
    m.SetInParent()  # present even when every field holds its default
    m.participant_id, m.round_id = r.participant_id, r.round_id
    m.metrics.update(r.metrics)
    if r.eval_accuracy is not None:
        m.eval_accuracy = r.eval_accuracy


def _fill_submission(m: Any, s: Submission) -> None:
    m.run_id, m.participant_id, m.round_id = s.run_id, s.participant_id, s.round_id
    for t in s.trajectories:
        _fill_trajectory(m.trajectories.add(), t)
    if s.report is not None:
        _fill_report(m.report, s.report)
    m.nonce = bytes.fromhex(s.nonce)
    m.created_at_ms = s.created_at_ms


def _fill_batch(m: Any, batch: tuple[Trajectory, ...]) -> None:
    for t in batch:
        _fill_trajectory(m.trajectories.add(), t)


def _fill_receipt(m: Any, r: SubmissionReceipt) -> None:
    m.run_id, m.round_id, m.participant_id, m.seq = r.run_id, r.round_id, r.participant_id, r.seq
    m.accepted_trajectory_ids.extend(r.accepted_trajectory_ids)
    for rej in r.rejections:
        m.rejections.add(trajectory_id=rej.trajectory_id, code=rej.code, detail=rej.detail)
    m.content_hash = bytes.fromhex(r.content_hash)


def _fill_error(m: Any, e: ErrorReply) -> None:
    m.code, m.message = e.code, e.message


# ---- protobuf -> domain (domain __post_init__ does the semantic checks) -------------------------


def _chat(m: Any) -> ChatMessage:
    return ChatMessage(_from_enum(_ROLE_FROM_PB, m.role, "ChatMessage.role"), m.content)


def _trajectory(m: Any) -> Trajectory:
    lp = m.source_logp_sum
    if not math.isfinite(lp) or lp > LOGP_EPS:
        raise WireError(
            ErrorCode.LOGPROB_RANGE,
            f"trajectory {m.trajectory_id!r}: source_logp_sum must be finite and <= 0, got {lp!r}",
        )
    return Trajectory(
        trajectory_id=m.trajectory_id, prompt_id=m.prompt_id, source_id=m.source_id,
        policy_version=m.policy_version, prompt=tuple(_chat(c) for c in m.prompt),
        response_text=m.response_text, reward=m.reward, source_logp_sum=lp,
        source_token_count=m.source_token_count,
        finish_reason=_from_enum(_FINISH_FROM_PB, m.finish_reason, f"trajectory {m.trajectory_id!r} finish_reason"),
    )


def _hacpo(m: Any) -> HacpoConfig:
    values: dict[str, Any] = {"mode": _from_enum(_MODE_FROM_PB, m.mode, "HacpoConfig.mode")}
    for f in fields(HacpoConfig):
        if f.name != "mode":
            _require(m, f.name, "HacpoConfig")  # a setting every lab must agree on is never defaulted
            values[f.name] = getattr(m, f.name)
    return HacpoConfig(**values)


def _plan(m: Any) -> RoundPlan:
    for name in ("sampling", "hacpo"):
        _require(m, name, "RoundPlan")
    for name in ("temperature", "top_p", "max_new_tokens"):
        _require(m.sampling, name, "SamplingParams")
    return RoundPlan(
        run_id=m.run_id, round_id=m.round_id,
        prompts=tuple(PlannedPrompt(p.prompt_id, tuple(_chat(c) for c in p.messages)) for p in m.prompts),
        group_size=m.group_size,
        sampling=SamplingParams(m.sampling.temperature, m.sampling.top_p, m.sampling.max_new_tokens),
        hacpo=_hacpo(m.hacpo), evaluate=m.evaluate,
    )


def _update(m: Any) -> RoundUpdate:
    _require(m, "hacpo", "RoundUpdate")
    return RoundUpdate(
        run_id=m.run_id,
        pool_round=m.pool_round if m.HasField("pool_round") else None,
        pool=tuple(_trajectory(t) for t in m.pool),
        capabilities=dict(m.capabilities),
        next_plan=_plan(m.next_plan) if m.HasField("next_plan") else None,
        participants=tuple(m.participants),
        hacpo=_hacpo(m.hacpo),
    )


def _report(m: Any) -> StepReport:
    return StepReport(
        participant_id=m.participant_id, round_id=m.round_id, metrics=dict(m.metrics),
        eval_accuracy=m.eval_accuracy if m.HasField("eval_accuracy") else None,
    )


def _submission(m: Any) -> Submission:
    if len(m.nonce) not in (0, NONCE_BYTES):
        raise WireError(ErrorCode.SCHEMA, f"Submission.nonce must be {NONCE_BYTES} bytes, got {len(m.nonce)}")
    return Submission(
        run_id=m.run_id, participant_id=m.participant_id, round_id=m.round_id,
        trajectories=tuple(_trajectory(t) for t in m.trajectories),
        report=_report(m.report) if m.HasField("report") else None,
        nonce=m.nonce.hex(), created_at_ms=m.created_at_ms,
    )


def _batch(m: Any) -> tuple[Trajectory, ...]:
    return tuple(_trajectory(t) for t in m.trajectories)


def _receipt(m: Any) -> SubmissionReceipt:
    return SubmissionReceipt(
        run_id=m.run_id, round_id=m.round_id, participant_id=m.participant_id,
        accepted_trajectory_ids=tuple(m.accepted_trajectory_ids),
        rejections=tuple(Rejection(r.code, r.detail, r.trajectory_id) for r in m.rejections),
        seq=m.seq, content_hash=m.content_hash.hex(),
    )


def _error(m: Any) -> ErrorReply:
    return ErrorReply(m.code, m.message)


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


def _decode(body: str, build: Callable[[Any], Any], data: object, max_bytes: int) -> Any:
    raw = _check_size(data, max_bytes)
    frame = pb.WireMessage()
    try:
        frame.ParseFromString(raw)
    except DecodeError as exc:
        raise WireError(ErrorCode.SCHEMA, f"not a valid hacfed message: {exc}") from exc
    if frame.version != PROTOCOL_VERSION:
        raise WireError(ErrorCode.VERSION, f"protocol version {frame.version}, this build speaks {PROTOCOL_VERSION}")
    _require_canonical(frame, raw, "message")
    kind = frame.WhichOneof("body")
    if kind != body:
        raise WireError(ErrorCode.SCHEMA, f"expected a {body} message, got {kind or 'an empty frame'}")
    try:
        return build(getattr(frame, body))
    except (ValueError, TypeError) as exc:
        raise WireError(ErrorCode.SCHEMA, f"invalid {body}: {exc}") from exc


# ---- public codecs --------------------------------------------------------------------------------


def encode_round_plan(plan: RoundPlan) -> bytes:
    return _encode("round_plan", RoundPlan, _fill_plan, plan)


def decode_round_plan(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> RoundPlan:
    return _decode("round_plan", _plan, data, max_bytes)


def encode_round_update(update: RoundUpdate) -> bytes:
    return _encode("round_update", RoundUpdate, _fill_update, update)


def decode_round_update(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> RoundUpdate:
    return _decode("round_update", _update, data, max_bytes)


def encode_submission(submission: Submission) -> bytes:
    return _encode("submission", Submission, _fill_submission, submission)


def decode_submission(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Submission:
    return _decode("submission", _submission, data, max_bytes)


def encode_step_report(report: StepReport) -> bytes:
    return _encode("step_report", StepReport, _fill_report, report)


def decode_step_report(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> StepReport:
    return _decode("step_report", _report, data, max_bytes)


def encode_trajectory(trajectory: Trajectory) -> bytes:
    return _encode("trajectory", Trajectory, _fill_trajectory, trajectory)


def decode_trajectory(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Trajectory:
    return _decode("trajectory", _trajectory, data, max_bytes)


def encode_trajectory_batch(trajectories: tuple[Trajectory, ...]) -> bytes:
    batch = tuple(trajectories)
    for t in batch:
        if not isinstance(t, Trajectory):
            raise TypeError(f"encode trajectory_batch: expected Trajectory items, got {type(t).__name__}")
    return _encode("trajectory_batch", tuple, _fill_batch, batch)


def decode_trajectory_batch(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[Trajectory, ...]:
    return _decode("trajectory_batch", _batch, data, max_bytes)


def encode_receipt(receipt: SubmissionReceipt) -> bytes:
    return _encode("receipt", SubmissionReceipt, _fill_receipt, receipt)


def decode_receipt(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> SubmissionReceipt:
    return _decode("receipt", _receipt, data, max_bytes)


def encode_error(error: ErrorReply) -> bytes:
    return _encode("error", ErrorReply, _fill_error, error)


def decode_error(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> ErrorReply:
    return _decode("error", _error, data, max_bytes)


def encode_envelope(envelope: RawEnvelope) -> bytes:
    m = pb.Envelope(
        payload=envelope.payload, sig=envelope.sig, key_id=envelope.key_id,
        payload_type=str(envelope.payload_type), version=envelope.version,
    )
    return m.SerializeToString(deterministic=True)


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

