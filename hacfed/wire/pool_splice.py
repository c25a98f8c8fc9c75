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
import struct
from collections.abc import Sequence

from hacfed.messages import RoundUpdate
from hacfed.proto import hacfed_v1_pb2 as pb
from hacfed.trajectory import Trajectory
from hacfed.wire.convert import fill_chat, fill_hacpo, fill_plan, fill_trajectory_head, fill_trajectory_tail
from hacfed.wire.framing import frame_parts, length_delimited, varint

_POOL_FIELD = pb.RoundUpdate.DESCRIPTOR.fields_by_name["pool"].number
_PROMPT_FIELD = pb.Trajectory.DESCRIPTOR.fields_by_name["prompt"].number
if [f.number for f in pb.Trajectory.DESCRIPTOR.fields] != list(range(1, 11)) or _PROMPT_FIELD != 5:
    # encode_pool_items relies on fields 1-4 (fill_trajectory_head), the prompt, then 6-10 (..._tail)
    raise ImportError("hacfed.wire.pool_splice: Trajectory's field numbers changed; update encode_pool_items")
_FD = pb.Trajectory.DESCRIPTOR.fields_by_name
if ([_FD[f].type for f in ("policy_version", "reward", "source_logp_sum", "source_token_count", "finish_reason")]
        != [_FD["policy_version"].TYPE_UINT64, *[_FD["reward"].TYPE_DOUBLE] * 2, _FD["reward"].TYPE_UINT32,
            _FD["reward"].TYPE_ENUM]):  # _plain_record writes these wire types
    raise ImportError("hacfed.wire.pool_splice: Trajectory's field types changed; update _plain_record")


def encode_pool_items(
    pool: Sequence[Trajectory], known: Sequence[bytes | None] | None = None,
) -> tuple[bytes, ...]:
    """Each trajectory as its `RoundUpdate.pool` record (tag, length, deterministic encoding).

    `known`: records already at hand, aligned with `pool` (None where there is none): the
    coordinator keeps each accepted sample's record from the bytes its lab submitted
    (`submission_pool_records`), so a round's pool is not encoded again (bench/coordinator_scale.py).
    The caller vouches that each is the record of its trajectory; a `known` of another length is
    not used.

    A trajectory's encoding is [fields 1-4] + [its prompt, field 5] + [fields 6-10] (deterministic
    serialization writes fields in number order), and a pool holds few distinct prompts (every lab
    answers the same ones): each prompt object's records are encoded once and the fields around
    them written per trajectory, at less than half the cost of filling the whole message each time
    (bench/coordinator_scale.py). Every field of the two reused messages is set for every
    trajectory (a field set to its default is not written, as in a fresh message)."""
    head, tail = pb.Trajectory(), pb.Trajectory()
    prompts: dict[int, bytes] = {}  # id(prompt) -> its field-5 records (the pool keeps every prompt alive)
    ids: tuple[dict[str, bytes], dict[str, bytes]] = ({}, {})  # prompt / source id -> its record (each repeats)
    items = []
    if known is not None and len(known) != len(pool):
        known = None
    for i, t in enumerate(pool):
        if known is not None and (record := known[i]) is not None:
            items.append(record)
            continue
        prompt = prompts.get(id(t.prompt))
        if prompt is None:
            m = pb.Trajectory()
            for c in t.prompt:
                fill_chat(m.prompt.add(), c)
            prompt = prompts[id(t.prompt)] = m.SerializeToString(deterministic=True)
        record = _plain_record(t, prompt, ids)
        if record is None:
            fill_trajectory_head(head, t)
            fill_trajectory_tail(tail, t)
            body = head.SerializeToString(deterministic=True) + prompt + tail.SerializeToString(deterministic=True)
            record = length_delimited(_POOL_FIELD, body)
        items.append(record)
    return tuple(items)


_POOL_TAG = varint(_POOL_FIELD << 3 | 2)
_VARINTS = tuple(varint(n) for n in range(1 << 14))  # every length and count below 16 KiB: one lookup
_ZERO_DOUBLE = bytes(8)
_FINISH = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}
_pack_double = struct.Struct("<d").pack


def _plain_record(t: Trajectory, prompt: bytes, ids: tuple[dict[str, bytes], dict[str, bytes]]) -> bytes | None:
    """`t`'s pool record (tag, length, deterministic encoding; its prompt's records given), written
    directly, for the plain case: exact str ids and text that encode to UTF-8, a policy version in
    uint64, a token count in uint32, a known finish reason, float reward and log-prob. None
    otherwise (the caller then fills the protobuf messages, which refuse what does not fit as
    before). Deterministic proto3 writes fields in number order and leaves out a field at its
    default (an empty string, 0, a double whose bits are all 0: -0.0 is written);
    tests/unit/test_pool_record_direct.py checks the bytes against protobuf's for any trajectory
    hypothesis draws. About 2x faster than filling and serializing two messages per trajectory.
    `ids`: the field-2 and field-3 records by prompt and source id (each repeats G x labs times)."""
    tid, pid, sid, text = t.trajectory_id, t.prompt_id, t.source_id, t.response_text
    v, n, fr = t.policy_version, t.source_token_count, t.finish_reason
    finish = _FINISH.get(fr) if type(fr) is str else None
    if not (type(tid) is str and type(pid) is str and type(sid) is str and type(text) is str
            and type(v) is int and 0 <= v < 1 << 64 and type(n) is int and 0 <= n < 1 << 32
            and finish is not None and type(t.reward) is float and type(t.source_logp_sum) is float):
        return None
    pids, sids = ids  # the records of field 2 and of field 3 apart: the same text has another tag
    try:
        pid_field = pids.get(pid)
        if pid_field is None:
            pid_field = pids[pid] = b"".join(_string_field(b"\x12", pid))
        sid_field = sids.get(sid)
        if sid_field is None:
            sid_field = sids[sid] = b"".join(_string_field(b"\x1a", sid))
        parts = [*_string_field(b"\x0a", tid), pid_field, sid_field]
        if v:
            parts += (b"\x20", _VARINTS[v] if v < 1 << 14 else varint(v))
        parts.append(prompt)
        parts += _string_field(b"\x32", text)
    except UnicodeEncodeError:  # a lone surrogate: protobuf's own refusal comes from the slow path
        return None
    reward, lp = _pack_double(t.reward), _pack_double(t.source_logp_sum)
    if reward != _ZERO_DOUBLE:
        parts += (b"\x39", reward)
    if lp != _ZERO_DOUBLE:
        parts += (b"\x41", lp)
    if n:
        parts += (b"\x48", _VARINTS[n] if n < 1 << 14 else varint(n))
    parts += (b"\x50", _VARINTS[finish])
    size = sum(map(len, parts))
    return b"".join((_POOL_TAG, _VARINTS[size] if size < 1 << 14 else varint(size), *parts))


_SUBMISSION_FIELD = pb.WireMessage.DESCRIPTOR.fields_by_name["submission"].number
_TRAJECTORIES_FIELD = pb.Submission.DESCRIPTOR.fields_by_name["trajectories"].number
if _POOL_TAG != b"\x1a" or varint(_TRAJECTORIES_FIELD << 3 | 2) != b"\x22":
    # submission_pool_records swaps the one-byte tag of a submitted record for the pool's
    raise ImportError("hacfed.wire.pool_splice: Submission.trajectories or RoundUpdate.pool moved; "
                      "update submission_pool_records")


def submission_pool_records(frame: bytes) -> tuple[bytes, ...] | None:
    """The `RoundUpdate.pool` record of each trajectory of an encoded submission, in order, cut
    from its bytes: `Submission.trajectories` and `RoundUpdate.pool` are both a repeated
    `Trajectory`, so a submitted record becomes a pool record by its tag alone (field 4 -> 3, the
    length and the trajectory's bytes unchanged). `frame` must be the canonical `WireMessage`
    that the trajectories were decoded from (`framing.decode_submission` accepts nothing else):
    each record is then exactly `encode_pool_items` of the decoded trajectory
    (tests/unit/test_pool_splice.py). None when the bytes are not a submission frame this walk
    understands (the caller then encodes the pool as before)."""
    try:
        body = next(((s, e) for number, s, e in _fields(frame, 0, len(frame)) if number == _SUBMISSION_FIELD), None)
        if body is None:
            return None
        return tuple(b"\x1a" + frame[s:e] for number, s, e in _fields(frame, *body, with_length=True)
                     if number == _TRAJECTORIES_FIELD)
    except (IndexError, ValueError):
        return None


def _fields(data: bytes, start: int, end: int, *, with_length: bool = False) -> list[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field of the message in data[start:end];
    with `with_length`, start is the byte after the tag (the slice holds the length too). Other
    wire types are skipped. ValueError on a group or an unknown wire type, IndexError on a cut."""
    out = []
    i = start
    while i < end:
        key = data[i]
        if key >= 0x80:
            key, i = _read_varint(data, i)
        else:
            i += 1
        wire_type = key & 7
        if wire_type == 2:
            head = i
            n = data[i]
            if n < 0x80:
                i += 1
            else:
                n, i = _read_varint(data, i)
            out.append((key >> 3, head if with_length else i, i + n))
            i += n
        elif wire_type == 0:
            _, i = _read_varint(data, i)
        elif wire_type == 1:
            i += 8
        elif wire_type == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wire_type}")
    if i != end:
        raise IndexError("a field runs past its message")
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    b = data[i]
    if b < 0x80:
        return b, i + 1
    value, shift = 0, 0
    while True:
        b = data[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _string_field(tag: bytes, value: str) -> tuple[bytes, ...]:
    """A string field's record as (tag, length, UTF-8 bytes); () for "" (not written)."""
    if not value:
        return ()
    data = value.encode("utf-8")
    return tag, _VARINTS[len(data)] if len(data) < 1 << 14 else varint(len(data)), data


def round_update_parts(header: RoundUpdate, items: Sequence[bytes]) -> list[bytes]:
    """`encode_round_update(dataclasses.replace(header, pool=<the items' trajectories>))` as pieces
    whose concatenation it is, from records made by `encode_pool_items`; `header.pool` must be
    empty. The items are not copied (`hacfed.envelope.seal_parts` hashes and copies them once)."""
    if not isinstance(header, RoundUpdate):
        raise TypeError(f"splice_round_update: expected a RoundUpdate, got {type(header).__name__}")
    if header.pool:
        raise ValueError(
            f"splice_round_update: the header must have an empty pool, got {len(header.pool)} trajectories"
        )
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


__all__ = ["encode_pool_items", "header_of", "round_update_parts", "splice_round_update", "submission_pool_records"]
