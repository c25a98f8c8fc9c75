"""Who may take part: the coordinator's registry of participant keys (`<keys-dir>/<id>.pub`).

Runs in the coordinator's ServerApp process, inside the round driver (`hacfed.server.driver`).

Registration is out of band (security.md T5): an operator copies a lab's public key into the keys
directory, and the driver re-reads the directory while some connected participant is still unknown,
so a lab can be admitted without restarting the coordinator. With trust on first use (development
only) the key of an unknown participant is taken from its self-signed key offer instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from hacfed.envelope import (
    DOMAIN_SUBMIT, EnvelopeError, KeyRegistry, key_id, load_key_registry, load_public_key, open_envelope,
    save_public_key,
)
from hacfed.keys import KEY_OFFER_TYPE, RAW_PUBLIC_KEY_BYTES, fingerprint
from hacfed.wire import ErrorCode, WireError, decode_envelope

RELOAD_INTERVAL_S = 2.0


class Membership:
    def __init__(
        self, keys_dir: Path, console: Callable[[str], None], *, trust_on_first_use: bool = False,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys_dir = Path(keys_dir)
        self.keys_dir.mkdir(parents=True, exist_ok=True)
        self.trust_on_first_use = trust_on_first_use
        self._console = console
        self._monotonic = monotonic
        self.registry: KeyRegistry = load_key_registry(self.keys_dir)
        self._loaded_at = monotonic()
        self._told: set[str] = set()  # unknown participants already named on the console

    def known(self, participant_id: str) -> bool:
        return participant_id in set(self.registry.owners.values())

    def owner(self, kid: bytes) -> str:
        return self.registry.owner(kid)

    def admit(self, connected: set[str]) -> set[str]:
        """The connected participants with a registered key; re-reads the keys directory (at most
        every few seconds) while some are unknown, and names each unknown one once."""
        unknown = {pid for pid in connected if not self.known(pid)}
        if unknown - self._told or (unknown and self._monotonic() - self._loaded_at >= RELOAD_INTERVAL_S):
            self.reload()
            unknown = {pid for pid in connected if not self.known(pid)}
        for pid in sorted(unknown - self._told):
            self._told.add(pid)
            if self.trust_on_first_use:
                self._console(f"participant {pid} has no registered key: asking for it (trust on first use)")
            else:
                self._console(
                    f"REFUSED participant {pid}: unknown key (HACFED-E-UNAUTHENTICATED); to admit it, copy its "
                    f"participant.pub to {self.keys_dir / (pid + '.pub')}"
                )
        return connected - unknown

    def reload(self) -> None:
        self.registry = load_key_registry(self.keys_dir)
        self._loaded_at = self._monotonic()

    def accept_offer(self, participant_id: str, offer: bytes) -> Ed25519PublicKey:
        """Trust on first use: check the self-signed offer and write the key file (raises
        EnvelopeError / ValueError when the offer is bad or the id already has another key)."""
        if not self.trust_on_first_use:
            raise ValueError("key offers are accepted only with trust on first use")
        public_key = read_key_offer(offer)
        path = register_public_key(self.keys_dir, participant_id, public_key)
        self.reload()
        self._console(
            f"TRUST-ON-FIRST-USE: registered key {fingerprint(public_key)} for {participant_id} as {path} WITHOUT "
            f"out-of-band verification (development only; never use this across organizations)"
        )
        return public_key


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
