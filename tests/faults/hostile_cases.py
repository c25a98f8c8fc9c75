"""The hostile corpus: what a lab (or whoever holds its node or key) can put in its reply, by kind of attack.

Each `Case` builds its attack from the lab's `Ctx` and names the codes its answers may carry
(docs/security.md, "The hostile corpus"); `EDGES` are valid edge values that must be accepted like
an honest submission. The tests that run the corpus: test_hostile_corpus.py (the round driver in
process) and test_hostile_server.py (a real hacfed-server).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

from hacfed.envelope import DOMAIN_UPDATE
from hacfed.proto import hacfed_v1_pb2 as pb  # only to craft hostile frames
from hacfed.trajectory import ChatMessage, Trajectory
from hacfed.wire import PayloadType, RawEnvelope, decode_envelope, encode_envelope, encode_submission
from tests.faults.hostile_lab import Attack, Case, Ctx, E, W, items, outer
from tests.unit.test_coordinator_fakes import TASK

# ---- how the cases build their bytes ---------------------------------------------------------------


def _first(ctx: Ctx, **changes: object) -> list[Trajectory]:
    out = ctx.trajectories()
    out[0] = dataclasses.replace(out[0], **changes)
    return out


def _edit_first(**fields: object) -> Callable[[pb.Submission], None]:
    def edit(m: pb.Submission) -> None:
        for name, value in fields.items():
            setattr(m.trajectories[0], name, value)
    return edit


def _wrong_sample(ctx: Ctx) -> int:
    """Index of the first sample whose honest reward is 0 (scripted groups: right, then wrong)."""
    return next(i for i, t in enumerate(ctx.trajectories()) if t.reward == 0.0)


def _nested(depth: int) -> bytes:
    """A frame (version 1) followed by `depth` nested groups of an unknown field: the parser's
    recursion, not any length, is what this attacks."""
    return b"\x08\x01" + b"\xfb\x07" * depth + b"\xfc\x07" * depth


def _flip(data: bytes, index: int, bit: int = 0) -> bytes:
    return data[:index] + bytes([data[index] ^ (1 << bit)]) + data[index + 1:]


def _half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _frame_version_2(ctx: Ctx) -> bytes:
    frame = ctx.frame()
    frame.version = 2
    return ctx.seal(frame.SerializeToString(deterministic=True))


def _outer_sig_flipped(ctx: Ctx) -> bytes:
    env = decode_envelope(ctx.reply((ctx.sealed(),)))
    return encode_envelope(dataclasses.replace(env, sig=_flip(env.sig, 17, 3)))


def _outer_payload_flipped(ctx: Ctx) -> bytes:
    env = decode_envelope(ctx.reply((ctx.sealed(),)))
    return encode_envelope(dataclasses.replace(env, payload=_flip(env.payload, len(env.payload) // 2, 5)))


def _inner(ctx: Ctx, change: Callable[[RawEnvelope], RawEnvelope]) -> bytes:
    return encode_envelope(change(decode_envelope(ctx.sealed())))


def many_trajectories(ctx: Ctx, count: int) -> bytes:
    frame = ctx.frame(ctx.submission(ctx.trajectories()[:1]))
    one = frame.submission.trajectories[0]
    for _ in range(count - 1):
        frame.submission.trajectories.add().CopyFrom(one)
    return ctx.seal(frame.SerializeToString(deterministic=True))


def _many_messages(ctx: Ctx, count: int) -> bytes:
    frame = ctx.frame()
    prompt = frame.submission.trajectories[0].prompt
    for _ in range(count - len(prompt)):
        prompt.add(role=pb.ROLE_USER, content="q")
    return ctx.seal(frame.SerializeToString(deterministic=True))


def _many_metrics(ctx: Ctx, count: int) -> bytes:
    sub = ctx.submission([])
    frame = ctx.frame(sub)
    frame.submission.report.metrics.update({f"m{i}": 1.0 for i in range(count)})
    return ctx.seal(frame.SerializeToString(deterministic=True))


def _many_resends(ctx: Ctx, count: int) -> bytes:
    frame = pb.WireMessage(version=1)
    frame.lab_reply.submission = ctx.sealed()
    frame.lab_reply.resends.extend([b"x"] * count)
    return ctx.seal(frame.SerializeToString(deterministic=True), PayloadType.LAB_REPLY)


def _flood(ctx: Ctx, count: int) -> Attack:
    """`count` distinct signed submissions in one reply (another run's, so none is recorded)."""
    return Attack(tuple(ctx.sealed(ctx.submission(run_id="other-run")) for _ in range(count)))


# ---- the corpus -------------------------------------------------------------------------------------


G_REJ = frozenset({E.GROUP_REJECTED.value})  # a bad sample's valid siblings
BIG_TEXT = 10 * 1024 * 1024

CORPUS: list[Case] = [
    # -- log-prob claims (T3, S7)
    Case("logp-nan", items(lambda c: c.mutated(_edit_first(source_logp_sum=math.nan))), W.LOGPROB_RANGE),
    Case("logp-plus-inf", items(lambda c: c.mutated(_edit_first(source_logp_sum=math.inf))), W.LOGPROB_RANGE),
    Case("logp-minus-inf", items(lambda c: c.mutated(_edit_first(source_logp_sum=-math.inf))), W.LOGPROB_RANGE),
    Case("logp-positive", items(lambda c: c.mutated(_edit_first(source_logp_sum=0.5))), W.LOGPROB_RANGE),
    Case("logp-just-above-eps", items(lambda c: c.mutated(_edit_first(source_logp_sum=1e-3))), W.LOGPROB_RANGE),
    Case("logp-mean-below-min", items(lambda c: c.sealed(c.submission(_first(c, source_logp_sum=-1e6)))),
         E.LOGPROB_RANGE, G_REJ, early=False),
    Case("token-count-beyond-plan", items(lambda c: c.sealed(c.submission(_first(
        c, source_token_count=10**6, source_logp_sum=-1.0)))), E.LOGPROB_RANGE, G_REJ, early=False),
    Case("token-count-uint32-max", items(lambda c: c.mutated(_edit_first(source_token_count=2**32 - 1))),
         E.LOGPROB_RANGE, G_REJ, early=False),
    Case("zero-tokens-with-logp", items(lambda c: c.mutated(_edit_first(source_token_count=0, source_logp_sum=-1.0))),
         W.SCHEMA),
    # -- rewards (T1, S6)
    Case("reward-above-one", items(lambda c: c.mutated(_edit_first(reward=1.5))), W.SCHEMA),
    Case("reward-negative", items(lambda c: c.mutated(_edit_first(reward=-1.0))), W.SCHEMA),
    Case("reward-nan", items(lambda c: c.mutated(_edit_first(reward=math.nan))), W.SCHEMA),
    Case("reward-inf", items(lambda c: c.mutated(_edit_first(reward=math.inf))), W.SCHEMA),
    Case("reward-falsified", items(lambda c: c.sealed(c.submission(
        [dataclasses.replace(t, reward=1.0) if i == _wrong_sample(c) else t for i, t in enumerate(c.trajectories())]))),
         E.REWARD_MISMATCH, G_REJ, early=False),
    # -- texts
    Case("empty-text-cut-by-length", items(lambda c: c.sealed(c.submission(_first(
        c, response_text="", source_token_count=0, source_logp_sum=0.0, finish_reason="length")))),
         E.SCHEMA, G_REJ, early=False),
    Case("ten-megabyte-text", items(lambda c: c.sealed(c.submission(_first(c, response_text="7" * BIG_TEXT)))),
         E.SIZE, G_REJ, early=False),
    Case("invalid-utf8-text", items(lambda c: c.with_raw_bytes(
        c.submission(_first(c, response_text="XMARKERX")), "XMARKERX", b"\xff\xfe\xfd\xfc\xc3\x28\xa0\xa1")),
         W.SCHEMA),
    Case("utf8-encoded-surrogate-id", items(lambda c: c.with_raw_bytes(
        c.submission(_first(c, trajectory_id="XMARKERX")), "XMARKERX", b"ab\xed\xa0\x80cde")), W.SCHEMA),
    Case("invalid-utf8-participant-id", items(lambda c: c.with_raw_bytes(
        c.submission(participant_id="XMARKERX"), "XMARKERX", b"\xc0\xaf\xc0\xafXYZW")), W.SCHEMA),
    Case("nul-in-trajectory-id", items(lambda c: c.sealed(c.submission(_first(c, trajectory_id="t\x00evil")))),
         E.SCHEMA, G_REJ, early=False),
    Case("nul-in-participant-id", items(lambda c: c.sealed(c.submission(participant_id=c.pid + "\x00"))), E.SCHEMA),
    Case("nul-in-run-id", items(lambda c: c.sealed(c.submission(run_id="test-run\x00"))), E.WRONG_RUN),
    Case("rlo-in-trajectory-id", items(lambda c: c.sealed(c.submission(_first(c, trajectory_id="t\u202egnp.exe")))),
         E.SCHEMA, G_REJ, early=False),
    Case("rlo-in-participant-id", items(lambda c: c.sealed(c.submission(participant_id="\u202e" + c.pid))), E.SCHEMA),
    Case("bidi-isolate-in-prompt-id", items(lambda c: c.sealed(c.submission(_first(
        c, prompt_id=c.plan.prompts[0].prompt_id + "\u2066")))), E.SCHEMA,
         frozenset({E.INCOMPLETE_GROUP.value}), early=False),
    Case("rlo-in-prompt-text", items(lambda c: c.sealed(c.submission(_first(
        c, prompt=(ChatMessage("user", "\u202e" + c.plan.prompts[0].messages[-1].content),))))),
         E.PROMPT_MISMATCH, G_REJ, early=False),
    # -- unknown enum values, unknown and duplicate fields
    Case("finish-reason-unknown", items(lambda c: c.mutated(_edit_first(finish_reason=99))), W.SCHEMA),
    Case("finish-reason-unset", items(lambda c: c.mutated(_edit_first(finish_reason=0))), W.SCHEMA),
    Case("role-unknown", items(lambda c: c.mutated(lambda m: setattr(m.trajectories[0].prompt[0], "role", 42))),
         W.SCHEMA),
    Case("unknown-field", items(lambda c: c.seal(encode_submission(c.submission()) + b"\xf8\x07\x05")), W.SCHEMA),
    Case("unknown-field-deep", items(lambda c: c.mutated(
        lambda m: m.trajectories[0].prompt[0].MergeFromString(b"\xf8\x07\x05"))), W.SCHEMA),
    Case("duplicate-field", items(lambda c: c.seal(b"\x08\x01" + encode_submission(c.submission()))), W.SCHEMA),
    # -- 10^5 repeated fields, deep nesting (T8)
    # counted on the parsed message and refused before any entry is built (SIZE, by the decoder)
    Case("1e5-trajectories", items(lambda c: many_trajectories(c, 10**5)), W.SIZE),
    Case("1e5-prompt-messages", items(lambda c: _many_messages(c, 10**5)), W.SIZE),
    Case("1e5-report-metrics", items(lambda c: _many_metrics(c, 10**5)), W.SIZE),
    Case("1e5-resends", outer(lambda c: _many_resends(c, 10**5)), W.SCHEMA),
    Case("nested-1e5-deep-submission", items(lambda c: c.seal(_nested(10**5))), W.SCHEMA),
    Case("nested-1e5-deep-reply", outer(lambda c: c.seal(_nested(10**5), PayloadType.LAB_REPLY)), W.SCHEMA),
    # -- keys and signatures (T5, S2)
    Case("reply-signed-by-unregistered-key", outer(lambda c: c.reply((c.sealed(),), c.stranger)), W.UNAUTHENTICATED),
    Case("reply-signed-by-another-lab", outer(lambda c: c.reply((c.sealed(),), c.other.key)), W.IDENTITY_MISMATCH),
    Case("reply-signature-bit-flipped", outer(_outer_sig_flipped), W.SIGNATURE),
    Case("reply-payload-bit-flipped", outer(_outer_payload_flipped), W.SIGNATURE),
    Case("reply-wrong-domain", outer(lambda c: c.seal(
        decode_envelope(c.reply((c.sealed(),))).payload, PayloadType.LAB_REPLY, domain=DOMAIN_UPDATE)), W.SIGNATURE),
    Case("reply-declared-as-submission", outer(lambda c: c.seal(
        decode_envelope(c.reply((c.sealed(),))).payload, PayloadType.SUBMISSION)), W.PAYLOAD_TYPE),
    Case("reply-truncated", outer(lambda c: _half(c.reply((c.sealed(),)))), W.SCHEMA,
         frozenset({W.VERSION.value})),
    Case("reply-random-bytes", outer(lambda c: random.Random(9).randbytes(4096)), W.SCHEMA,
         frozenset({W.VERSION.value})),
    Case("reply-empty", outer(lambda c: b""), W.VERSION, frozenset({W.SCHEMA.value})),
    Case("reply-over-16-mib", outer(lambda c: c.seal(b"\x00" * (17 * 1024 * 1024), PayloadType.LAB_REPLY)), W.SIZE),
    Case("submission-signed-by-unregistered-key", items(lambda c: c.seal(
        encode_submission(c.submission()), key=c.stranger)), W.UNAUTHENTICATED),
    Case("submission-signed-by-another-lab", items(lambda c: c.seal(
        encode_submission(c.submission()), key=c.other.key)), W.IDENTITY_MISMATCH),
    Case("submission-signature-bit-flipped", items(lambda c: _inner(
        c, lambda e: dataclasses.replace(e, sig=_flip(e.sig, 40, 1)))), W.SIGNATURE),
    Case("submission-payload-bit-flipped", items(lambda c: _inner(
        c, lambda e: dataclasses.replace(e, payload=_flip(e.payload, 30, 2)))), W.SIGNATURE),
    Case("submission-signature-truncated", items(lambda c: _inner(
        c, lambda e: dataclasses.replace(e, sig=e.sig[:32]))), W.SIGNATURE),
    Case("submission-wrong-domain", items(lambda c: c.seal(
        encode_submission(c.submission()), domain=DOMAIN_UPDATE)), W.SIGNATURE),
    Case("submission-declared-as-update", items(lambda c: c.seal(
        encode_submission(c.submission()), PayloadType.ROUND_UPDATE)), W.PAYLOAD_TYPE),
    Case("envelope-version-2", items(lambda c: c.seal(encode_submission(c.submission()), version=2)), W.VERSION),
    Case("frame-version-2", items(_frame_version_2), W.VERSION),
    Case("not-an-envelope-inside-a-valid-reply", items(lambda c: b"\x12\x34 not an envelope"), W.SCHEMA,
         frozenset({W.VERSION.value})),
    # -- identity, replay, assignment (T4, T5, T6, S3, S9)
    Case("claims-another-labs-id", items(lambda c: c.sealed(c.submission(participant_id=c.other.pid))),
         E.IDENTITY_MISMATCH),
    Case("squats-another-labs-source", items(lambda c: c.sealed(c.submission(_first(c, source_id=c.other.pid)))),
         E.SOURCE_MISMATCH, G_REJ, early=False),
    Case("another-run", items(lambda c: c.sealed(c.submission(run_id="other-run"))), E.WRONG_RUN),
    Case("future-round", items(lambda c: c.sealed(c.submission(round_id=7))), E.UNKNOWN_ROUND),
    Case("nonce-of-5-bytes", items(lambda c: c.mutated(lambda m: setattr(m, "nonce", b"\x01" * 5))), W.SCHEMA),
    Case("unassigned-prompt", items(lambda c: c.sealed(c.submission(_unassigned(c)))), E.UNASSIGNED_PROMPT,
         frozenset({E.INCOMPLETE_GROUP.value}), early=False),
    Case("unknown-prompt", items(lambda c: c.sealed(c.submission(_first(c, prompt_id="no-such-prompt")))),
         E.UNKNOWN_PROMPT, frozenset({E.INCOMPLETE_GROUP.value}), early=False),
    Case("partial-group", items(lambda c: c.sealed(c.submission(c.trajectories()[1:]))), E.INCOMPLETE_GROUP,
         early=False),
    Case("duplicate-trajectory-id", items(lambda c: c.sealed(c.submission(_first(
        c, trajectory_id=c.trajectories()[1].trajectory_id)))), E.DUPLICATE, G_REJ, early=False),
    Case("policy-version-uint64-max", items(lambda c: c.mutated(_edit_first(policy_version=2**64 - 1))),
         E.POLICY_VERSION, G_REJ, early=False),
    Case("replayed-nonce-new-content", lambda c: Attack((c.sealed(dataclasses.replace(
        c.submission(), nonce=c.replay_nonce, created_at_ms=2)),)), E.NONCE_REUSE, setup=lambda c: _remember_nonce(c)),
    Case("flood-64-submissions", lambda c: _flood(c, 64), E.RATE_LIMITED,
         frozenset({E.WRONG_RUN.value, E.QUOTA_TRAJECTORIES.value})),
]

# Edge values that are valid: each must be accepted like an honest submission (receipt, nothing refused).
EDGES: list[Case] = [
    Case("logp-minus-zero", items(lambda c: c.sealed(c.submission(
        [dataclasses.replace(t, source_logp_sum=-0.0) for t in c.trajectories()]))), ""),
    Case("reward-minus-zero", items(lambda c: c.sealed(c.submission(
        [dataclasses.replace(t, reward=-0.0) if t.reward == 0 else t for t in c.trajectories()]))), ""),
    Case("empty-text-that-stopped", items(lambda c: c.sealed(c.submission(_honest_claims(c, [
        dataclasses.replace(t, response_text="", source_token_count=0, source_logp_sum=0.0) if i == _wrong_sample(c)
        else t for i, t in enumerate(c.trajectories())])))), ""),
    Case("nul-and-bidi-in-response-text", items(lambda c: c.sealed(c.submission(_honest_claims(c, [
        dataclasses.replace(t, response_text=t.response_text + "\x00\u202e\u2066x") for t in c.trajectories()])))), ""),
    Case("identical-resend", lambda c: Attack((c.first_item,)), "", setup=lambda c: _remember_item(c)),
]


def _unassigned(ctx: Ctx) -> list[Trajectory]:
    planned = set(ctx.plan.prompt_ids)
    other = next(p for p in TASK.train_problems() if p.prompt_id not in planned)
    out = ctx.trajectories()
    for i, t in enumerate(out):
        if t.prompt_id == ctx.plan.prompts[0].prompt_id:
            out[i] = dataclasses.replace(t, prompt_id=other.prompt_id, prompt=tuple(other.messages))
    return out


def _honest_claims(ctx: Ctx, trajectories: list[Trajectory]) -> list[Trajectory]:
    return [dataclasses.replace(t, reward=TASK.verify(TASK.problem(t.prompt_id), t.response_text).reward)
            for t in trajectories]


def _remember_nonce(ctx: Ctx) -> Attack:
    sub = ctx.submission()
    ctx.replay_nonce = sub.nonce  # type: ignore[attr-defined]
    return Attack((ctx.sealed(sub),))


def _remember_item(ctx: Ctx) -> Attack:
    ctx.first_item = ctx.sealed()  # type: ignore[attr-defined]
    return Attack((ctx.first_item,))
