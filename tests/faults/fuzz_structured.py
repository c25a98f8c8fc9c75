"""Structure-aware atheris target: protobuf messages mutated field by field (security.md S4, "Fuzzing").

    python tests/faults/fuzz_structured.py -max_total_time=60 CORPUS_DIR
    python tests/faults/fuzz_structured.py crash-<sha1>                     # replay one input

fuzz_decoders.py mutates bytes, which rarely gives a field a value of another encoded length (a
5-byte varint, a longer string) in a valid encoding: every length prefix around it must change too,
so such inputs stop at the parser or at the canonical-encoding check. Here libFuzzer's mutations
are replaced by a custom mutator (`mutate`) that parses the input as the protobuf message its
target takes (hacfed's own generated classes, `hacfed.proto.hacfed_v1_pb2`), changes one field (a
boundary integer, an unknown enum value, NaN, ±Inf, -0.0, 1e308, an empty, long, NUL or bidi string, a repeated element
duplicated, dropped or reordered, a map entry added or removed, a sub-message cleared, or a frame
nested in a bytes field mutated in turn) and serializes it deterministically, so the result is
again a canonical encoding; one mutation in four is libFuzzer's own on the bytes. The first byte
of an input picks the target, as in fuzz_decoders.py, whose checks it reuses:

- every `hacfed.wire` decoder of a frame kind (`WireMessage`): decoded and encoded back to the same
  bytes, a submission then judged (`validate_submission`, `submission_digest`, `check_report`);
- `signed_submission`: the frame sealed with a registered key, then opened, decoded and judged;
- `signed_lab_reply`: a `LabReply` frame whose submission and resends are submission frames: each
  is sealed with the registered key, then the reply, and the whole is opened and judged as
  `hacfed.server.replies` does, so mutations inside the nested frames get past both signatures.

A finding is what fuzz_decoders.py counts as one. atheris-libprotobuf-mutator, Google's binding of
libprotobuf-mutator, is not used: docs/security.md (S4) says why.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).parent))
import fuzz_decoders as base  # noqa: E402 - instruments hacfed's imports first

with atheris.instrument_imports(include=["hacfed"]):
    from google.protobuf.descriptor import FieldDescriptor

    from hacfed import wire
    from hacfed.envelope import DOMAIN_SUBMIT, seal
    from hacfed.exchange import open_lab_reply, seal_lab_reply
    from hacfed.proto import hacfed_v1_pb2 as pb
    from hacfed.wire import PayloadType, WireError

FRAME_TARGETS = [name for name in base.CODECS if name != "envelope"]  # each a WireMessage kind
TARGET_NAMES = [*FRAME_TARGETS, "signed_submission", "signed_lab_reply"]

INTS = (0, 1, -1, 2, 7, 255, 256, 2**15, 2**31 - 1, -(2**31), 2**32 - 1, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1)
FLOATS = (0.0, -0.0, 1.0, -1.0, 1e-4, -1e-4, 1.5, math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, 3.5e38)
STRINGS = ("", "a", "lab", "lab-a", "fuzz", "\x00", "t\x00x", "\u202e", "\u2066x\u2069", "../x", "\U0001f600",
           "x" * 4096, " ", "\n")
ENUMS = (0, 1, 2, 3, 4, 99, -1, 2**31 - 1)
RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1), FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
}
FLOAT_TYPES = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


# ---- the mutator -------------------------------------------------------------------------------------


def _repeated(fd: FieldDescriptor) -> bool:
    return fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == FieldDescriptor.LABEL_REPEATED


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry


def _slots(msg: object, out: list[tuple[object, FieldDescriptor]]) -> list[tuple[object, FieldDescriptor]]:
    """Every (message, field) of `msg` and of each sub-message it holds."""
    for fd in msg.DESCRIPTOR.fields:
        if fd.containing_oneof is not None and msg.WhichOneof(fd.containing_oneof.name) not in (None, fd.name):
            continue  # another member of the oneof is set: leave the kind as it is
        out.append((msg, fd))
        if fd.type != FieldDescriptor.TYPE_MESSAGE or _is_map(fd):
            continue
        if _repeated(fd):
            for sub in getattr(msg, fd.name):
                _slots(sub, out)
        elif msg.HasField(fd.name):
            _slots(getattr(msg, fd.name), out)
    return out


def _zero(fd: FieldDescriptor) -> object:
    """The type's zero (a repeated field's default_value is a list)."""
    if fd.type == FieldDescriptor.TYPE_STRING:
        return ""
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return b""
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return False
    return 0.0 if fd.type in FLOAT_TYPES else 0


def _int_value(fd: FieldDescriptor, old: int, rng: random.Random) -> int:
    low, high = RANGES[fd.type]
    pool = ENUMS if fd.type == FieldDescriptor.TYPE_ENUM else INTS
    value = rng.choice((*pool, old + 1, old - 1, rng.randint(low, high)))
    return min(max(value, low), high)


def _string_value(old: str, rng: random.Random) -> str:
    choice = rng.randrange(4)
    if choice == 0 and old:
        return old[: rng.randrange(len(old))]
    if choice == 1:
        return old + rng.choice(STRINGS)
    return rng.choice(STRINGS)


def _bytes_value(old: bytes, rng: random.Random, byte_mutate: Callable[[bytes], bytes]) -> bytes:
    if old and rng.random() < 0.5:  # a frame in a bytes field (an item of a LabReply): mutate it in turn
        frame = pb.WireMessage()
        try:
            frame.ParseFromString(old)
        except Exception:  # noqa: BLE001 - not a frame: mutate the bytes
            frame = None
        if frame is not None and frame.WhichOneof("body") is not None:
            return mutate_message(frame, rng, byte_mutate).SerializeToString(deterministic=True)
    return rng.choice((b"", b"\x00" * 16, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 65))),
                       byte_mutate(old) if old else b"\x01"))


def _scalar(msg: object, fd: FieldDescriptor, old: object, rng: random.Random,
            byte_mutate: Callable[[bytes], bytes]) -> object:
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return not old
    if fd.type in FLOAT_TYPES:
        return rng.choice((*FLOATS, -old, old * 2, rng.uniform(-1e6, 1e6)))
    if fd.type == FieldDescriptor.TYPE_STRING:
        return _string_value(old, rng)
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return _bytes_value(old, rng, byte_mutate)
    return _int_value(fd, old, rng)


def _mutate_repeated(msg: object, fd: FieldDescriptor, rng: random.Random,
                     byte_mutate: Callable[[bytes], bytes]) -> None:
    items = getattr(msg, fd.name)
    n, op = len(items), rng.randrange(5)
    if op == 0 and n:  # one element changed
        i = rng.randrange(n)
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            mutate_message(items[i], rng, byte_mutate)
        else:
            items[i] = _scalar(msg, fd, items[i], rng, byte_mutate)
    elif op == 1 and n:  # one duplicated at the end
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            items.add().CopyFrom(items[rng.randrange(n)])
        else:
            items.append(items[rng.randrange(n)])
    elif op == 2 and n:
        del items[rng.randrange(n)]
    elif op == 3 and n > 1:  # two swapped
        i, j = rng.sample(range(n), 2)
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            a, b = type(items[i])(), type(items[j])()
            a.CopyFrom(items[i])
            b.CopyFrom(items[j])
            items[i].CopyFrom(b)
            items[j].CopyFrom(a)
        else:
            items[i], items[j] = items[j], items[i]
    elif fd.type == FieldDescriptor.TYPE_MESSAGE:
        items.add()  # a new, empty element
    else:
        items.append(_scalar(msg, fd, _zero(fd), rng, byte_mutate))


def _mutate_map(msg: object, fd: FieldDescriptor, rng: random.Random) -> None:
    entries = getattr(msg, fd.name)
    value_fd = fd.message_type.fields_by_name["value"]
    if entries and rng.random() < 0.3:
        del entries[rng.choice(sorted(entries))]
        return
    key = rng.choice((*sorted(entries), *STRINGS[:10], "time_training_s", "time_checkpoint_s", "loss"))
    if value_fd.type in FLOAT_TYPES:
        entries[key] = rng.choice(FLOATS)
    elif value_fd.type == FieldDescriptor.TYPE_STRING:
        entries[key] = rng.choice(STRINGS)
    elif value_fd.type != FieldDescriptor.TYPE_MESSAGE:
        entries[key] = _int_value(value_fd, 0, rng)


def mutate_message(msg: object, rng: random.Random, byte_mutate: Callable[[bytes], bytes]) -> object:
    """One structural change to `msg` (in place), returned."""
    slots = _slots(msg, [])
    if not slots:
        return msg
    parent, fd = rng.choice(slots)
    if _is_map(fd):
        _mutate_map(parent, fd, rng)
    elif _repeated(fd):
        _mutate_repeated(parent, fd, rng, byte_mutate)
    elif fd.type == FieldDescriptor.TYPE_MESSAGE:
        if parent.HasField(fd.name) and rng.random() < 0.3:
            parent.ClearField(fd.name)
        else:
            mutate_message(getattr(parent, fd.name), rng, byte_mutate)
            getattr(parent, fd.name).SetInParent()
    else:
        try:
            setattr(parent, fd.name, _scalar(parent, fd, getattr(parent, fd.name), rng, byte_mutate))
        except (ValueError, TypeError):  # a value protobuf itself refuses to hold
            pass
    return msg


def mutate(data: bytes, max_size: int, seed: int, byte_mutate: Callable[[bytes], bytes] | None = None) -> bytes:
    """libFuzzer's custom mutator: the target byte kept (now and then changed), the rest parsed as a
    `WireMessage` and changed one field; one time in four, or when it does not parse, the bytes are
    mutated as libFuzzer would."""
    rng = random.Random(seed)
    byte_mutate = byte_mutate or (lambda b: atheris.Mutate(b, max(len(b) * 2, 16)))
    target = data[0] % len(TARGET_NAMES) if data else rng.randrange(len(TARGET_NAMES))
    if rng.random() < 0.02:
        target = rng.randrange(len(TARGET_NAMES))
    body = data[1:]
    frame = pb.WireMessage()
    try:
        frame.ParseFromString(body)
        parsed = frame.WhichOneof("body") is not None
    except Exception:  # noqa: BLE001 - protobuf's DecodeError, or a recursion limit
        parsed = False
    if parsed and rng.random() < 0.75:
        body = mutate_message(frame, rng, byte_mutate).SerializeToString(deterministic=True)
    else:
        body = byte_mutate(body)
    return (bytes([target]) + body)[:max_size]


# ---- the targets -------------------------------------------------------------------------------------


def _sealed(item: bytes) -> bytes:
    return seal(item, PayloadType.SUBMISSION, base.LAB_KEY, DOMAIN_SUBMIT)


def _signed_lab_reply(data: bytes) -> None:
    """A LabReply frame whose items are submission frames: every item, then the reply, sealed with
    the registered key, then taken apart as the driver does."""
    try:
        inner = wire.decode_lab_reply(data)
    except WireError as exc:
        base._check_code(exc)
        return
    reply = seal_lab_reply(_sealed(inner.submission), [_sealed(r) for r in inner.resends], base.LAB_KEY)
    try:
        opened, _ = open_lab_reply(reply, base.TRUSTED)
    except WireError as exc:
        base._check_code(exc)
        return
    for item in (*opened.resends, opened.submission):
        base._signed_submission_envelope(item)


TARGETS: list[Callable[[bytes], None]] = [*(lambda data, n=name: base._decode(n, data) for name in FRAME_TARGETS),
                                          base._signed_submission, _signed_lab_reply]


def test_one_input(data: bytes) -> None:
    if not data:
        return
    TARGETS[data[0] % len(TARGETS)](data[1:])


def seeds() -> dict[str, bytes]:
    """One valid input per target (the target byte first)."""
    frames = {name: data[1:] for name, data in base.seeds().items() if "#" not in name}
    sub = frames["submission"]
    by_target = {name: frames[name] for name in FRAME_TARGETS}
    by_target["signed_submission"] = sub
    by_target["signed_lab_reply"] = wire.encode_lab_reply(wire.LabReply(sub, (sub,)))
    return {name: bytes([TARGET_NAMES.index(name)]) + data for name, data in by_target.items()}


def fill_corpus(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.iterdir()):
        return
    for name, data in seeds().items():
        (directory / f"seed-{name}").write_bytes(data)


def main(argv: list[str]) -> None:
    for arg in argv[1:]:
        if not arg.startswith("-") and not Path(arg).is_file():  # a file: one input to replay (a crash)
            fill_corpus(Path(arg))
    for data in seeds().values():  # the seeds themselves must pass before anything is fuzzed
        test_one_input(data)
    atheris.Setup(argv, test_one_input, custom_mutator=mutate)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
