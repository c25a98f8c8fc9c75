"""hacfed.envelope: every mutated envelope is refused (security.md S2), keys live in safe files."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from hacfed import wire
from hacfed.envelope import (
    DOMAIN_RECEIPT,
    DOMAIN_SUBMIT,
    DOMAIN_UPDATE,
    EnvelopeError,
    generate_key,
    key_id,
    load_key_registry,
    load_private_key,
    load_public_key,
    open_envelope,
    save_private_key,
    save_public_key,
    seal,
    signed_message,
)
from hacfed.messages import Submission
from hacfed.trajectory import ChatMessage, Trajectory
from hacfed.wire import ErrorCode, PayloadType

KEY_A, KEY_B, STRANGER = generate_key(), generate_key(), generate_key()
KID_A, KID_B = key_id(KEY_A.public_key()), key_id(KEY_B.public_key())
TRUSTED = {KID_A: KEY_A.public_key(), KID_B: KEY_B.public_key()}
SUB = PayloadType.SUBMISSION


def _open(data: bytes, domain: bytes = DOMAIN_SUBMIT, expected: str = SUB, **kw) -> tuple[bytes, bytes]:
    return open_envelope(data, TRUSTED, domain, expected, **kw)


def _code(data: bytes, **kw) -> ErrorCode:
    with pytest.raises(EnvelopeError) as info:
        _open(data, **kw)
    return info.value.code


def _tamper(data: bytes, **changes) -> bytes:
    return wire.encode_envelope(replace(wire.decode_envelope(data), **changes))


def test_round_trip_through_a_real_submission() -> None:
    t = Trajectory("t1", "p1", "lab-a", 0, (ChatMessage("user", "1+1=?"),), "2", 1.0, -0.7, 1, "stop")
    sub = Submission("run-1", "lab-a", 0, (t,), None, "ab" * 16, 1)
    data = seal(wire.encode_submission(sub), SUB, KEY_A)
    payload, kid = _open(data)
    assert kid == KID_A and wire.decode_submission(payload) == sub
    assert seal(wire.encode_submission(sub), SUB, KEY_A) == data  # Ed25519 is deterministic: resends match


def test_key_id_and_signed_bytes_are_pinned() -> None:
    raw = KEY_A.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert KID_A == hashlib.sha256(raw).digest() and len(KID_A) == 32
    env = wire.decode_envelope(seal(b"payload", SUB, KEY_A))
    expected = b"hacfed/v1/submit\x00hacfed.v1.Submission\x00" + hashlib.sha256(b"payload").digest()
    assert signed_message(DOMAIN_SUBMIT, SUB, b"payload") == expected
    KEY_A.public_key().verify(env.sig, expected)  # raises if the envelope signed anything else
    assert len(env.sig) == 64 and env.key_id == KID_A and env.version == wire.PROTOCOL_VERSION


@settings(max_examples=600, deadline=None)
@given(payload=st.binary(max_size=64), target=st.sampled_from(["sig", "payload"]), bit=st.integers(0, 10**6))
def test_every_single_bit_flip_in_sig_or_payload_is_rejected(payload: bytes, target: str, bit: int) -> None:
    data = seal(payload, SUB, KEY_A)
    field = getattr(wire.decode_envelope(data), target)
    if not field:
        return  # an empty payload has no bit to flip (the sig always has 512)
    i = bit % (8 * len(field))
    flipped = bytearray(field)
    flipped[i // 8] ^= 1 << (i % 8)
    assert _code(_tamper(data, **{target: bytes(flipped)})) == ErrorCode.SIGNATURE


def test_every_single_bit_flip_anywhere_in_the_envelope_is_rejected() -> None:
    # Exhaustive over the serialized envelope (framing, lengths, version, type, key id too).
    data = seal(b"\x08\x01 a small payload", SUB, KEY_A)
    assert _open(data)[0] == b"\x08\x01 a small payload"
    for i in range(8 * len(data)):
        flipped = bytearray(data)
        flipped[i // 8] ^= 1 << (i % 8)
        with pytest.raises(EnvelopeError):
            _open(bytes(flipped))


def test_wrong_key_id_is_rejected() -> None:
    data = seal(b"payload", SUB, KEY_A)
    assert _code(_tamper(data, key_id=KID_B)) == ErrorCode.SIGNATURE  # registered, but not the signer
    assert _code(_tamper(data, key_id=os.urandom(32))) == ErrorCode.UNAUTHENTICATED
    assert _code(_tamper(data, key_id=KID_A[:31])) == ErrorCode.UNAUTHENTICATED
    assert _code(_tamper(data, key_id=b"")) == ErrorCode.UNAUTHENTICATED


def test_signature_by_another_registered_key_is_rejected() -> None:
    by_b = wire.decode_envelope(seal(b"payload", SUB, KEY_B))
    claims_a = _tamper(seal(b"payload", SUB, KEY_A), sig=by_b.sig)
    assert _code(claims_a) == ErrorCode.SIGNATURE
    # honestly signed by B it opens, and names B: the caller compares that with the claimed sender
    assert _open(seal(b"payload", SUB, KEY_B))[1] == KID_B


def test_other_domain_tags_are_rejected() -> None:
    for domain in (DOMAIN_UPDATE, DOMAIN_RECEIPT, b"hacfed/v2/submit"):
        assert _code(seal(b"payload", SUB, KEY_A, domain)) == ErrorCode.SIGNATURE
    assert _open(seal(b"u", PayloadType.ROUND_UPDATE, KEY_A, DOMAIN_UPDATE), DOMAIN_UPDATE, PayloadType.ROUND_UPDATE)


def test_truncated_or_missing_signature_is_rejected() -> None:
    data = seal(b"payload", SUB, KEY_A)
    sig = wire.decode_envelope(data).sig
    for cut in (63, 32, 1, 0):
        assert _code(_tamper(data, sig=sig[:cut])) == ErrorCode.SIGNATURE
    assert _code(_tamper(data, sig=sig + b"\x00")) == ErrorCode.SIGNATURE


def test_unknown_signer_is_rejected() -> None:
    assert _code(seal(b"payload", SUB, STRANGER)) == ErrorCode.UNAUTHENTICATED
    with pytest.raises(EnvelopeError) as info:
        open_envelope(seal(b"payload", SUB, KEY_A), {}, DOMAIN_SUBMIT, SUB)  # a revoked key
    assert info.value.code == ErrorCode.UNAUTHENTICATED


def test_relabelled_or_unexpected_payload_type_is_rejected() -> None:
    data = seal(b"payload", SUB, KEY_A)
    assert _code(_tamper(data, payload_type=PayloadType.RECEIPT)) == ErrorCode.SIGNATURE
    assert _code(data, expected=PayloadType.ROUND_UPDATE) == ErrorCode.PAYLOAD_TYPE
    for odd in ("", "hacfed.v1.Submission\x00"):
        assert _code(_tamper(data, payload_type=odd)) == ErrorCode.SIGNATURE
    with pytest.raises(ValueError, match="domain tag"):
        _open(data, domain=b"")  # the verifier's own mistake is a bug, not a peer's failure


def test_version_size_and_garbage_are_rejected() -> None:
    data = seal(b"payload", SUB, KEY_A)
    assert _code(_tamper(data, version=2)) == ErrorCode.VERSION
    assert _code(data, max_bytes=len(data) - 1) == ErrorCode.SIZE
    assert _code(b"\xff\xff\xff") == ErrorCode.SCHEMA
    with pytest.raises(EnvelopeError) as info:
        seal(b"x" * 1000, SUB, KEY_A, max_bytes=500)
    assert info.value.code == ErrorCode.SIZE
    with pytest.raises(ValueError, match="NUL"):
        seal(b"x", SUB, KEY_A, b"hacfed\x00v1")


# ---- key files ------------------------------------------------------------------------------------


def test_private_key_file_is_owner_only_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "lab-a.key"
    save_private_key(KEY_A, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert key_id(load_private_key(path).public_key()) == KID_A
    assert [p.name for p in tmp_path.iterdir()] == ["lab-a.key"]  # no temp file left behind
    with pytest.raises(FileExistsError):
        save_private_key(KEY_B, path)
    save_private_key(KEY_B, path, overwrite=True)
    assert key_id(load_private_key(path).public_key()) == KID_B


def test_loose_permissions_and_wrong_key_types_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.key"
    save_private_key(KEY_A, path)
    path.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        load_private_key(path)
    x = X25519PrivateKey.generate()
    other = tmp_path / "x.key"
    other.write_bytes(x.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    other.chmod(0o600)
    with pytest.raises(ValueError, match="Ed25519"):
        load_private_key(other)
    pub = tmp_path / "x.pub"
    pub.write_bytes(
        x.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(ValueError, match="Ed25519"):
        load_public_key(pub)


def test_key_registry_maps_key_ids_to_participants(tmp_path: Path) -> None:
    save_public_key(KEY_A.public_key(), tmp_path / "lab-a.pub")
    save_public_key(KEY_B.public_key(), tmp_path / "lab_b2.pub")
    (tmp_path / "README.txt").write_text("not a key")
    registry = load_key_registry(tmp_path)
    assert registry.owner(KID_A) == "lab-a" and registry.owner(KID_B) == "lab_b2"
    assert registry.key_id_of("lab-a") == KID_A
    payload, kid = open_envelope(seal(b"hello", SUB, KEY_B), registry.keys, DOMAIN_SUBMIT, SUB)
    assert (payload, registry.owner(kid)) == (b"hello", "lab_b2")
    with pytest.raises(EnvelopeError):
        registry.owner(key_id(STRANGER.public_key()))


def test_key_registry_refuses_bad_entries(tmp_path: Path) -> None:
    save_public_key(KEY_A.public_key(), tmp_path / "lab-a.pub")
    save_public_key(KEY_A.public_key(), tmp_path / "lab-z.pub")
    with pytest.raises(ValueError, match="already registered for 'lab-a'"):
        load_key_registry(tmp_path)
    (tmp_path / "lab-z.pub").unlink()
    (tmp_path / "-bad.pub").write_bytes((tmp_path / "lab-a.pub").read_bytes())
    with pytest.raises(ValueError, match="participant id"):
        load_key_registry(tmp_path)
    with pytest.raises(ValueError, match="not a directory"):
        load_key_registry(tmp_path / "missing")
    (tmp_path / "-bad.pub").unlink()
    (tmp_path / "junk.pub").write_text("garbage")
    with pytest.raises(ValueError, match="not a PEM public key"):
        load_key_registry(tmp_path)
