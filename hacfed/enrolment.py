"""A lab's keys and its one-line enrolment: what the coordinator's operator registers (security.md T5).

    hacfed-client keys --state-dir state/lab-b --participant-id lab-b     # the lab: prints the line
    hacfed-server register --state-dir STATE enrolment.txt               # the operator

Used by both sides: hacfed-client creates the keys and the line, hacfed-server's `register` parses
and checks it (`hacfed.server.registry`).

A lab has two key pairs in its state directory:
- `participant.key` (Ed25519, `hacfed.keys`): signs every submission and the hello (`hacfed.hello`);
- `supernode.key` (ECDSA P-384, OpenSSH format, what `flower-supernode --auth-supernode-private-key`
  reads): Flower's SuperNode authentication. The coordinator registers its public half with the
  SuperLink (`flwr supernode register`), so only this lab's SuperNode can connect as this lab's node.

The enrolment line carries the participant id and both public keys, signed with each of the two
private keys over the same content (so the two keys are bound to each other and to the id by their
holder):

    hacfed-enrolment/v1 lab-b ed25519:<base64 raw key> ecdsa-sha2-nistp384:<base64 OpenSSH blob> \
        sig:<base64> nodesig:<base64>      (one line; folded here)

`sig` is the participant key's Ed25519 signature, `nodesig` the SuperNode key's deterministic ECDSA
signature (DER; SHA-256/384/512 for P-256/384/521). Without `nodesig`, a lab could enrol with
another lab's public SuperNode key, and since a key is registered for one lab only, that would
block the other lab's own enrolment; a line without it is refused. The signatures prove
possession, not identity: the operator compares the fingerprints that both commands print with the
lab over another channel (a call, a signed e-mail) before registering.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hacfed.envelope import DOMAIN_ENROLMENT, signed_message, write_atomic
from hacfed.identity import check_participant_id, printable
from hacfed.keys import fingerprint, raw_public_bytes

ENROLMENT_TAG = "hacfed-enrolment/v1"
ENROLMENT_TYPE = "hacfed.v1.Enrolment"
NODE_PROOF_TYPE = "hacfed.v1.EnrolmentSupernodeProof"  # what the SuperNode key signs: the same content
_CURVE_HASHES = {"secp256r1": hashes.SHA256, "secp384r1": hashes.SHA384, "secp521r1": hashes.SHA512}
ENROLMENT_FILE = "enrolment.txt"
SUPERNODE_KEY = "supernode.key"
SUPERNODE_PUB = "supernode.pub"
_MAX_LINE = 4096
MAX_ENROLMENT_BYTES = 4 * _MAX_LINE  # what parse_enrolment looks at; a real enrolment is ~500 bytes


@dataclass(frozen=True)
class SupernodeKeyFiles:
    private: Path
    public: Path
    created: bool


def ensure_supernode_key(directory: Path) -> SupernodeKeyFiles:
    """`<directory>/supernode.key` (0600) and `.pub`, generated on first use (ECDSA P-384, the curve
    Flower generates for its own SuperNodes), never replaced."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / SUPERNODE_KEY, directory / SUPERNODE_PUB
    created = not private.exists()
    if created:
        key = ec.generate_private_key(ec.SECP384R1())
        write_atomic(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                 serialization.NoEncryption()), 0o600)
    else:
        key = load_supernode_private_key(private)
    openssh = supernode_public_text(key.public_key()).encode("ascii") + b"\n"
    if not public.exists() or public.read_bytes() != openssh:
        write_atomic(public, openssh, 0o644)
    return SupernodeKeyFiles(private, public, created)


def load_supernode_private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    path = Path(path)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ValueError(f"private key {path} is accessible by others (mode {mode:o}); run: chmod 600 {path}")
    try:
        key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"{path} is not an OpenSSH private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, a SuperNode needs an ECDSA (NIST curve) key")
    return key


def supernode_public_text(public_key: ec.EllipticCurvePublicKey) -> str:
    """The OpenSSH one-line form, e.g. 'ecdsa-sha2-nistp384 AAAA...' (what `flwr supernode register` reads)."""
    return public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode("ascii")


def load_supernode_public_text(text: str, where: str) -> ec.EllipticCurvePublicKey:
    try:
        key = serialization.load_ssh_public_key(text.strip().encode("ascii"))
    except (ValueError, UnsupportedAlgorithm, UnicodeEncodeError):
        raise ValueError(f"{where}: not an OpenSSH public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in ("secp256r1", "secp384r1", "secp521r1"):
        raise ValueError(f"{where}: a SuperNode key must be ECDSA on a NIST curve (P-256, P-384 or P-521)")
    return key


def supernode_fingerprint(public_key: ec.EllipticCurvePublicKey) -> str:
    """16 hex digits of sha256 over the OpenSSH public key line (without a comment)."""
    return hashlib.sha256(supernode_public_text(public_key).encode("ascii")).hexdigest()[:16]


def supernode_key_hash(public_key: ec.EllipticCurvePublicKey) -> str:
    """The full sha256 hex of the OpenSSH line: how the registry and the node bindings name a key."""
    return hashlib.sha256(supernode_public_text(public_key).encode("ascii")).hexdigest()


@dataclass(frozen=True)
class Enrolment:
    participant_id: str
    signing_key: Ed25519PublicKey
    supernode_key: ec.EllipticCurvePublicKey

    def describe(self) -> str:
        """The fingerprints to compare with the lab out of band."""
        return (f"participant {self.participant_id}: signing key {fingerprint(self.signing_key)}, "
                f"SuperNode key {supernode_fingerprint(self.supernode_key)}")


def _payload(participant_id: str, signing_key: Ed25519PublicKey, supernode_text: str) -> bytes:
    return b"\x00".join([participant_id.encode("ascii"), raw_public_bytes(signing_key),
                         supernode_text.encode("ascii")])


def _node_signature_algorithm(key: ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey) -> ec.ECDSA:
    return ec.ECDSA(_CURVE_HASHES[key.curve.name](), deterministic_signing=True)


def make_enrolment(
    participant_id: str, signing_key: Ed25519PrivateKey, supernode_key: ec.EllipticCurvePrivateKey
) -> str:
    """The one-line enrolment of a lab, signed with both of its private keys (module docstring).
    The same keys always give the same line (both signatures are deterministic)."""
    check_participant_id(participant_id)
    if not isinstance(supernode_key, ec.EllipticCurvePrivateKey) or supernode_key.curve.name not in _CURVE_HASHES:
        raise ValueError("make_enrolment needs the SuperNode's ECDSA private key (P-256, P-384 or P-521)")
    public = signing_key.public_key()
    ssh_type, blob = supernode_public_text(supernode_key.public_key()).split()[:2]
    payload = _payload(participant_id, public, f"{ssh_type} {blob}")
    signature = signing_key.sign(signed_message(DOMAIN_ENROLMENT, ENROLMENT_TYPE, payload))
    node_signature = supernode_key.sign(signed_message(DOMAIN_ENROLMENT, NODE_PROOF_TYPE, payload),
                                        _node_signature_algorithm(supernode_key))
    b64 = base64.b64encode
    return (f"{ENROLMENT_TAG} {participant_id} ed25519:{b64(raw_public_bytes(public)).decode()} "
            f"{ssh_type}:{blob} sig:{b64(signature).decode()} nodesig:{b64(node_signature).decode()}")


def read_enrolment_file(path: Path) -> str:
    """The text of an enrolment file: a regular file of at most MAX_ENROLMENT_BYTES, else one
    ValueError (never a read of a device, a FIFO or a huge file: none of them is an enrolment)."""
    path = Path(path).expanduser()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file; give the lab's enrolment.txt")
        data = os.read(fd, MAX_ENROLMENT_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    return check_enrolment_size(data, str(path))


def check_enrolment_size(data: bytes, where: str) -> str:
    if len(data) > MAX_ENROLMENT_BYTES:
        raise ValueError(f"{where} is over {MAX_ENROLMENT_BYTES} bytes; an enrolment is one line of a few hundred")
    return data.decode("utf-8", errors="replace")


def parse_enrolment(text: str) -> Enrolment:
    """Read and check an enrolment line (the first non-empty line of `text`); one clear
    ValueError for anything wrong, with the offending text shown safely."""
    lines = [line.strip() for line in text[: _MAX_LINE * 4].splitlines() if line.strip()]
    if not lines or len(lines[0]) > _MAX_LINE:
        raise ValueError("no enrolment line found (expected one line starting with hacfed-enrolment/v1)")
    fields = lines[0].split(" ")
    if len(fields) not in (5, 6) or fields[0] != ENROLMENT_TAG:
        raise ValueError(f"not a {ENROLMENT_TAG} line: {printable(lines[0], 80)}")
    if len(fields) == 5 and fields[4].startswith("sig:"):
        raise ValueError("this enrolment carries no proof that its sender holds the SuperNode key (no nodesig:, made "
                         "by an older hacfed-client); the lab runs hacfed-client keys again and sends the new line")
    if len(fields) == 5:
        raise ValueError(f"malformed enrolment line: {printable(lines[0], 80)}")
    _, participant_id, signing_field, supernode_field, sig_field, node_sig_field = fields
    check_participant_id(participant_id, "the enrolment's participant id")
    if (not signing_field.startswith("ed25519:") or not sig_field.startswith("sig:") or ":" not in supernode_field
            or not node_sig_field.startswith("nodesig:")):
        raise ValueError(f"malformed enrolment line: {printable(lines[0], 80)}")
    try:
        signing_key = Ed25519PublicKey.from_public_bytes(base64.b64decode(signing_field[8:], validate=True))
        signature = base64.b64decode(sig_field[4:], validate=True)
        node_signature = base64.b64decode(node_sig_field[8:], validate=True)
    except (ValueError, binascii.Error):
        raise ValueError("the enrolment's signing key or signature is not valid base64 / Ed25519") from None
    supernode_text = supernode_field.replace(":", " ", 1)
    supernode_key = load_supernode_public_text(supernode_text, "the enrolment's SuperNode key")
    payload = _payload(participant_id, signing_key, supernode_text)
    try:
        signing_key.verify(signature, signed_message(DOMAIN_ENROLMENT, ENROLMENT_TYPE, payload))
    except InvalidSignature:
        raise ValueError(f"the enrolment of {participant_id} is not signed by its own signing key "
                         f"(edited or corrupted in transit)") from None
    try:
        supernode_key.verify(node_signature, signed_message(DOMAIN_ENROLMENT, NODE_PROOF_TYPE, payload),
                             _node_signature_algorithm(supernode_key))
    except InvalidSignature:
        raise ValueError(f"the enrolment of {participant_id} is not signed by its SuperNode key: its sender does not "
                         f"hold that key (another lab's public key?), or the line was edited") from None
    return Enrolment(participant_id, signing_key, supernode_key)
