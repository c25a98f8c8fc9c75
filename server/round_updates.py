"""The signed round updates of one round: the pool encoded once, one update per lab.

The round driver (`hacfed.server.driver`) asks for `for_lab(pid)` when it sends lab `pid` the
round; the first ask builds what every lab shares (the pool's trajectories, each encoded once by
`hacfed.wire.pool_splice`, and their selection index, `hacfed.server.coordinator.pool_share`), each
ask after that only splices the lab's selection together and signs it. So a round costs the
coordinator O(pool) encoding plus O(labs x selection) copying and hashing, not O(labs x pool)
protobuf work, and every update is the canonical encoding the lab's decoder requires.

When every lab's selection is the whole pool (at most K + 1 labs) one sealed update is shared by
all. A selection whose update would not fit in one message (`hacfed.wire.MAX_MESSAGE_BYTES`, less
room for the delivery around it) is sent with fewer peers per prompt, down to the lab's own
samples only, and the console says so once per round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.envelope import DOMAIN_UPDATE, seal_parts
from hacfed.messages import RoundUpdate
from hacfed.server.coordinator.pool_share import PoolShares
from hacfed.wire import MAX_MESSAGE_BYTES, PayloadType
from hacfed.wire.pool_splice import encode_pool_items, header_of, round_update_parts

DELIVERY_ROOM = 256 * 1024  # bytes kept free for the delivery's answers and the two envelopes


class RoundUpdates:
    def __init__(
        self, update: RoundUpdate, key: Ed25519PrivateKey, *, peers_per_prompt: int, salt: str,
        console: Callable[[str], None] = lambda line: None, max_bytes: int = MAX_MESSAGE_BYTES - DELIVERY_ROOM,
    ) -> None:
        self._key = key
        self._console = console
        self._max_bytes = max_bytes
        self._header = header_of(update)
        self._items = encode_pool_items(update.pool)
        self._shares = PoolShares(update.pool, peers_per_prompt, salt)
        self._sealed: dict[str, bytes] = {}
        self._shared: bytes | None = None
        self._too_big = False
        self._warned = False

    def for_lab(self, pid: str) -> bytes:
        """The sealed RoundUpdate envelope for participant `pid` (cached for the round)."""
        if pid in self._sealed:
            return self._sealed[pid]
        indices = self._shares.indices_for(pid)
        if not self._too_big and len(indices) == self._shares.size:
            if self._shared is None:
                payload = self._splice(indices)
                if _size(payload) <= self._max_bytes:
                    self._shared = self._seal(payload)
                else:
                    self._too_big = True  # every lab gets its own, smaller selection
            if self._shared is not None:
                return self._shared
        self._sealed[pid] = self._seal(self._fitted(pid, indices))
        return self._sealed[pid]

    def _fitted(self, pid: str, indices: tuple[int, ...]) -> list[bytes]:
        """The update of `indices` (the selection with K peers per prompt), or of fewer peers until
        it fits in `max_bytes` (down to the lab's own samples)."""
        k = self._shares.peers_per_prompt
        payload = self._splice(indices)
        while _size(payload) > self._max_bytes and k > 0:
            k -= 1
            payload = self._splice(self._shares.indices_for(pid, k))
        if k < self._shares.peers_per_prompt and not self._warned:
            self._warned = True
            self._console(f"round update for {pid}: {k} peers per prompt instead of {self._shares.peers_per_prompt}, "
                          f"to fit in one message ({_size(payload)} bytes; {self._max_bytes} available); lower "
                          f"pool_peers_per_prompt or max_new_tokens to send every lab the same")
        return payload

    def _splice(self, indices: Iterable[int]) -> list[bytes]:
        return round_update_parts(self._header, [self._items[i] for i in indices])

    def _seal(self, parts: list[bytes]) -> bytes:
        return seal_parts(parts, PayloadType.ROUND_UPDATE, self._key, DOMAIN_UPDATE)


def _size(parts: list[bytes]) -> int:
    return sum(len(p) for p in parts)


__all__ = ["DELIVERY_ROOM", "RoundUpdates"]
