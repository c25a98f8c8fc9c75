"""Who may take part, and which Flower node speaks for whom (the round driver's view of the registry).

Runs in the coordinator's ServerApp process, inside the round driver (`hacfed.server.driver`).

A Flower node becomes participant P only when (security.md T5, S1):
1. P is a valid participant id (`hacfed.identity`) registered in the keys directory
   (`hacfed.server.registry`);
2. its hello proof answers this node's fresh challenge and is signed with P's registered Ed25519
   key (`hacfed.hello`);
3. with SuperNode authentication (every TLS deployment), the node is the one Flower authenticated
   with P's registered SuperNode key: its node id is P's in the bindings that hacfed-server keeps
   (`hacfed.server.node_auth`).
Anything else is refused and named once on the console, ids only through `printable`. The
registry and the bindings are re-read whenever they change (a few stat calls, checked at every
round and before every submission is opened), so a registration or a revocation takes effect in
the running round: a revoked lab's next submission is refused and it is sent nothing more.

With trust on first use (development only, plaintext loopback) an unknown valid id is mapped to
its node without a proof, and its self-signed key offer (`hacfed.keys`) registers its key.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from hacfed.envelope import DOMAIN_SUBMIT, EnvelopeError, key_id, open_envelope
from hacfed.hello import verify_identity
from hacfed.identity import is_participant_id, printable
from hacfed.keys import KEY_OFFER_TYPE, RAW_PUBLIC_KEY_BYTES, fingerprint
from hacfed.server.node_auth import Binding, read_bindings
from hacfed.server.registry import Registry, load_registry, register_signing_key, signature
from hacfed.wire import ErrorCode, WireError, decode_envelope

NOT_REGISTERED = ("not registered (HACFED-E-UNKNOWN-PARTICIPANT); the operator registers a lab with "
                  "hacfed-server register <its enrolment.txt>")


class Membership:
    def __init__(
        self, keys_dir: Path, console: Callable[[str], None], *, trust_on_first_use: bool = False,
        bindings_path: Path | None = None,
    ) -> None:
        """`bindings_path`: where hacfed-server records which Flower node id each lab's SuperNode key
        got (SuperNode authentication on); None without it (plaintext development deployments)."""
        self.keys_dir = Path(keys_dir)
        self.keys_dir.mkdir(parents=True, exist_ok=True)
        self.trust_on_first_use = trust_on_first_use
        self.bindings_path = None if bindings_path is None else Path(bindings_path)
        self._console = console
        self.registry = Registry()
        self.bindings: dict[str, Binding] = {}
        self._seen: tuple | None = None
        self._told: set[str] = set()  # console lines already said (each refusal once)
        self.refresh()

    # -- the registry -----------------------------------------------------------------------------

    def refresh(self) -> None:
        """Re-read the registry and the bindings if either changed since the last call."""
        seen = (signature(self.keys_dir), _stat(self.bindings_path))
        if seen == self._seen:
            return
        self._seen = seen
        self.registry = load_registry(self.keys_dir)
        self.bindings = read_bindings(self.bindings_path) if self.bindings_path is not None else {}
        for problem in self.registry.problems:
            self._say_once(f"registry: {problem}")

    def known(self, participant_id: str) -> bool:
        return participant_id in self.registry.entries

    def owner(self, kid: bytes) -> str:
        return self.registry.owner(kid)

    def keys(self) -> dict[bytes, Ed25519PublicKey]:
        return self.registry.keys

    # -- which node is whom -----------------------------------------------------------------------

    def identify(self, node_id: int, claimed: object, proof: bytes | None, challenge: bytes | None) -> str | None:
        """None when node `node_id` may be mapped to participant `claimed`, else why not (and the
        refusal is named on the console once)."""
        self.refresh()
        reason = self._refusal(node_id, claimed, proof, challenge)
        if reason is not None:
            self._say_once(f"REFUSED node {node_id} as participant {printable(claimed)}: {reason}")
        return reason

    def _refusal(self, node_id: int, claimed: object, proof: bytes | None, challenge: bytes | None) -> str | None:
        if not is_participant_id(claimed):
            return "not a valid participant id (HACFED-E-SCHEMA)"
        assert isinstance(claimed, str)
        entry = self.registry.entries.get(claimed)
        if entry is None:
            if self.trust_on_first_use:  # mapped, not admitted: its key offer comes next (development only)
                self._say_once(f"participant {claimed} has no registered key: asking for it (trust on first use)")
                return None
            return NOT_REGISTERED
        if proof is None or challenge is None:
            return "no signed hello (HACFED-E-UNAUTHENTICATED)"
        try:
            verify_identity(proof, challenge, claimed, entry.signing_key)
        except WireError as exc:
            return f"its hello is not signed with the registered key of {claimed} ({exc.code})"
        if self.bindings_path is not None:
            bound = self.bindings.get(claimed)
            if bound is None or bound.supernode_key != entry.supernode_hash:
                return "its SuperNode key is not registered with the SuperLink (yet) (HACFED-E-UNAUTHENTICATED)"
            if bound.node_id != node_id:
                return (f"Flower authenticated this node with another SuperNode key than {claimed}'s "
                        f"(node {bound.node_id}) (HACFED-E-IDENTITY-MISMATCH)")
        return None

    def admit(self, participants: Mapping[int, str]) -> set[str]:
        """The mapped participants that are registered now (and, with SuperNode authentication,
        still on the node bound to their key)."""
        self.refresh()
        admitted = set()
        for node_id, pid in participants.items():
            entry = self.registry.entries.get(pid)
            if entry is None:
                continue
            if self.bindings_path is not None:
                bound = self.bindings.get(pid)
                if bound is None or bound.node_id != node_id or bound.supernode_key != entry.supernode_hash:
                    continue
            admitted.add(pid)
        return admitted

    # -- trust on first use -----------------------------------------------------------------------

    def accept_offer(self, participant_id: str, offer: bytes) -> Ed25519PublicKey:
        """Trust on first use: check the self-signed offer and write the key file (raises
        EnvelopeError / ValueError when the offer or the id is bad, or the id has another key)."""
        if not self.trust_on_first_use:
            raise ValueError("key offers are accepted only with trust on first use")
        public_key = read_key_offer(offer)
        path = register_signing_key(self.keys_dir, participant_id, public_key)
        self._seen = None
        self.refresh()
        self._console(
            f"TRUST-ON-FIRST-USE: registered key {fingerprint(public_key)} for {participant_id} as {path} WITHOUT "
            f"out-of-band verification (development only; never use this across organizations)"
        )
        return public_key

    def _say_once(self, line: str) -> None:
        if line not in self._told:
            self._told.add(line)
            self._console(line)


def _stat(path: Path | None) -> tuple | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ()
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def read_key_offer(data: bytes) -> Ed25519PublicKey:
    """The public key of a self-signed key offer; `EnvelopeError` if it is not one."""
    try:
        raw = decode_envelope(data)
    except WireError as exc:
        raise EnvelopeError(exc.code, f"not a key offer: {exc.message}") from None
    if raw.payload_type != KEY_OFFER_TYPE or len(raw.payload) != RAW_PUBLIC_KEY_BYTES:
        raise EnvelopeError(ErrorCode.PAYLOAD_TYPE,
                            f"expected a {KEY_OFFER_TYPE} of 32 bytes, got {raw.payload_type!r}")
    try:
        public_key = Ed25519PublicKey.from_public_bytes(raw.payload)
    except ValueError as exc:
        raise EnvelopeError(ErrorCode.SCHEMA, f"key offer holds no valid Ed25519 key: {exc}") from None
    open_envelope(data, {key_id(public_key): public_key}, DOMAIN_SUBMIT, KEY_OFFER_TYPE)
    return public_key
