"""Signed envelopes: Ed25519 over bytes, verified before anything is parsed (security.md S2, T5, T9).

    key = generate_key(); save_private_key(key, "lab-a.key"); save_public_key(key.public_key(), "keys/lab-a.pub")
    data = seal(encode_submission(sub), PayloadType.SUBMISSION, key, DOMAIN_SUBMIT)
    registry = load_key_registry("keys/")
    payload, kid = open_envelope(data, registry.keys, DOMAIN_SUBMIT, PayloadType.SUBMISSION)
    sub = decode_submission(payload); assert sub.participant_id == registry.owner(kid)

What is signed is `domain || 0x00 || payload_type || 0x00 || sha256(payload)`:
- the domain tag separates purposes, so a signature over a participant's submission can never pass
  as an update, a receipt or anything a later version signs (neither tag nor type may contain NUL,
  which keeps the concatenation unambiguous);
- the payload type is bound too, so a signed message cannot be relabelled as another kind;
- signing a fixed-size digest keeps the signed message small whatever the payload size.
`key_id` = sha256 of the raw 32-byte public key; the verifier looks it up in its own registry and
never trusts a key shipped inside a message.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hacfed.identity import PARTICIPANT_ID_RULE, is_participant_id, printable
from hacfed.wire import MAX_MESSAGE_BYTES, ErrorCode, WireError, decode_envelope
from hacfed.wire.framing import envelope_parts

DOMAIN_SUBMIT = b"hacfed/v1/submit"  # participant -> coordinator: submissions
DOMAIN_UPDATE = b"hacfed/v1/update"  # coordinator -> participant: round updates and plans
DOMAIN_RECEIPT = b"hacfed/v1/receipt"  # coordinator -> participant: receipts and error replies
DOMAIN_IDENTITY = b"hacfed/v1/identity"  # participant -> coordinator: the signed hello (hacfed.hello)
DOMAIN_ENROLMENT = b"hacfed/v1/enrolment"  # a lab's enrolment line binds its keys (hacfed.enrolment)
SIGNATURE_BYTES = 64
KEY_ID_BYTES = 32
PUBLIC_KEY_SUFFIX = ".pub"


class EnvelopeError(WireError):
    """An envelope hacfed refuses: unknown key, bad signature, wrong type, size or version."""


def generate_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def key_id(public_key: Ed25519PublicKey) -> bytes:
    """sha256 of the raw public key (32 bytes): what an envelope names its signer by."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).digest()


def _check_domain(domain: bytes) -> None:
    if not isinstance(domain, bytes) or not domain or b"\x00" in domain:
        raise ValueError(f"domain tag must be non-empty bytes without NUL, got {domain!r}")


def signed_message(domain: bytes, payload_type: str, payload: bytes) -> bytes:
    """The exact bytes the Ed25519 signature covers (see module docstring)."""
    return _signed_digest(domain, payload_type, hashlib.sha256(payload).digest())


def _signed_digest(domain: bytes, payload_type: str, digest: bytes) -> bytes:
    _check_domain(domain)
    if not isinstance(payload_type, str) or not payload_type or "\x00" in payload_type:
        raise ValueError(f"payload_type must be a non-empty str without NUL, got {payload_type!r}")
    return domain + b"\x00" + payload_type.encode("utf-8") + b"\x00" + digest


def seal(
    payload: bytes,
    payload_type: str,
    private_key: Ed25519PrivateKey,
    domain: bytes = DOMAIN_SUBMIT,
    *,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> bytes:
    """Sign `payload` (already-encoded wire bytes) and return the serialized Envelope."""
    if not isinstance(payload, bytes):
        raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
    return seal_parts((payload,), payload_type, private_key, domain, max_bytes=max_bytes)


def seal_parts(
    parts: Sequence[bytes],
    payload_type: str,
    private_key: Ed25519PrivateKey,
    domain: bytes = DOMAIN_SUBMIT,
    *,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> bytes:
    """`seal(b"".join(parts), ...)` without building the payload first: the parts are hashed in turn
    and copied once, into the envelope. For the coordinator's per-lab updates and deliveries (each
    up to MAX_MESSAGE_BYTES), where every copy of the payload costs ~1.5 ms per MB."""
    return b"".join(seal_pieces(parts, payload_type, private_key, domain, max_bytes=max_bytes))


def seal_pieces(
    parts: Sequence[bytes],
    payload_type: str,
    private_key: Ed25519PrivateKey,
    domain: bytes = DOMAIN_SUBMIT,
    *,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> list[bytes]:
    """`seal_parts` as the pieces whose concatenation is the sealed envelope, nothing copied: for an
    envelope that is itself only a part of a larger one (a lab's round update inside its delivery,
    `hacfed.server.round_updates`), so its ~6 MB are copied once, into the outer envelope, instead
    of twice. The same signature and size cap as `seal_parts`."""
    h = hashlib.sha256()
    for part in parts:
        if not isinstance(part, bytes):
            raise TypeError(f"payload must be bytes, got {type(part).__name__}")
        h.update(part)
    sig = private_key.sign(_signed_digest(domain, payload_type, h.digest()))
    pieces = envelope_parts(parts, sig, key_id(private_key.public_key()), str(payload_type))
    size = sum(len(p) for p in pieces)
    if size > max_bytes:  # checked before the copy
        raise EnvelopeError(ErrorCode.SIZE, f"sealed envelope of {size} bytes exceeds the cap of {max_bytes}")
    return pieces


def open_envelope(
    data: bytes,
    trusted: Mapping[bytes, Ed25519PublicKey],
    domain: bytes,
    expected_type: str,
    *,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> tuple[bytes, bytes]:
    """Verify `data` and return `(payload, key_id)`; the payload is still unparsed bytes.

    Order matters: size and structure first (cheap), then the signer must be in `trusted`, then the
    signature, and only then is anything about the payload believed.
    """
    _check_domain(domain)  # the caller's own argument: a bug, not the peer's fault
    try:
        env = decode_envelope(data, max_bytes=max_bytes)
    except WireError as exc:
        raise EnvelopeError(exc.code, exc.message) from exc
    public_key = trusted.get(env.key_id) if len(env.key_id) == KEY_ID_BYTES else None
    if public_key is None:
        raise EnvelopeError(ErrorCode.UNAUTHENTICATED, f"signer key {env.key_id.hex()[:16]!r}... is not registered")
    if len(env.sig) != SIGNATURE_BYTES:
        raise EnvelopeError(ErrorCode.SIGNATURE, f"signature has {len(env.sig)} bytes, expected {SIGNATURE_BYTES}")
    try:
        message = signed_message(domain, env.payload_type, env.payload)
    except ValueError as exc:
        raise EnvelopeError(ErrorCode.SIGNATURE, f"unsignable payload type: {exc}") from exc
    try:
        public_key.verify(env.sig, message)
    except InvalidSignature:
        raise EnvelopeError(ErrorCode.SIGNATURE, "signature does not verify for this key, domain and payload") from None
    if env.payload_type != str(expected_type):
        raise EnvelopeError(
            ErrorCode.PAYLOAD_TYPE, f"expected payload {str(expected_type)!r}, got {env.payload_type!r}"
        )
    return env.payload, env.key_id


# ---- key files ------------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Temp file in the same folder (created with `mode`), fsync, rename, fsync the folder."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # only still there if something failed before the rename
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_private_key(private_key: Ed25519PrivateKey, path: str | os.PathLike, *, overwrite: bool = False) -> None:
    """PEM (PKCS#8, unencrypted) readable by the owner only. Refuses to replace an existing key
    unless `overwrite`: losing a key means re-registering the lab with the coordinator."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"refusing to overwrite the existing key {path} (pass overwrite=True)")
    pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_atomic(path, pem, 0o600)


def load_private_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    path = Path(path)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ValueError(f"private key {path} is accessible by others (mode {mode:o}); run: chmod 600 {path}")
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, hacfed needs an Ed25519 private key")
    return key


def save_public_key(public_key: Ed25519PublicKey, path: str | os.PathLike) -> None:
    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    write_atomic(Path(path), pem, 0o644)


def load_public_key(path: str | os.PathLike) -> Ed25519PublicKey:
    path = Path(path)
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except ValueError as exc:
        raise ValueError(f"{path} is not a PEM public key: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, hacfed needs an Ed25519 public key")
    return key


@dataclass(frozen=True)
class KeyRegistry:
    """Registered signers. `keys` is what `open_envelope` trusts; `owners` names each key's participant."""

    keys: Mapping[bytes, Ed25519PublicKey]
    owners: Mapping[bytes, str]

    def owner(self, kid: bytes) -> str:
        if kid not in self.owners:
            raise EnvelopeError(ErrorCode.UNAUTHENTICATED, f"key {kid.hex()[:16]!r}... is not registered")
        return self.owners[kid]

    def key_id_of(self, participant_id: str) -> bytes:
        for kid, owner in self.owners.items():
            if owner == participant_id:
                return kid
        raise KeyError(f"participant {participant_id!r} has no registered key")


def load_key_registry(directory: str | os.PathLike) -> KeyRegistry:
    """Every `<participant_id>.pub` in `directory` (registration is out of band, by an admin: T5)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"key registry {directory} is not a directory")
    keys: dict[bytes, Ed25519PublicKey] = {}
    owners: dict[bytes, str] = {}
    for path in sorted(directory.glob(f"*{PUBLIC_KEY_SUFFIX}")):
        participant = path.name[: -len(PUBLIC_KEY_SUFFIX)]
        if not is_participant_id(participant):
            raise ValueError(f"{path}: participant id {printable(participant)} must be {PARTICIPANT_ID_RULE}")
        key = load_public_key(path)
        kid = key_id(key)
        if kid in owners:
            raise ValueError(f"{path}: the same key is already registered for {owners[kid]!r}")
        keys[kid], owners[kid] = key, participant
    return KeyRegistry(keys, owners)

