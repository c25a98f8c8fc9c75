"""hacfed.wire.pool_splice: a round update spliced from trajectories encoded once is byte for byte the
update `encode_round_update` writes, for any selection of the pool."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hacfed import wire
from hacfed.messages import RoundUpdate, StepReport, Submission
from hacfed.wire.pool_splice import encode_pool_items, header_of, splice_round_update, submission_pool_records
from tests.unit.test_wire import UINT64, hacpo_configs, ident, plans, trajectories


@settings(max_examples=60, deadline=None)
@given(
    pool_round=st.one_of(st.none(), st.just(0), st.integers(1, UINT64)),
    pool=st.lists(trajectories(), max_size=5).map(tuple),
    caps=st.dictionaries(ident, st.floats(1e-8, 1.0), max_size=4),
    next_plan=st.one_of(st.none(), plans()),
    participants=st.lists(ident, max_size=3).map(tuple),
    hacpo=hacpo_configs,
    keep=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_spliced_update_is_the_canonical_encoding(pool_round, pool, caps, next_plan, participants, hacpo, keep) -> None:
    update = RoundUpdate("run", pool_round, pool, caps, next_plan, participants, hacpo)
    items = encode_pool_items(pool)
    assert splice_round_update(header_of(update), items) == wire.encode_round_update(update)
    chosen = [i for i in range(len(pool)) if keep[i]]  # any selection, in pool order
    sub = dataclasses.replace(update, pool=tuple(pool[i] for i in chosen))
    data = splice_round_update(header_of(update), [items[i] for i in chosen])
    assert data == wire.encode_round_update(sub)
    assert wire.decode_round_update(data) == sub  # the lab's strict decoder takes it


@settings(max_examples=60, deadline=None)
@given(
    samples=st.lists(trajectories(), max_size=6).map(tuple),
    report=st.one_of(st.none(), st.builds(StepReport, ident, st.integers(0, UINT64),
                                          st.dictionaries(ident, st.floats(-1e6, 1e6), max_size=3),
                                          st.one_of(st.none(), st.floats(0.0, 1.0)))),
    nonce=st.one_of(st.just(""), st.binary(min_size=16, max_size=16).map(bytes.hex)),
    created=st.integers(0, 2**50),
    round_id=st.integers(0, UINT64),
)
def test_pool_records_cut_from_a_submission_are_the_encoded_ones(samples, report, nonce, created, round_id) -> None:
    """A submitted sample's bytes, retagged, are its pool record: the coordinator forwards them
    instead of encoding the pool again (`Coordinator.pool_records`)."""
    body = wire.encode_submission(Submission("run", "lab-a", round_id, samples, report, nonce, created))
    decoded = wire.decode_submission(body)
    assert submission_pool_records(body) == encode_pool_items(decoded.trajectories) == encode_pool_items(samples)


def test_bytes_that_are_not_a_submission_frame_give_no_records() -> None:
    from hacfed.trajectory import ChatMessage, Trajectory

    t = Trajectory("t", "p", "lab-a", 1, (ChatMessage("user", "q"),), "4", 1.0, -1.0, 1, "stop")
    body = wire.encode_submission(Submission("run", "lab-a", 1, (t,), None))
    assert submission_pool_records(body) == encode_pool_items((t,))
    assert submission_pool_records(body[:-3]) is None  # cut short
    assert submission_pool_records(b"") is None  # no submission field
    assert submission_pool_records(b"\x0f" + body[1:]) is None  # an unknown wire type
    update = wire.encode_round_update(RoundUpdate("run", 0, (t,), {}, None))
    assert submission_pool_records(update) is None


def test_a_long_pool_needs_multi_byte_lengths() -> None:
    """Lengths beyond 127 and 16383 bytes take 2- and 3-byte varints: still exact."""
    from hacfed.trajectory import ChatMessage, Trajectory

    pool = tuple(Trajectory(f"t{i}", f"p{i % 7}", "lab-a", 1, (ChatMessage("user", "q" * 50),), "x" * (40 * i), 0.5,
                            -1.0, 3, "stop") for i in range(200))
    update = RoundUpdate("run", 4, pool, {"lab-a": 0.5}, None, ("lab-a",))
    assert splice_round_update(header_of(update), encode_pool_items(pool)) == wire.encode_round_update(update)


def test_header_with_a_pool_is_refused() -> None:
    from hacfed.trajectory import ChatMessage, Trajectory

    t = Trajectory("t", "p", "lab-a", 1, (ChatMessage("user", "q"),), "4", 1.0, -1.0, 1, "stop")
    with pytest.raises(ValueError, match="empty pool, got 1"):
        splice_round_update(RoundUpdate("run", 0, (t,), {}, None), ())
    with pytest.raises(TypeError, match="expected a RoundUpdate"):
        splice_round_update("not an update", ())  # type: ignore[arg-type]


# ---- the directly written delivery and envelope encodings ----------------------------------------

blobs = st.one_of(st.just(b""), st.binary(max_size=40), st.binary(min_size=200, max_size=20_000))


@settings(max_examples=80, deadline=None)
@given(answers=st.lists(blobs.filter(bool), max_size=4).map(tuple), request=blobs)
def test_delivery_encoding_is_the_generic_protobuf_one(answers, request) -> None:
    from hacfed.wire.convert import fill_delivery
    from hacfed.wire.framing import _encode

    delivery = wire.Delivery(answers, request)
    data = wire.encode_delivery(delivery)
    assert data == _encode("delivery", wire.Delivery, fill_delivery, delivery)
    assert wire.decode_delivery(data) == delivery  # and the strict decoder takes it


@settings(max_examples=80, deadline=None)
@given(payload=blobs, sig=st.binary(max_size=64), kid=st.binary(max_size=32),
       payload_type=st.sampled_from(["round_update", "delivery", "x"]), version=st.sampled_from([0, 1, 7]))
def test_envelope_encoding_is_the_generic_protobuf_one(payload, sig, kid, payload_type, version) -> None:
    from hacfed.proto import hacfed_v1_pb2 as pb

    env = wire.RawEnvelope(payload, sig, kid, payload_type, version)
    generic = pb.Envelope(payload=payload, sig=sig, key_id=kid, payload_type=payload_type, version=version)
    assert wire.encode_envelope(env) == generic.SerializeToString(deterministic=True)


def test_encoders_refuse_what_is_not_theirs() -> None:
    with pytest.raises(TypeError, match="expected Delivery"):
        wire.encode_delivery(b"not a delivery")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="payload must be bytes"):
        wire.encode_envelope(wire.RawEnvelope("text", b"", b"", "x"))  # type: ignore[arg-type]
