"""`encode_pool_items` writes a plain trajectory's record directly (`pool_splice._plain_record`)
instead of through protobuf: the bytes must be protobuf's deterministic encoding for every value a
pool trajectory can hold (proto3 defaults left out, -0.0 written, multi-byte lengths, non-ASCII
text), and what protobuf refuses must still be refused."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hacfed.proto import hacfed_v1_pb2 as pb
from hacfed.trajectory import ChatMessage, Trajectory
from hacfed.wire.convert import fill_trajectory
from hacfed.wire.framing import length_delimited
from hacfed.wire.pool_splice import _plain_record, encode_pool_items

PROMPT = (ChatMessage("system", "Solve it."), ChatMessage("user", "Wie viel ist 6 × 7? ünïcödé"))


def protobuf_record(t: Trajectory) -> bytes:
    m = pb.Trajectory()
    fill_trajectory(m, t)
    return length_delimited(
        pb.RoundUpdate.DESCRIPTOR.fields_by_name["pool"].number, m.SerializeToString(deterministic=True)
    )


text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
ids = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)


@st.composite
def trajectories(draw) -> Trajectory:
    n = draw(st.one_of(st.just(0), st.integers(1, 300), st.integers(2**14 - 2, 2**14 + 2), st.just(2**32 - 1)))
    lp = 0.0 if n == 0 else draw(st.one_of(st.just(-0.0), st.just(0.0), st.floats(-1e6, 1e-4, allow_nan=False)))
    if n == 0:
        lp = draw(st.sampled_from([0.0, -0.0]))
    return Trajectory(
        draw(ids), draw(ids), draw(ids),
        draw(st.one_of(st.just(0), st.integers(1, 2**14 + 5), st.just(2**63 + 5))),
        draw(st.sampled_from([PROMPT, (ChatMessage("user", ""),)])),
        draw(st.one_of(text, st.just(""), st.just("ß" * 9000))),
        draw(st.sampled_from([0.0, -0.0, 1.0, 0.5, 5e-324])), lp, n, draw(st.sampled_from(["stop", "length"])),
    )


@settings(max_examples=300, deadline=None)
@given(pool=st.lists(trajectories(), min_size=1, max_size=6))
def test_direct_records_are_protobufs_deterministic_encoding(pool: list[Trajectory]) -> None:
    assert encode_pool_items(pool) == tuple(protobuf_record(t) for t in pool)


def test_a_prompt_id_equal_to_a_source_id_keeps_each_fields_tag() -> None:
    t = Trajectory("x", "same", "same", 1, PROMPT, "r", 1.0, -1.0, 2, "stop")
    u = dataclasses.replace(t, trajectory_id="y")
    assert encode_pool_items([t, u]) == (protobuf_record(t), protobuf_record(u))


def test_the_plain_case_is_written_directly() -> None:
    t = Trajectory("t1", "p1", "lab-a", 3, PROMPT, "\\boxed{42}", 1.0, -12.5, 40, "stop")
    assert _plain_record(t, b"", ({}, {})) is not None
    assert encode_pool_items([t]) == (protobuf_record(t),)


@pytest.mark.parametrize("change", [
    {"response_text": "bad \udc80 surrogate"}, {"trajectory_id": "id\ud800"},
])
def test_what_protobuf_refuses_is_still_refused(change) -> None:
    t = dataclasses.replace(Trajectory("t1", "p1", "lab-a", 3, PROMPT, "ok", 1.0, -1.0, 4, "stop"), **change)
    assert _plain_record(t, b"", ({}, {})) is None
    with pytest.raises(Exception) as direct:
        encode_pool_items([t])
    with pytest.raises(Exception) as generic:
        protobuf_record(t)
    assert type(direct.value) is type(generic.value)


def test_unusual_types_take_protobufs_path() -> None:
    t = Trajectory("t1", "p1", "lab-a", 3, PROMPT, "ok", 1, 0, 0, "stop")  # int reward and log-prob: valid
    assert _plain_record(t, b"", ({}, {})) is None
    assert encode_pool_items([t]) == (protobuf_record(t),)
