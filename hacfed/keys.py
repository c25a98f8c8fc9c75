"""Key files of a federation member and the control payload types both sides speak.

Run by both sides: hacfed-server and hacfed-client each create their key pair here, and the
coordinator's driver and the participant's service agree on the payload types below.

Each side creates its Ed25519 key pair on first start, in its own state directory:
`<state-dir>/coordinator.key` (+ `.pub`) for hacfed-server, `<state-dir>/participant.key` (+ `.pub`)
for hacfed-client (with its SuperNode key: `hacfed.enrolment`). Registration is out of band
(security.md T5): the operator registers a lab's enrolment line with `hacfed-server register`
(`hacfed.server.registry`), and each lab passes the coordinator's `coordinator.pub` to
`hacfed-client --coordinator-key`.

Trust on first use (development only, `hacfed-server --insecure --trust-on-first-use`): the driver
sends an unknown participant a signed key request; the participant answers with a key offer, its
raw public key as the payload of an envelope signed by that same key (`hacfed.clients.service`).
The driver checks the self-signature (proof that the sender holds the private key, NOT who it is)
and writes the key to the keys directory (`hacfed.server.membership`; only for a valid participant
id, `hacfed.identity`). Anyone who can reach the Fleet API first can claim any free participant id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hacfed.envelope import generate_key, key_id, load_private_key, load_public_key, save_private_key, save_public_key

# Payload types of the trust-on-first-use exchange (not protobuf messages: the request is empty,
# the offer is the 32 raw bytes of an Ed25519 public key).
KEY_REQUEST_TYPE = "hacfed.v1.KeyRequest"
# Coordinator -> participant after its final report is recorded (payload: the run id, UTF-8).
FINAL_ACK_TYPE = "hacfed.v1.FinalAck"
KEY_OFFER_TYPE = "hacfed.v1.KeyOffer"
RAW_PUBLIC_KEY_BYTES = 32
# <state-dir>/coordinator.key: signs what the coordinator sends to labs and its audit log's head.
COORDINATOR_KEY_STEM = "coordinator"


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


def describe_key(path: Path) -> str:
    """'<path> (key <fingerprint>)' for console lines."""
    return f"{path} (key {fingerprint(load_public_key(path))})"
