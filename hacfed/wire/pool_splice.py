"""Round updates built from trajectories encoded once: one pool, many per-lab updates.

With many labs the coordinator sends each lab its own selection of the round's pool
(`hacfed.server.coordinator.pool_share`). Converting every selected trajectory to protobuf again
for every lab costs O(labs x selection) Python work per round; here each trajectory of the pool is
encoded once (`encode_pool_items`) and each lab's update is spliced from those bytes
(`splice_round_update`).

The result is byte for byte `encode_round_update(update)`, so the lab's decoder, which accepts
only the canonical deterministic encoding (`framing._require_canonical`), sees no difference. Why it
is exact: protobuf's deterministic serialization writes a message's fields in field-number order
and a repeated message field as one (tag, length, bytes) record per element, each element in its
own deterministic encoding. `RoundUpdate.pool` is field 3, so an update is

    [fields 1-2] + [one record per pool trajectory] + [fields 4-7]

and `WireMessage` wraps it as [version] + (tag 3, length, update). `tests/unit/test_pool_splice.py`
checks the identity on updates with and without optional fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hacfed.messages import RoundUpdate
from hacfed.proto import hacfed_v1_pb2 as pb
from hacfed.trajectory import Trajectory
from hacfed.wire.convert import fill_chat, fill_hacpo, fill_plan, fill_trajectory_head, fill_trajectory_tail
from hacfed.wire.framing import frame_parts, length_delimited

_POOL_FIELD = pb.RoundUpdate.DESCRIPTOR.fields_by_name["pool"].number
_PROMPT_FIELD = pb.Trajectory.DESCRIPTOR.fields_by_name["prompt"].number
if [f.number for f in pb.Trajectory.DESCRIPTOR.fields] != list(range(1, 11)) or _PROMPT_FIELD != 5:
    # encode_pool_items relies on fields 1-4 (fill_trajectory_head), the prompt, then 6-10 (..._tail)
    raise ImportError("hacfed.wire.pool_splice: Trajectory's field numbers changed; update encode_pool_items")


def encode_pool_items(pool: Sequence[Trajectory]) -> tuple[bytes, ...]:
    """Each trajectory as its `RoundUpdate.pool` record (tag, length, deterministic encoding).

    A trajectory's encoding is [fields 1-4] + [its prompt, field 5] + [fields 6-10] (deterministic
    serialization writes fields in number order), and a pool holds few distinct prompts (every lab
    answers the same ones): each prompt object's records are encoded once and the fields around
    them written per trajectory, at less than half the cost of filling the whole message each time
    (bench/coordinator_scale.py). Every field of the two reused messages is set for every
    trajectory (a field set to its default is not written, as in a fresh message)."""
    head, tail = pb.Trajectory(), pb.Trajectory()
    prompts: dict[int, bytes] = {}  # id(prompt) -> its field-5 records (the pool keeps every prompt alive)
    items = []
    for t in pool:
        prompt = prompts.get(id(t.prompt))
        if prompt is None:
            m = pb.Trajectory()
            for c in t.prompt:
                fill_chat(m.prompt.add(), c)
            prompt = prompts[id(t.prompt)] = m.SerializeToString(deterministic=True)
        fill_trajectory_head(head, t)
        fill_trajectory_tail(tail, t)
        body = head.SerializeToString(deterministic=True) + prompt + tail.SerializeToString(deterministic=True)
        items.append(length_delimited(_POOL_FIELD, body))
    return tuple(items)


def round_update_parts(header: RoundUpdate, items: Sequence[bytes]) -> list[bytes]:
    """`encode_round_update(dataclasses.replace(header, pool=<the items' trajectories>))` as pieces
    whose concatenation it is, from records made by `encode_pool_items`; `header.pool` must be
    empty. The items are not copied (`hacfed.envelope.seal_parts` hashes and copies them once)."""
    if not isinstance(header, RoundUpdate):
        raise TypeError(f"splice_round_update: expected a RoundUpdate, got {type(header).__name__}")
    if header.pool:
        raise ValueError(f"splice_round_update: the header must have an empty pool, got {len(header.pool)} trajectories")
    before, after = pb.RoundUpdate(), pb.RoundUpdate()
    before.run_id = header.run_id
    if header.pool_round is not None:
        before.pool_round = header.pool_round
    after.capabilities.update(header.capabilities)
    if header.next_plan is not None:
        fill_plan(after.next_plan, header.next_plan)
    after.participants.extend(header.participants)
    fill_hacpo(after.hacpo, header.hacpo)
    return frame_parts("round_update", [before.SerializeToString(deterministic=True), *items,
                                        after.SerializeToString(deterministic=True)])


def splice_round_update(header: RoundUpdate, items: Sequence[bytes]) -> bytes:
    """`round_update_parts`, joined."""
    return b"".join(round_update_parts(header, items))


def header_of(update: RoundUpdate) -> RoundUpdate:
    """The update without its pool (what `splice_round_update` takes)."""
    return dataclasses.replace(update, pool=())


__all__ = ["encode_pool_items", "header_of", "round_update_parts", "splice_round_update"]
