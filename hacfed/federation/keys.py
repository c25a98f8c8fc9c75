"""Key files of a federation member, the control payload types, and the trust-on-first-use key offer.

Each side creates its Ed25519 key pair on first start, in its own state directory:
`<state-dir>/coordinator.key` (+ `.pub`) for hacfed-server, `<state-dir>/participant.key` (+ `.pub`)
for hacfed-client. Registration is out of band (security.md T5): the coordinator's operator copies
a lab's `participant.pub` into the keys directory as `<participant-id>.pub`, and each lab passes the
coordinator's `coordinator.pub` to `hacfed-client --coordinator-key`.

Trust on first use (development only, `hacfed-server --insecure --trust-on-first-use`): the driver
sends an unknown participant a signed key request; the participant answers with a key offer, its
raw public key as the payload of an envelope signed by that same key. The driver checks the
self-signature (proof that the sender holds the private key, NOT who it is) and writes the key to
the keys directory. Anyone who can reach the Fleet API first can claim any free participant id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hacfed.envelope import (
    DOMAIN_SUBMIT,
    EnvelopeError,
    generate_key,
    key_id,
    load_private_key,
    load_public_key,
    open_envelope,
    save_private_key,
    save_public_key,
    seal,
)
from hacfed.wire import ErrorCode, WireError, decode_envelope

# Payload types of the trust-on-first-use exchange (not protobuf messages: the request is empty,
# the offer is the 32 raw bytes of an Ed25519 public key).
KEY_REQUEST_TYPE = "hacfed.v1.KeyRequest"
# Coordinator -> participant after its final report is recorded (payload: the run id, UTF-8).
FINAL_ACK_TYPE = "hacfed.v1.FinalAck"
KEY_OFFER_TYPE = "hacfed.v1.KeyOffer"
RAW_PUBLIC_KEY_BYTES = 32


@dataclass(frozen=True)
class KeyPairFiles:
    private: Path
    public: Path
    created: bool  # True when this call generated the pair

    def load(self) -> Ed25519PrivateKey:
        return load_private_key(self.private)


def ensure_key_pair(directory: Path, stem: str) -> KeyPairFiles:
    """`<directory>/<stem>.key` and `.pub`, generated on first use. An existing private key is
    never replaced; a missing `.pub` beside it is rewritten from it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / f"{stem}.key", directory / f"{stem}.pub"
    created = not private.exists()
    if created:
        key = generate_key()
        save_private_key(key, private)
    else:
        key = load_private_key(private)
    if not public.exists():
        save_public_key(key.public_key(), public)
    elif key_id(load_public_key(public)) != key_id(key.public_key()):
        raise ValueError(f"{public} does not match the private key {private}; delete the stale {public.name}")
    return KeyPairFiles(private, public, created)


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """A short, printable key id: the first 16 hex digits of sha256(raw public key)."""
    return key_id(public_key).hex()[:16]


def raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def make_key_offer(private_key: Ed25519PrivateKey) -> bytes:
    """A participant's answer to a key request: its public key, signed by itself."""
    return seal(raw_public_bytes(private_key.public_key()), KEY_OFFER_TYPE, private_key, DOMAIN_SUBMIT)


def read_key_offer(data: bytes) -> Ed25519PublicKey:
    """The public key of a self-signed key offer; `EnvelopeError` if it is not one."""
    try:
        raw = decode_envelope(data)
    except WireError as exc:
        raise EnvelopeError(exc.code, f"not a key offer: {exc.message}") from None
    if raw.payload_type != KEY_OFFER_TYPE or len(raw.payload) != RAW_PUBLIC_KEY_BYTES:
        raise EnvelopeError(ErrorCode.PAYLOAD_TYPE, f"expected a {KEY_OFFER_TYPE} of 32 bytes, got {raw.payload_type!r}")
    try:
        public_key = Ed25519PublicKey.from_public_bytes(raw.payload)
    except ValueError as exc:
        raise EnvelopeError(ErrorCode.SCHEMA, f"key offer holds no valid Ed25519 key: {exc}") from None
    open_envelope(data, {key_id(public_key): public_key}, DOMAIN_SUBMIT, KEY_OFFER_TYPE)
    return public_key


def register_public_key(keys_dir: Path, participant_id: str, public_key: Ed25519PublicKey) -> Path:
    """Write `<keys_dir>/<participant_id>.pub`; refuses to replace a different registered key."""
    path = Path(keys_dir) / f"{participant_id}.pub"
    if path.exists():
        if key_id(load_public_key(path)) != key_id(public_key):
            raise ValueError(f"{path} already holds another key for {participant_id!r}")
        return path
    save_public_key(public_key, path)
    return path


def describe_key(path: Path) -> str:
    """'<path> (key <fingerprint>)' for console lines."""
    return f"{path} (key {fingerprint(load_public_key(path))})"
