"""The signed hello: how a Flower node proves it speaks for a registered participant (security.md T5).

Used by both sides: the coordinator's round driver makes challenges and checks proofs (through
`hacfed.server.membership`); a lab's participant service answers them (`hacfed.clients.service`).

The coordinator's ServerApp maps a Flower node to a participant only after that node's participant
proves it holds the participant's registered Ed25519 key:

    coordinator -> node N:  seal(challenge, HELLO_REQUEST_TYPE, coordinator key, DOMAIN_UPDATE)
                            challenge = "hacfed-hello/v1" NUL run id NUL N NUL 128-bit random hex
    node N -> coordinator:  seal(challenge NUL participant id, HELLO_PROOF_TYPE, participant key,
                            DOMAIN_IDENTITY)

A fresh challenge per hello and node makes a proof useless anywhere else. With SuperNode
authentication on (TLS deployments), the coordinator also requires that N is the node Flower
authenticated with the SuperNode key registered for that participant (`hacfed.server.membership`).
"""

from __future__ import annotations

import secrets

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hacfed.envelope import DOMAIN_IDENTITY, EnvelopeError, key_id, open_envelope, seal
from hacfed.identity import check_participant_id
from hacfed.wire import ErrorCode

HELLO_REQUEST_TYPE = "hacfed.v1.HelloRequest"
HELLO_PROOF_TYPE = "hacfed.v1.HelloProof"
_HELLO_TAG = b"hacfed-hello/v1"
_MAX_CHALLENGE_BYTES = 512


def hello_challenge(run_id: str, node_id: int) -> bytes:
    """A fresh challenge for node `node_id` of run `run_id`."""
    return b"\x00".join([_HELLO_TAG, run_id.encode("utf-8"), str(int(node_id)).encode("ascii"),
                         secrets.token_hex(16).encode("ascii")])


def check_challenge(challenge: bytes) -> None:
    """What a participant checks before it signs a challenge: the form above, nothing else."""
    parts = challenge.split(b"\x00")
    if len(challenge) > _MAX_CHALLENGE_BYTES or len(parts) != 4 or parts[0] != _HELLO_TAG \
            or not parts[2].isdigit() or len(parts[3]) != 32:
        raise EnvelopeError(ErrorCode.SCHEMA, "not a hello challenge")


def prove_identity(challenge: bytes, participant_id: str, private_key: Ed25519PrivateKey) -> bytes:
    """The participant's answer to a hello: the challenge and its id, signed with its key."""
    check_challenge(challenge)
    check_participant_id(participant_id)
    return seal(challenge + b"\x00" + participant_id.encode("ascii"), HELLO_PROOF_TYPE, private_key,
                DOMAIN_IDENTITY)


def verify_identity(proof: bytes, challenge: bytes, participant_id: str, public_key: Ed25519PublicKey) -> None:
    """Raises `EnvelopeError` unless `proof` answers `challenge` for `participant_id`, signed by
    `public_key` (the participant's registered signing key)."""
    payload, _ = open_envelope(proof, {key_id(public_key): public_key}, DOMAIN_IDENTITY, HELLO_PROOF_TYPE)
    if payload != challenge + b"\x00" + participant_id.encode("ascii"):
        raise EnvelopeError(
            ErrorCode.IDENTITY_MISMATCH, "the hello proof answers another challenge or names another id"
        )
