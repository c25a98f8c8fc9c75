"""hacfed.wire: every message round-trips exactly, and the generated relay stub reaches a raw-bytes handler.

The strategies here are shared with the refusal tests (test_wire_rejections.py) and test_pool_splice.py.
"""

from __future__ import annotations

import math
from concurrent import futures

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hacfed import wire
from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import PlannedPrompt, RoundPlan, RoundUpdate, SamplingParams, StepReport, Submission
from hacfed.proto import hacfed_v1_pb2 as pb  # only for a frame the encoders refuse to build and the service name
from hacfed.trajectory import LOGP_EPS, ChatMessage, Trajectory
from hacfed.wire import ErrorReply, Rejection, SubmissionReceipt, WireError

# ---- strategies -----------------------------------------------------------------------------------

NASTY_TEXT = ["", "😀👩‍👩‍👧", "مرحبا بالعالم", "\u202eevil\u202c", "a\x00b", "x" * 300, "∑ 1/n² = π²/6", "\ufeff"]
# Surrogates cannot be UTF-8 encoded, so a proto3 string can never hold them.
text = st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40), st.sampled_from(NASTY_TEXT))
ident = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
chat = st.builds(ChatMessage, role=st.sampled_from(["system", "user", "assistant"]), content=text)
prompt = st.lists(chat, min_size=1, max_size=3).map(tuple)
UINT64 = 2**64 - 1
UINT32 = 2**32 - 1


@st.composite
def trajectories(draw: st.DrawFn) -> Trajectory:
    count = draw(st.one_of(st.just(0), st.integers(1, 4096), st.just(UINT32)))
    logp = 0.0 if count == 0 else draw(
        st.one_of(st.floats(-1e9, LOGP_EPS, allow_nan=False), st.sampled_from([-0.0, LOGP_EPS, -5e-324, -1e300]))
    )
    return Trajectory(
        trajectory_id=draw(ident), prompt_id=draw(ident), source_id=draw(ident),
        policy_version=draw(st.one_of(st.integers(0, 100), st.just(UINT64))),
        prompt=draw(prompt), response_text=draw(text),
        reward=draw(st.one_of(st.floats(0.0, 1.0), st.sampled_from([0, 1, 0.0, 1.0]))),
        source_logp_sum=logp, source_token_count=count,
        finish_reason=draw(st.sampled_from(["stop", "length"])),
    )


_common = dict(
    alpha=st.floats(0, 4), kl_coef=st.sampled_from([0.0, 0.001]),
    cross_clip_step=st.sampled_from([0.0, 0.025]), capability_window=st.integers(1, 50),
)
# Ablation flags only exist in mode "hacpo" (HacpoConfig refuses them elsewhere).
hacpo_configs = st.one_of(
    st.builds(HacpoConfig, mode=st.just("hacpo"), capability_baseline=st.booleans(),
              capability_coefficient=st.booleans(), stepwise_clip=st.booleans(), cross_clip=st.booleans(), **_common),
    st.builds(HacpoConfig, mode=st.sampled_from(["naive", "gspo"]), **_common),
    st.builds(HacpoConfig, mode=st.just("xhacpo"), cross_ratio_unit=st.sampled_from(["token", "byte"]),
              cross_clip_style=st.sampled_from(["hard", "pessimistic"]),
              cross_negatives=st.sampled_from(["learn", "skip"]), **_common),
    # guided rollouts (docs/partner_rules.md)
    st.builds(HacpoConfig, mode=st.just("xhacpo"), guide_samples=st.integers(1, 64),
              guide_max_own_reward=st.sampled_from([0.0, 0.5]), guide_hint=st.sampled_from(["response", "answer"]),
              guide_context=st.sampled_from(["plain", "hinted"]), partner_use=st.sampled_from(["gradient", "context"]),
              **_common),
)


@st.composite
def plans(draw: st.DrawFn) -> RoundPlan:
    ids = draw(st.lists(ident, max_size=4, unique=True))
    return RoundPlan(
        run_id=draw(ident), round_id=draw(st.integers(0, UINT64)),
        prompts=tuple(PlannedPrompt(i, draw(prompt)) for i in ids), group_size=draw(st.integers(1, 64)),
        sampling=SamplingParams(draw(st.floats(0.01, 2.0)), draw(st.sampled_from([1.0, 0.5])),
                                draw(st.integers(1, 4096))),
        hacpo=draw(hacpo_configs), evaluate=draw(st.booleans()),
    )


metrics = st.dictionaries(ident, st.floats(allow_nan=False), max_size=4)
reports = st.builds(
    StepReport, participant_id=st.one_of(st.just(""), ident), round_id=st.integers(0, UINT64), metrics=metrics,
    eval_accuracy=st.one_of(st.none(), st.just(0.0), st.floats(0.0, 1.0)),
)

# ---- round trips ----------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(trajectories())
def test_trajectory_round_trips(t: Trajectory) -> None:
    data = wire.encode_trajectory(t)
    back = wire.decode_trajectory(data)
    assert back == t
    assert math.copysign(1, back.source_logp_sum) == math.copysign(1, t.source_logp_sum)  # -0.0 survives
    assert wire.encode_trajectory(back) == data


@settings(max_examples=40, deadline=None)
@given(st.lists(trajectories(), max_size=5).map(tuple))
def test_trajectory_batch_round_trips(batch: tuple[Trajectory, ...]) -> None:
    assert wire.decode_trajectory_batch(wire.encode_trajectory_batch(batch)) == batch


def test_local_token_ids_never_cross_the_wire() -> None:
    t = Trajectory("t1", "p1", "lab-a", 3, (ChatMessage("user", "2+2?"),), "4", 1.0, -0.5, 2, "stop",
                   response_token_ids=(17, 4))
    data = wire.encode_trajectory(t)
    back = wire.decode_trajectory(data)
    assert back == t and back.response_token_ids is None
    assert data == wire.encode_trajectory(t.without_local_ids())


@settings(max_examples=40, deadline=None)
@given(plans())
def test_round_plan_round_trips(plan: RoundPlan) -> None:
    assert wire.decode_round_plan(wire.encode_round_plan(plan)) == plan


@settings(max_examples=40, deadline=None)
@given(
    pool_round=st.one_of(st.none(), st.just(0), st.integers(1, UINT64)),
    pool=st.lists(trajectories(), max_size=3).map(tuple),
    caps=st.dictionaries(ident, st.floats(1e-8, 1.0), max_size=4),
    next_plan=st.one_of(st.none(), plans()),
    participants=st.lists(ident, max_size=3).map(tuple),
    hacpo=hacpo_configs,
)
def test_round_update_round_trips(pool_round, pool, caps, next_plan, participants, hacpo) -> None:
    update = RoundUpdate("run-1", pool_round, pool, caps, next_plan, participants, hacpo)
    back = wire.decode_round_update(wire.encode_round_update(update))
    assert back == update
    assert (back.pool_round is None) == (pool_round is None)  # absent is not round 0
    assert (back.next_plan is None) == (next_plan is None)


@settings(max_examples=40, deadline=None)
@given(reports)
def test_step_report_round_trips(report: StepReport) -> None:
    back = wire.decode_step_report(wire.encode_step_report(report))
    assert back == report
    assert (back.eval_accuracy is None) == (report.eval_accuracy is None)  # absent is not accuracy 0


@settings(max_examples=40, deadline=None)
@given(
    trajs=st.lists(trajectories(), max_size=3).map(tuple),
    report=st.one_of(st.none(), reports),
    nonce=st.one_of(st.just(""), st.binary(min_size=16, max_size=16).map(bytes.hex)),
    created=st.integers(0, 2**63 - 1),
)
def test_submission_round_trips(trajs, report, nonce, created) -> None:
    sub = Submission("run-1", "lab-a", 7, trajs, report, nonce, created)
    assert wire.decode_submission(wire.encode_submission(sub)) == sub


def _receipt(**kw) -> SubmissionReceipt:
    base = dict(run_id="run-1", round_id=3, participant_id="lab-a", accepted_trajectory_ids=("t1", "t2"),
                rejections=(Rejection("HACFED-E-REWARD-MISMATCH", "claimed 1, verified 0", "t3"),
                            Rejection("HACFED-E-INCOMPLETE-GROUP", "p9 has 3 of 4 samples")),
                seq=41, content_hash="ab" * 32)
    return SubmissionReceipt(**{**base, **kw})


def test_receipt_and_error_round_trip() -> None:
    for receipt in (_receipt(), _receipt(accepted_trajectory_ids=(), rejections=(), seq=0)):
        data = wire.encode_receipt(receipt)
        assert wire.decode_receipt(data) == receipt
        assert wire.encode_receipt(wire.decode_receipt(data)) == data  # a resend's receipt is byte-identical
    error = ErrorReply("HACFED-E-STALE-ROUND", "round 3 closed; current round is 5 🙂")
    assert wire.decode_error(wire.encode_error(error)) == error


def test_refusal_delivery_and_lab_reply_round_trip() -> None:
    from hacfed.wire import MAX_DELIVERY_ITEMS, Delivery, LabReply, SubmissionRefusal

    with_nonce = _receipt(nonce="cd" * 16)
    assert wire.decode_receipt(wire.encode_receipt(with_nonce)).nonce == "cd" * 16
    refusal = SubmissionRefusal("run-1", 3, "lab-a", "ef" * 16, "HACFED-E-RATE-LIMITED", "slow down", 2500)
    assert wire.decode_refusal(wire.encode_refusal(refusal)) == refusal
    delivery = Delivery((b"receipt-1", b"refusal-2"), b"update")
    assert wire.decode_delivery(wire.encode_delivery(delivery)) == delivery
    assert wire.decode_delivery(wire.encode_delivery(Delivery(()))) == Delivery((), b"")
    reply = LabReply(b"submission", (b"old-1", b"old-2"))
    assert wire.decode_lab_reply(wire.encode_lab_reply(reply)) == reply
    with pytest.raises(WireError, match="refusal"):  # one kind of message never decodes as another
        wire.decode_refusal(wire.encode_lab_reply(reply))
    flood = pb.WireMessage(version=1)
    flood.lab_reply.resends.extend([b"x"] * (MAX_DELIVERY_ITEMS + 1))
    with pytest.raises(WireError, match=f"holds {MAX_DELIVERY_ITEMS + 1} items"):
        wire.decode_lab_reply(flood.SerializeToString(deterministic=True))
    with pytest.raises(ValueError, match="HACFED-E"):
        SubmissionRefusal("r", 0, "p", "", "not-a-code", "x")


def test_all_default_submessages_stay_present() -> None:
    # Proto3 omits a sub-message whose fields all hold defaults unless it is marked present.
    sub = Submission("r", "p", 0, (), StepReport("", 0))
    assert wire.decode_submission(wire.encode_submission(sub)).report == StepReport("", 0)
    assert wire.decode_trajectory_batch(wire.encode_trajectory_batch(())) == ()


def test_encoding_is_deterministic_whatever_the_dict_order() -> None:
    caps = {"lab-a": 0.5, "lab-b": 0.25, "lab-c": 1.0}
    one = RoundUpdate("r", 1, (), caps, None, ("lab-a",))
    two = RoundUpdate("r", 1, (), dict(reversed(list(caps.items()))), None, ("lab-a",))
    assert wire.encode_round_update(one) == wire.encode_round_update(two)


# ---- the relay transport moves envelope bytes untouched --------------------------------------------


def test_generated_relay_service_interoperates_with_a_raw_bytes_handler() -> None:
    # The Flower relay serves Exchange with a generic handler on raw bytes (no codegen); a client
    # using the generated stub and typed Envelope messages must reach it and read its reply.
    from hacfed.proto import hacfed_v1_pb2_grpc

    service = pb.DESCRIPTOR.services_by_name["ParticipantRelay"].full_name
    seen: list[bytes] = []

    def exchange(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append(request)
        env = wire.decode_envelope(request)
        return wire.encode_envelope(wire.RawEnvelope(env.payload[::-1], b"s" * 64, b"k" * 32, "hacfed.v1.ErrorReply"))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    method = grpc.unary_unary_rpc_method_handler(exchange)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {"Exchange": method}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            envelope = wire.RawEnvelope(b"payload", b"\x01" * 64, b"\x02" * 32, "hacfed.v1.Submission")
            request = wire.encode_envelope(envelope)
            stub = hacfed_v1_pb2_grpc.ParticipantRelayStub(channel)
            reply = stub.Exchange(pb.Envelope.FromString(request), timeout=10)
            assert seen == [request]
            assert reply.payload == b"daolyap" and reply.payload_type == "hacfed.v1.ErrorReply"
            assert f"/{service}/Exchange" == "/hacfed.v1.ParticipantRelay/Exchange"  # the relay's fixed path
    finally:
        server.stop(None)
