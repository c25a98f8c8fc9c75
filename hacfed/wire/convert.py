"""Domain dataclasses <-> protobuf messages of proto/hacfed_v1.proto, field by field.

Shared by both sides, inside the `hacfed.wire` family (the only modules that import generated
`*_pb2` code). `fill_*(m, obj)` writes a domain object into a protobuf message in place (no copies
of large pools); `read_*(m)` builds the domain object back, checking closed enums and required
sub-messages, and leaves the semantic checks to the dataclasses' own `__post_init__`. A repeated
field a peer could blow up (a prompt's messages, a report's metrics) is counted on the protobuf
message before any entry of it is built (`_check_count`); `count_submission` counts all of a
submission's at once, right after parsing. The trajectories of one message (a submission, a
pool, a batch) that carry equal prompts share one prompt tuple, built and checked once
(`_SharedPrompts`). Framing, size and canonical-encoding checks are `hacfed.wire.framing`.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from dataclasses import fields
from typing import Any, Iterator, Mapping

from google.protobuf.message import Message

from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import PlannedPrompt, RoundPlan, RoundUpdate, SamplingParams, StepReport, Submission
from hacfed.proto import hacfed_v1_pb2 as pb
from hacfed.trajectory import LOGP_EPS, ChatMessage, Trajectory
from hacfed.wire.types import (
    MAX_PROMPT_MESSAGES,
    MAX_REPORT_METRICS,
    NONCE_BYTES,
    Delivery,
    ErrorCode,
    ErrorReply,
    LabReply,
    Rejection,
    SubmissionReceipt,
    SubmissionRefusal,
    WireError,
)

# ---- enum tables ---------------------------------------------------------------------------------

_ROLE_TO_PB = {"system": pb.ROLE_SYSTEM, "user": pb.ROLE_USER, "assistant": pb.ROLE_ASSISTANT}
_FINISH_TO_PB = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}
_MODE_TO_PB = {
    "hacpo": pb.HACPO_MODE_HACPO, "xhacpo": pb.HACPO_MODE_XHACPO, "naive": pb.HACPO_MODE_NAIVE,
    "sapo": pb.HACPO_MODE_SAPO, "gspo": pb.HACPO_MODE_GSPO, "grpo": pb.HACPO_MODE_GRPO,
}
# HacpoConfig's string-valued settings and their protobuf enums (0 = unspecified: never accepted).
_ENUM_FIELDS_TO_PB: dict[str, dict[str, int]] = {
    "mode": _MODE_TO_PB,
    "cross_ratio_unit": {"token": pb.CROSS_RATIO_UNIT_TOKEN, "byte": pb.CROSS_RATIO_UNIT_BYTE},
    "cross_clip_style": {"hard": pb.CROSS_CLIP_STYLE_HARD, "pessimistic": pb.CROSS_CLIP_STYLE_PESSIMISTIC},
    "cross_negatives": {"learn": pb.CROSS_NEGATIVES_LEARN, "skip": pb.CROSS_NEGATIVES_SKIP},
    "guide_hint": {"response": pb.GUIDE_HINT_RESPONSE, "answer": pb.GUIDE_HINT_ANSWER},
    "guide_context": {"plain": pb.GUIDE_CONTEXT_PLAIN, "hinted": pb.GUIDE_CONTEXT_HINTED},
    "partner_use": {"gradient": pb.PARTNER_USE_GRADIENT, "context": pb.PARTNER_USE_CONTEXT},
}
_ANSWER_KEYS_TO_PB = {"public": pb.ANSWER_KEYS_PUBLIC, "coordinator": pb.ANSWER_KEYS_COORDINATOR}
_ANSWER_KEYS_FROM_PB = {v: k for k, v in _ANSWER_KEYS_TO_PB.items()}
_ENUM_FIELDS_FROM_PB = {name: {v: k for k, v in table.items()} for name, table in _ENUM_FIELDS_TO_PB.items()}
_ROLE_FROM_PB = {v: k for k, v in _ROLE_TO_PB.items()}
_FINISH_FROM_PB = {v: k for k, v in _FINISH_TO_PB.items()}


def _from_enum(table: Mapping[int, str], value: int, what: str) -> str:
    if value not in table:
        raise WireError(ErrorCode.SCHEMA, f"{what}: unknown or unset enum value {value}")
    return table[value]


def _require(message: Message, name: str, what: str) -> None:
    if not message.HasField(name):
        raise WireError(ErrorCode.SCHEMA, f"{what}.{name} is missing")


def _check_count(count: int, cap: int | None, what: str) -> None:
    """A repeated field's length on the parsed message, before any of its entries is built: 10^5
    entries fit in a few MiB and would cost seconds of Python objects (security.md S4)."""
    if cap is not None and count > cap:
        raise WireError(ErrorCode.SIZE, f"{what} holds {count} entries, more than the {cap} allowed")


# ---- domain -> protobuf (fill a message in place; no copies of large pools) ---------------------


def fill_chat(m: Any, c: ChatMessage) -> None:
    m.role = _ROLE_TO_PB[c.role]
    m.content = c.content


def fill_trajectory(m: Any, t: Trajectory) -> None:
    # response_token_ids are local-only and deliberately not written (security.md T11).
    fill_trajectory_head(m, t)
    for c in t.prompt:
        fill_chat(m.prompt.add(), c)
    fill_trajectory_tail(m, t)


def fill_trajectory_head(m: Any, t: Trajectory) -> None:
    """The fields numbered before the prompt (`hacfed.wire.pool_splice` encodes the prompt apart)."""
    m.trajectory_id, m.prompt_id, m.source_id = t.trajectory_id, t.prompt_id, t.source_id
    m.policy_version = t.policy_version


def fill_trajectory_tail(m: Any, t: Trajectory) -> None:
    """The fields numbered after the prompt."""
    m.response_text = t.response_text
    m.reward = t.reward
    m.source_logp_sum = t.source_logp_sum
    m.source_token_count = t.source_token_count
    m.finish_reason = _FINISH_TO_PB[t.finish_reason]


def fill_hacpo(m: Any, h: HacpoConfig) -> None:
    for f in fields(HacpoConfig):
        value = getattr(h, f.name)
        table = _ENUM_FIELDS_TO_PB.get(f.name)
        setattr(m, f.name, table[value] if table is not None else value)


def fill_plan(m: Any, p: RoundPlan) -> None:
    m.SetInParent()  # present even when every field holds its default
    m.run_id, m.round_id, m.group_size, m.evaluate = p.run_id, p.round_id, p.group_size, p.evaluate
    m.answer_keys = _ANSWER_KEYS_TO_PB[p.answer_keys]
    for prompt in p.prompts:
        pm = m.prompts.add()
        pm.prompt_id = prompt.prompt_id
        for c in prompt.messages:
            fill_chat(pm.messages.add(), c)
    s = p.sampling
    m.sampling.temperature, m.sampling.top_p, m.sampling.max_new_tokens = s.temperature, s.top_p, s.max_new_tokens
    fill_hacpo(m.hacpo, p.hacpo)


def fill_update(m: Any, u: RoundUpdate) -> None:
    m.run_id = u.run_id
    if u.pool_round is not None:
        m.pool_round = u.pool_round
    for t in u.pool:
        fill_trajectory(m.pool.add(), t)
    m.capabilities.update(u.capabilities)
    if u.next_plan is not None:
        fill_plan(m.next_plan, u.next_plan)
    m.participants.extend(u.participants)
    fill_hacpo(m.hacpo, u.hacpo)


def fill_report(m: Any, r: StepReport) -> None:
    m.SetInParent()  # present even when every field holds its default
    m.participant_id, m.round_id = r.participant_id, r.round_id
    m.metrics.update(r.metrics)
    if r.eval_accuracy is not None:
        m.eval_accuracy = r.eval_accuracy


def fill_submission(m: Any, s: Submission) -> None:
    m.run_id, m.participant_id, m.round_id = s.run_id, s.participant_id, s.round_id
    for t in s.trajectories:
        fill_trajectory(m.trajectories.add(), t)
    if s.report is not None:
        fill_report(m.report, s.report)
    m.nonce = bytes.fromhex(s.nonce)
    m.created_at_ms = s.created_at_ms


def fill_batch(m: Any, batch: tuple[Trajectory, ...]) -> None:
    for t in batch:
        fill_trajectory(m.trajectories.add(), t)


def fill_receipt(m: Any, r: SubmissionReceipt) -> None:
    m.run_id, m.round_id, m.participant_id, m.seq = r.run_id, r.round_id, r.participant_id, r.seq
    m.accepted_trajectory_ids.extend(r.accepted_trajectory_ids)
    for rej in r.rejections:
        m.rejections.add(trajectory_id=rej.trajectory_id, code=rej.code, detail=rej.detail)
    m.content_hash = bytes.fromhex(r.content_hash)
    m.nonce = bytes.fromhex(r.nonce)


def fill_refusal(m: Any, r: SubmissionRefusal) -> None:
    m.SetInParent()
    m.run_id, m.round_id, m.participant_id, m.nonce = r.run_id, r.round_id, r.participant_id, bytes.fromhex(r.nonce)
    m.code, m.message, m.retry_after_ms = r.code, r.message, r.retry_after_ms


def fill_delivery(m: Any, d: Delivery) -> None:
    m.SetInParent()
    m.answers.extend(d.answers)
    m.request = d.request


def fill_lab_reply(m: Any, r: LabReply) -> None:
    m.SetInParent()
    m.submission = r.submission
    m.resends.extend(r.resends)


def fill_error(m: Any, e: ErrorReply) -> None:
    m.code, m.message = e.code, e.message


# ---- protobuf -> domain (domain __post_init__ does the semantic checks) -------------------------


def read_chat(m: Any) -> ChatMessage:
    return ChatMessage(_from_enum(_ROLE_FROM_PB, m.role, "ChatMessage.role"), m.content)


def read_trajectory(m: Any) -> Trajectory:
    # The error texts are only formatted for a refusal: this runs once per sample.
    prompt = m.prompt
    if len(prompt) > MAX_PROMPT_MESSAGES:
        _check_count(len(prompt), MAX_PROMPT_MESSAGES, f"trajectory {m.trajectory_id!r} prompt")
    lp = m.source_logp_sum
    if not math.isfinite(lp) or lp > LOGP_EPS:
        raise WireError(
            ErrorCode.LOGPROB_RANGE,
            f"trajectory {m.trajectory_id!r}: source_logp_sum must be finite and <= 0, got {lp!r}",
        )
    messages = _read_prompt(prompt)
    finish = _FINISH_FROM_PB.get(m.finish_reason)
    if finish is None:
        finish = _from_enum(_FINISH_FROM_PB, m.finish_reason, f"trajectory {m.trajectory_id!r} finish_reason")
    return Trajectory(  # positional: the fields in declaration order
        m.trajectory_id, m.prompt_id, m.source_id, m.policy_version, messages, m.response_text,
        m.reward, lp, m.source_token_count, finish,
    )


class _SharedPrompts(threading.local):
    """The prompts read so far while one message's trajectories are built (None outside one):
    (role, content) pairs -> the prompt tuple already built for them. A group's G samples, and in a
    pool every lab's samples of a prompt, carry the same prompt; it is built (and checked) once and
    shared, as an equal immutable tuple. It lives only while that message is read."""

    table: dict[tuple[tuple[int, str], ...], tuple[ChatMessage, ...]] | None = None


_SHARED = _SharedPrompts()


@contextmanager
def _sharing_prompts() -> Iterator[None]:
    outer = _SHARED.table
    _SHARED.table = {} if outer is None else outer
    try:
        yield
    finally:
        _SHARED.table = outer


def _read_prompt(messages: Any) -> tuple[ChatMessage, ...]:
    table = _SHARED.table
    if table is None:
        return tuple(read_chat(c) for c in messages)
    key = tuple([(c.role, c.content) for c in messages])
    prompt = table.get(key)
    if prompt is None:
        prompt = table[key] = tuple(read_chat(c) for c in messages)
    return prompt


def read_hacpo(m: Any) -> HacpoConfig:
    values: dict[str, Any] = {}
    for f in fields(HacpoConfig):
        table = _ENUM_FIELDS_FROM_PB.get(f.name)
        if table is not None:
            values[f.name] = _from_enum(table, getattr(m, f.name), f"HacpoConfig.{f.name}")
        else:
            _require(m, f.name, "HacpoConfig")  # a setting every lab must agree on is never defaulted
            values[f.name] = getattr(m, f.name)
    return HacpoConfig(**values)


def read_plan(m: Any) -> RoundPlan:
    for name in ("sampling", "hacpo"):
        _require(m, name, "RoundPlan")
    for name in ("temperature", "top_p", "max_new_tokens"):
        _require(m.sampling, name, "SamplingParams")
    return RoundPlan(
        run_id=m.run_id, round_id=m.round_id,
        prompts=tuple(PlannedPrompt(p.prompt_id, tuple(read_chat(c) for c in p.messages)) for p in m.prompts),
        group_size=m.group_size,
        sampling=SamplingParams(m.sampling.temperature, m.sampling.top_p, m.sampling.max_new_tokens),
        hacpo=read_hacpo(m.hacpo), evaluate=m.evaluate,
        answer_keys=_from_enum(_ANSWER_KEYS_FROM_PB, m.answer_keys, "RoundPlan.answer_keys"),
    )


def read_update(m: Any) -> RoundUpdate:
    _require(m, "hacpo", "RoundUpdate")
    return RoundUpdate(
        run_id=m.run_id,
        pool_round=m.pool_round if m.HasField("pool_round") else None,
        pool=_read_trajectories(m.pool),
        capabilities=dict(m.capabilities),
        next_plan=read_plan(m.next_plan) if m.HasField("next_plan") else None,
        participants=tuple(m.participants),
        hacpo=read_hacpo(m.hacpo),
    )


def read_report(m: Any) -> StepReport:
    _check_count(len(m.metrics), MAX_REPORT_METRICS, "StepReport.metrics")
    return StepReport(
        participant_id=m.participant_id, round_id=m.round_id, metrics=dict(m.metrics),
        eval_accuracy=m.eval_accuracy if m.HasField("eval_accuracy") else None,
    )


def count_submission(m: Any, max_trajectories: int | None = None) -> None:
    """Every repeated field of a parsed submission against its cap, before anything else costly: the
    canonical re-serialization of 10^5 metrics alone takes longer than parsing them. max_trajectories:
    the most the receiver takes in one submission (None: no cap on their number)."""
    _check_count(len(m.trajectories), max_trajectories, "Submission.trajectories")
    for t in m.trajectories:
        if len(t.prompt) > MAX_PROMPT_MESSAGES:  # the message is only formatted for a refusal
            _check_count(len(t.prompt), MAX_PROMPT_MESSAGES, f"trajectory {t.trajectory_id!r} prompt")
    if m.HasField("report"):
        _check_count(len(m.report.metrics), MAX_REPORT_METRICS, "StepReport.metrics")


def read_submission(m: Any) -> Submission:
    if len(m.nonce) not in (0, NONCE_BYTES):
        raise WireError(ErrorCode.SCHEMA, f"Submission.nonce must be {NONCE_BYTES} bytes, got {len(m.nonce)}")
    return Submission(
        run_id=m.run_id, participant_id=m.participant_id, round_id=m.round_id,
        trajectories=_read_trajectories(m.trajectories),
        report=read_report(m.report) if m.HasField("report") else None,
        nonce=m.nonce.hex(), created_at_ms=m.created_at_ms,
    )


def read_batch(m: Any) -> tuple[Trajectory, ...]:
    return _read_trajectories(m.trajectories)


def _read_trajectories(messages: Any) -> tuple[Trajectory, ...]:
    """`read_trajectory` of each, sharing equal prompts (`_SharedPrompts`)."""
    with _sharing_prompts():
        return tuple([read_trajectory(t) for t in messages])


def read_receipt(m: Any) -> SubmissionReceipt:
    return SubmissionReceipt(
        run_id=m.run_id, round_id=m.round_id, participant_id=m.participant_id,
        accepted_trajectory_ids=tuple(m.accepted_trajectory_ids),
        rejections=tuple(Rejection(r.code, r.detail, r.trajectory_id) for r in m.rejections),
        seq=m.seq, content_hash=m.content_hash.hex(), nonce=_nonce(m.nonce, "SubmissionReceipt"),
    )


def read_refusal(m: Any) -> SubmissionRefusal:
    return SubmissionRefusal(
        run_id=m.run_id, round_id=m.round_id, participant_id=m.participant_id,
        nonce=_nonce(m.nonce, "SubmissionRefusal"), code=m.code, message=m.message, retry_after_ms=m.retry_after_ms,
    )


def read_delivery(m: Any) -> Delivery:
    return Delivery(answers=tuple(m.answers), request=m.request)


def read_lab_reply(m: Any) -> LabReply:
    return LabReply(submission=m.submission, resends=tuple(m.resends))


def _nonce(raw: bytes, what: str) -> str:
    if len(raw) not in (0, NONCE_BYTES):
        raise WireError(ErrorCode.SCHEMA, f"{what}.nonce must be {NONCE_BYTES} bytes, got {len(raw)}")
    return raw.hex()


def read_error(m: Any) -> ErrorReply:
    return ErrorReply(m.code, m.message)
