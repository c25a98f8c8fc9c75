"""The signed round updates of one round: the pool encoded once, one update per lab.

The round driver (`hacfed.server.driver`) asks for `for_lab(pid)` when it sends lab `pid` the
round; the first ask builds what every lab shares (the pool's trajectories, each encoded once by
`hacfed.wire.pool_splice`, and their selection index, `hacfed.server.coordinator.pool_share`), each
ask after that only splices the lab's selection together and signs it. The records of each
(prompt, source) group, consecutive in the pool, are joined into one block once, so a lab's update
is spliced from ~prompts x (K + 1) blocks rather than G times as many records. So a round costs the
coordinator O(pool) encoding plus O(labs x selection) copying and hashing, not O(labs x pool)
protobuf work, and every update is the canonical encoding the lab's decoder requires.

When every lab's selection is the whole pool (at most K + 1 labs) one sealed update is shared by
all. A selection whose update would not fit in one message (`hacfed.wire.MAX_MESSAGE_BYTES`, less
room for the delivery around it) is sent with fewer peers per prompt, down to the lab's own
samples only, and the console says so once per round.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.envelope import DOMAIN_UPDATE, seal_pieces
from hacfed.messages import RoundUpdate
from hacfed.server.coordinator import Coordinator
from hacfed.server.coordinator.config import CoordinatorConfig
from hacfed.server.coordinator.pool_share import PoolShares, share_salt
from hacfed.wire import MAX_MESSAGE_BYTES, PayloadType
from hacfed.wire.pool_splice import encode_pool_items, header_of, round_update_parts

DELIVERY_ROOM = 256 * 1024  # bytes kept free for the delivery's answers and the two envelopes


class SealedUpdates:
    """The `RoundUpdates` the driver sends now, built once per round and set of active labs."""

    def __init__(
        self, cfg: CoordinatorConfig, coordinator: Coordinator, key: Ed25519PrivateKey, console: Callable[[str], None],
    ) -> None:
        self._cfg = cfg
        self._coordinator = coordinator
        self._key = key
        self._console = console
        self._updates: dict[tuple[int, tuple[str, ...]], RoundUpdates] = {}

    def for_round(self, next_round: int) -> Callable[[str], Sequence[bytes]]:
        """The sealed update of `next_round` for each lab, as its envelope's pieces
        (`RoundUpdates.pieces_for_lab`)."""
        active = tuple(sorted(p.participant_id for p in self._coordinator.participants() if not p.quarantined))
        key = (next_round, active)
        if key not in self._updates:
            self._updates = {}  # the last round's pool and blocks go before this one's are built
            update = self._coordinator.engine.round_update(next_round)
            pool_round = update.pool_round
            records = self._coordinator.take_pool_records(pool_round) if pool_round is not None else None
            cfg = self._cfg
            self._updates = {key: RoundUpdates(update, self._key, peers_per_prompt=cfg.pool_peers_per_prompt,
                                               peer_choice=cfg.pool_peer_choice, records=records,
                                               credit=self._coordinator.intake.group_credit(pool_round),
                                               salt=share_salt(cfg.run_id, cfg.seed, next_round),
                                               console=self._console)}
        return self._updates[key].pieces_for_lab


class RoundUpdates:
    def __init__(
        self, update: RoundUpdate, key: Ed25519PrivateKey, *, peers_per_prompt: int, salt: str,
        peer_choice: str = "drawn",
        console: Callable[[str], None] = lambda line: None, max_bytes: int = MAX_MESSAGE_BYTES - DELIVERY_ROOM,
        records: Sequence[bytes | None] | None = None, credit: Mapping[tuple[str, str], float] | None = None,
    ) -> None:
        """records: the pool's records where the coordinator kept them from the submitted bytes
        (`Coordinator.pool_records`), aligned with `update.pool`; the rest are encoded here.
        credit: what the successes choice ranks each group by (`PoolShares`)."""
        self._key = key
        self._console = console
        self._max_bytes = max_bytes
        self._header = header_of(update)
        self._items = encode_pool_items(update.pool, records)
        self._shares = PoolShares(update.pool, peers_per_prompt, salt, peer_choice, credit)
        self._groups = self._shares.group_indices()  # (prompt, source) -> pool indices
        self._first = {group: indices[0] for group, indices in self._groups.items()}  # its place in the pool
        self._blocks = _group_blocks(self._items, self._groups)
        if self._blocks is not None:
            self._items = ()  # every record lives on in its group's block
        self._lock = threading.Lock()
        self._sealed: dict[str, tuple[bytes, ...]] = {}  # a lab's sealed update, as its envelope's pieces
        self._joined: dict[str, bytes] = {}
        self._shared: tuple[bytes, ...] | None = None
        self._too_big = False
        self._warned = False

    def for_lab(self, pid: str) -> bytes:
        """The sealed RoundUpdate envelope for participant `pid` (cached for the round, the same
        object each time); thread-safe."""
        pieces = self.pieces_for_lab(pid)
        if len(pieces) == 1:
            return pieces[0]
        with self._lock:
            joined = self._joined.get(pid)
        if joined is None:
            joined = b"".join(pieces)
            with self._lock:
                joined = self._joined.setdefault(pid, joined)
        return joined

    def pieces_for_lab(self, pid: str) -> tuple[bytes, ...]:
        """`for_lab(pid)` as pieces whose concatenation it is (cached for the round): the driver
        splices them into the lab's delivery (`hacfed.wire.framing.delivery_parts_of`), so a lab's
        ~6 MB update is copied once, into the delivery, and never joined on its own
        (bench/coordinator_scale.py). The pieces are the group blocks shared by every lab, so
        caching them holds no copy. Thread-safe: the driver seals several labs' deliveries at once
        (`Deliveries.send`); the shared update is built once, each lab's own selection
        outside the lock."""
        with self._lock:
            if pid in self._sealed:
                return self._sealed[pid]
            groups = self._shares.groups_for(pid)
            if not self._too_big and len(groups) == len(self._groups):  # the whole pool
                if self._shared is None:
                    payload = self._splice(groups)
                    if _size(payload) <= self._max_bytes:
                        self._shared = (b"".join(self._seal(payload)),)  # one copy, shared by every lab
                    else:
                        self._too_big = True  # every lab gets its own, smaller selection
                if self._shared is not None:
                    return self._shared
        sealed = self._seal(self._fitted(pid, groups))
        with self._lock:
            return self._sealed.setdefault(pid, sealed)

    def _fitted(self, pid: str, groups: list[tuple[str, str]]) -> list[bytes]:
        """The update of `groups` (the selection with K peers per prompt), or of fewer peers until
        it fits in `max_bytes` (down to the lab's own samples)."""
        k = self._shares.peers_per_prompt
        payload = self._splice(groups)
        while _size(payload) > self._max_bytes and k > 0:
            k -= 1
            payload = self._splice(self._shares.groups_for(pid, k))
        if k < self._shares.peers_per_prompt:
            with self._lock:
                first, self._warned = not self._warned, True
            if first:
                self._console(f"round update for {pid}: {k} peers per prompt instead of "
                              f"{self._shares.peers_per_prompt}, to fit in one message ({_size(payload)} bytes; "
                              f"{self._max_bytes} available); lower pool_peers_per_prompt or max_new_tokens to send "
                              f"every lab the same")
        return payload

    def _splice(self, groups: list[tuple[str, str]]) -> list[bytes]:
        """The update of the samples of `groups` in pool order (`PoolShares.indices_for`'s): from
        the group blocks when there are (the same bytes: each block is its group's consecutive
        records, the blocks taken in pool order), else record by record."""
        if self._blocks is not None:
            ordered = sorted(groups, key=self._first.__getitem__)
            return round_update_parts(self._header, [self._blocks[g] for g in ordered])
        indices = sorted(i for g in groups for i in self._groups[g])
        return round_update_parts(self._header, [self._items[i] for i in indices])

    def _seal(self, parts: list[bytes]) -> tuple[bytes, ...]:
        return tuple(seal_pieces(parts, PayloadType.ROUND_UPDATE, self._key, DOMAIN_UPDATE))


def _size(parts: list[bytes]) -> int:
    return sum(map(len, parts))


def _group_blocks(
    items: Sequence[bytes], groups: dict[tuple[str, str], list[int]],
) -> dict[tuple[str, str], bytes] | None:
    """Each group's records joined into one block, when every group's samples are consecutive in
    the pool (a journal pool is ordered by source, prompt position, sample index, so they are):
    a lab's update is then ~prompts x (K + 1) blocks of G records instead of G times as many
    pieces to list, hash and copy (bench/coordinator_scale.py). None when some group is not
    consecutive: the records are then spliced one by one."""
    blocks = {}
    for group, indices in groups.items():
        first = indices[0]
        if indices != list(range(first, first + len(indices))):
            return None
        blocks[group] = b"".join(items[first:first + len(indices)])
    return blocks


__all__ = ["DELIVERY_ROOM", "RoundUpdates"]
