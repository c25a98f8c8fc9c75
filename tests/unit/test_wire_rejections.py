"""hacfed.wire's refusals: hostile, truncated, mutated or oversize bytes become a WireError with a closed code.

The round trips of well-formed messages are in test_wire.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hacfed import wire
from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import PlannedPrompt, RoundPlan, SamplingParams, StepReport, Submission
from hacfed.proto import hacfed_v1_pb2 as pb  # only to craft hostile frames
from hacfed.trajectory import LOGP_EPS, ChatMessage, Trajectory
from hacfed.wire import ErrorCode, WireError
from tests.unit.test_wire import _receipt

T = Trajectory("t1", "p1", "lab-a", 0, (ChatMessage("user", "1+1=?"),), "2", 1.0, -1.5, 3, "stop")
SUB = Submission("run-1", "lab-a", 2, (T,), StepReport("lab-a", 1, {"loss": 0.3}, 0.5), "0f" * 16, 1_700_000_000_000)


def _frame_with_trajectory(**changes) -> bytes:
    frame = pb.WireMessage(version=wire.PROTOCOL_VERSION)
    frame.trajectory.ParseFromString(pb.WireMessage.FromString(wire.encode_trajectory(T)).trajectory.SerializeToString())
    for name, value in changes.items():
        setattr(frame.trajectory, name, value)
    return frame.SerializeToString()


def _code(fn, data, **kw) -> ErrorCode:
    with pytest.raises(WireError) as info:
        fn(data, **kw)
    return info.value.code


def test_every_truncation_is_rejected() -> None:
    data = wire.encode_submission(SUB)
    assert wire.decode_submission(data) == SUB
    for cut in range(len(data)):
        assert _code(wire.decode_submission, data[:cut]) in (ErrorCode.SCHEMA, ErrorCode.VERSION), cut


DECODERS = [wire.decode_round_plan, wire.decode_round_update, wire.decode_submission, wire.decode_step_report,
            wire.decode_trajectory, wire.decode_trajectory_batch, wire.decode_receipt, wire.decode_error,
            wire.decode_envelope]


@settings(max_examples=300, deadline=None)
@given(data=st.one_of(st.binary(max_size=300), st.binary(max_size=40).map(lambda b: b"\x08\x01" + b)),
       decoder=st.sampled_from(DECODERS))
def test_arbitrary_bytes_never_escape_as_anything_but_wire_error(data: bytes, decoder) -> None:
    try:
        decoder(data)
    except WireError as exc:
        assert exc.code in ErrorCode
    # (bytes that happen to decode are fine: they passed every check)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_submissions_decode_to_a_valid_object_or_a_wire_error(edits) -> None:
    data = bytearray(wire.encode_submission(SUB))
    for position, value in edits:
        data[position % len(data)] = value
    try:
        back = wire.decode_submission(bytes(data))
    except WireError:
        return
    assert isinstance(back, Submission) and all(isinstance(t, Trajectory) for t in back.trajectories)


def test_wrong_protocol_version_is_rejected() -> None:
    frame = pb.WireMessage.FromString(wire.encode_submission(SUB))
    frame.version = wire.PROTOCOL_VERSION + 1
    assert _code(wire.decode_submission, frame.SerializeToString()) == ErrorCode.VERSION
    assert _code(wire.decode_submission, b"") == ErrorCode.VERSION  # no version at all


@pytest.mark.parametrize("logp", [math.nan, math.inf, -math.inf, 0.5, LOGP_EPS * 2])
def test_forged_logprob_is_rejected(logp: float) -> None:
    assert _code(wire.decode_trajectory, _frame_with_trajectory(source_logp_sum=logp)) == ErrorCode.LOGPROB_RANGE


@pytest.mark.parametrize("changes", [
    {"reward": 2.0}, {"reward": -0.1}, {"reward": math.nan}, {"trajectory_id": ""},
    {"finish_reason": 0}, {"finish_reason": 7}, {"source_token_count": 0},  # count 0 with a non-zero sum
])
def test_invalid_trajectory_fields_are_rejected(changes: dict) -> None:
    assert _code(wire.decode_trajectory, _frame_with_trajectory(**changes)) == ErrorCode.SCHEMA


def test_unknown_role_and_missing_settings_are_rejected() -> None:
    frame = pb.WireMessage.FromString(wire.encode_trajectory(T))
    frame.trajectory.prompt[0].role = 9
    assert _code(wire.decode_trajectory, frame.SerializeToString()) == ErrorCode.SCHEMA
    prompts = (PlannedPrompt("p1", (ChatMessage("user", "hi"),)),)
    plan = RoundPlan("run-1", 0, prompts, 4, SamplingParams(), HacpoConfig())
    for clear in ("hacpo.alpha", "hacpo.stepwise_clip", "sampling.top_p", "sampling", "hacpo"):
        frame = pb.WireMessage.FromString(wire.encode_round_plan(plan))
        *parents, leaf = clear.split(".")
        target = frame.round_plan
        for p in parents:
            target = getattr(target, p)
        target.ClearField(leaf)
        with pytest.raises(WireError, match="missing") as info:
            wire.decode_round_plan(frame.SerializeToString())
        assert info.value.code == ErrorCode.SCHEMA


def test_oversize_is_rejected_before_parsing() -> None:
    big = Submission("run-1", "lab-a", 2, (Trajectory("t", "p", "a", 0, T.prompt, "x" * 5000, 0.0, -1.0, 1, "stop"),))
    data = wire.encode_submission(big)
    assert wire.decode_submission(data, max_bytes=len(data)) == big
    assert _code(wire.decode_submission, data, max_bytes=len(data) - 1) == ErrorCode.SIZE
    # 17 MiB of garbage against the default 16 MiB cap: refused on size, not on content.
    assert _code(wire.decode_submission, b"\xff" * (17 * 1024 * 1024)) == ErrorCode.SIZE


def _counting_builders(monkeypatch) -> list[str]:
    """What hacfed.wire.convert builds from here on: a name per trajectory, chat message and report."""
    from hacfed.wire import convert

    built: list[str] = []
    for name in ("read_trajectory", "read_chat", "StepReport"):
        real = getattr(convert, name)
        monkeypatch.setattr(convert, name, lambda *a, real=real, name=name, **k: (built.append(name), real(*a, **k))[1])
    return built


def test_repeated_fields_over_their_caps_are_refused_before_any_entry_is_built(monkeypatch) -> None:
    """10^5 entries of a repeated field fit in a few MiB and cost seconds to build (security.md S4):
    each is counted on the parsed message first and refused with SIZE, building nothing."""
    built = _counting_builders(monkeypatch)
    five = wire.encode_submission(Submission("run-1", "lab-a", 2, (T,) * 5, SUB.report, SUB.nonce))
    assert wire.decode_submission(five, max_trajectories=5).trajectories == (T,) * 5
    assert wire.decode_submission(five).trajectories == (T,) * 5  # no cap unless the receiver sets one
    built.clear()
    with pytest.raises(WireError, match="Submission.trajectories holds 5 entries, more than the 4 allowed") as info:
        wire.decode_submission(five, max_trajectories=4)
    assert info.value.code == ErrorCode.SIZE and built == []

    frame = pb.WireMessage.FromString(wire.encode_submission(SUB))
    prompt = frame.submission.trajectories[0].prompt
    for _ in range(wire.MAX_PROMPT_MESSAGES - len(prompt)):
        prompt.add(role=pb.ROLE_USER, content="q")
    back = wire.decode_submission(frame.SerializeToString(deterministic=True))
    assert len(back.trajectories[0].prompt) == wire.MAX_PROMPT_MESSAGES
    prompt.add(role=pb.ROLE_USER, content="q")
    built.clear()
    assert _code(wire.decode_submission, frame.SerializeToString(deterministic=True)) == ErrorCode.SIZE and built == []
    alone = pb.WireMessage(version=wire.PROTOCOL_VERSION)
    alone.trajectory.CopyFrom(frame.submission.trajectories[0])
    built.clear()  # the same cap for a trajectory alone (or in a pool, a batch)
    assert _code(wire.decode_trajectory, alone.SerializeToString(deterministic=True)) == ErrorCode.SIZE
    assert "read_chat" not in built

    report = StepReport("lab-a", 1, {f"m{i}": 1.0 for i in range(wire.MAX_REPORT_METRICS)})
    frame = pb.WireMessage.FromString(wire.encode_submission(dataclasses.replace(SUB, trajectories=(), report=report)))
    assert wire.decode_submission(frame.SerializeToString(deterministic=True)).report == report
    frame.submission.report.metrics["one-more"] = 1.0
    built.clear()
    assert _code(wire.decode_submission, frame.SerializeToString(deterministic=True)) == ErrorCode.SIZE and built == []
    one_more = dataclasses.replace(report, metrics={**report.metrics, "one-more": 1.0})
    assert _code(wire.decode_step_report, wire.encode_step_report(one_more)) == ErrorCode.SIZE  # a report alone too


def test_other_message_kinds_and_garbage_are_rejected() -> None:
    assert _code(wire.decode_submission, wire.encode_receipt(_receipt())) == ErrorCode.SCHEMA
    assert _code(wire.decode_round_update, wire.encode_round_plan(
        RoundPlan("r", 0, (), 1, SamplingParams(), HacpoConfig()))) == ErrorCode.SCHEMA
    assert _code(wire.decode_trajectory, b"\x08\x01\x32\x05\xff\xff") == ErrorCode.SCHEMA
    assert _code(wire.decode_trajectory, "not bytes") == ErrorCode.SCHEMA


def test_unknown_and_duplicate_fields_are_rejected_at_any_depth() -> None:
    unknown = b"\xf8\x07\x05"  # field 127, varint 5: not in protocol v1
    data = wire.encode_submission(SUB)
    assert _code(wire.decode_submission, data + unknown) == ErrorCode.SCHEMA
    frame = pb.WireMessage.FromString(data)
    frame.submission.trajectories[0].prompt[0].MergeFromString(unknown)
    with pytest.raises(WireError, match="unknown to protocol v1") as info:
        wire.decode_submission(frame.SerializeToString())
    assert info.value.code == ErrorCode.SCHEMA
    # A repeated version field parses (the last one wins) but is not the canonical encoding.
    assert _code(wire.decode_submission, b"\x08\x01" + data) == ErrorCode.SCHEMA


def test_invalid_utf8_and_bad_nonce_are_rejected() -> None:
    # ErrorReply.code (field 1) holding the bytes ff fe: not UTF-8
    body = b"\x0a\x02\xff\xfe"
    frame = b"\x08\x01" + b"\x4a" + bytes([len(body)]) + body  # field 9 = error
    assert _code(wire.decode_error, frame) == ErrorCode.SCHEMA
    bad = pb.WireMessage.FromString(wire.encode_submission(SUB))
    bad.submission.nonce = b"\x01" * 15
    assert _code(wire.decode_submission, bad.SerializeToString()) == ErrorCode.SCHEMA


def test_unencodable_values_raise_wire_errors() -> None:
    huge = Trajectory("t", "p", "a", 2**64, T.prompt, "", 0.0, 0.0, 0, "stop")  # beyond uint64
    with pytest.raises(WireError) as info:
        wire.encode_trajectory(huge)
    assert info.value.code == ErrorCode.SCHEMA
    with pytest.raises(TypeError):
        wire.encode_submission(T)
    with pytest.raises(ValueError):
        WireError("HACFED-E-NOT-A-CODE", "codes are a closed set")
