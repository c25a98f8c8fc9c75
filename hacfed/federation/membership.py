"""Who may take part: the coordinator's registry of participant keys (`<keys-dir>/<id>.pub`).

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

from hacfed.envelope import KeyRegistry, load_key_registry
from hacfed.federation.keys import fingerprint, read_key_offer, register_public_key

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
