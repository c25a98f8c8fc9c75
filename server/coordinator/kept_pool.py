"""The samples a coordinator saw committed, kept in memory to publish the next pool without the journal.

Runs in the coordinator's ServerApp process and, in-process, in `hacfed sim`, owned by `Coordinator`
(`hacfed.server.coordinator.state`), which calls it under its lock only. Its intake hands it every
committed submission's accepted samples (`remember`); when the round closes and its pool is
published they are the round's rewards and pool, as long as they are exactly what the journal holds
(no restart in between, no purge since), without reading back and rebuilding the round's samples
(bench/coordinator_scale.py). Otherwise the journal is read.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Mapping, Sequence

from hacfed.server.coordinator.journal import Journal
from hacfed.server.coordinator.journal_schema import as_journaled
from hacfed.server.coordinator.validation import AcceptedTrajectory
from hacfed.trajectory import Trajectory

_POOL_KEY = itemgetter(0, 1, 2)  # the journal's pool order: participant, prompt position, sample index


class KeptSamples:
    """Accepted samples by round, the latest published pool, and its records (see the module docstring)."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._pools: dict[int, tuple[Trajectory, ...]] = {}  # the latest published pool only
        self._pool_records: dict[int, tuple[bytes, ...]] = {}  # the pool's records, when all kept (`take_records`)
        # round -> (participant, prompt position, sample index, trajectory, its pool record or None)
        # of every sample this process saw committed as accepted in that round (`remember`, `_pool_of`).
        self._accepted: dict[int, list[tuple[str, int, int, Trajectory, bytes | None]]] = {}

    def rounds(self) -> set[int]:
        """The rounds whose accepted samples are kept."""
        return set(self._accepted)

    def pool_rounds(self) -> list[int]:
        """The rounds whose published pool is kept (at most the latest)."""
        return list(self._pools)

    def remember(
        self, round_id: int, accepted: Sequence[AcceptedTrajectory], records: Mapping[int, bytes] | None = None,
    ) -> None:
        """Keep a committed submission's accepted samples for `pool` (called after the COMMIT:
        nothing is kept that the journal does not hold). Rounds before round_id - 1 are dropped.
        `records`: the pool record of each sample as submitted, by `id()` of the decoded sample; a
        sample is kept with its record only when it is that very object (judging left it as
        submitted: the verified reward equals the claim, no local ids), so the record is its own."""
        for old in [r for r in self._accepted if r < round_id - 1]:
            del self._accepted[old]
        kept = self._accepted.setdefault(round_id, [])
        records = records or {}
        kept.extend((a.trajectory.source_id, a.prompt_pos, a.idx, a.trajectory, records.get(id(a.trajectory)))
                    for a in accepted)

    def pool(self, round_id: int) -> tuple[Trajectory, ...]:
        """The pool of a closed round (`_pool_of`); only the latest is kept, so memory does not grow
        with the rounds."""
        if round_id not in self._pools:
            pool, records = self._pool_of(round_id)
            self._pools = {round_id: pool}
            self._pool_records = {round_id: records} if records is not None else {}
        return self._pools[round_id]

    def accepted_rewards(self, round_id: int) -> list[tuple[str, float]]:
        """`journal.accepted_rewards(round_id)`, from the samples kept at intake when they are the
        journal's (`_kept`): the verified rewards, as the journal stored them (`float`), in pool order."""
        kept = self._kept(round_id)
        if kept is None:
            return self._journal.accepted_rewards(round_id)
        return [(pid, float(t.reward)) for pid, _, _, t, _ in kept]

    def take_records(self, pool_round: int) -> tuple[bytes, ...] | None:
        """The `RoundUpdate.pool` record of each sample of the pool that `RoundEngine.round_update(pool_round + 1)`
        published, aligned with it, cut from the bytes its labs submitted
        (`hacfed.wire.pool_splice.submission_pool_records`), for the round driver's updates
        (`hacfed.server.round_updates`), which keep them as blocks: handed over once and then
        dropped here (~48 MB at 64 labs), so a second ask gets None. None when the pool was read
        back from the journal or some sample came without its bytes (in-process submissions): it
        is then encoded."""
        return self._pool_records.pop(pool_round, None)

    def _kept(self, round_id: int) -> list[tuple[str, int, int, Trajectory, bytes | None]] | None:
        """The samples kept at intake for the round, in pool order, when they are exactly what the
        journal holds: every accepted sample of the round was committed by this process (no restart
        in between) and none was purged since (the journal's count of the round's samples, and of
        purged ones, must agree); else None."""
        kept = self._accepted.get(round_id)
        if kept is None or self._journal.round_sample_counts(round_id) != (len(kept), 0):
            return None
        kept.sort(key=_POOL_KEY)
        return kept

    def _pool_of(self, round_id: int) -> tuple[tuple[Trajectory, ...], tuple[bytes, ...] | None]:
        """`journal.pool(round_id)`, from the samples kept at intake when they are the journal's
        (`_kept`) and every field has the type and value the journal would give back
        (`as_journaled`); otherwise the journal is read: the same trajectories in the same order
        (tests/unit/test_pool_from_intake.py), without reading back and rebuilding the round's
        samples (bench/coordinator_scale.py). The kept samples are released. With the pool, the
        records of its samples when every one was kept with one (`take_records`), else None."""
        kept = self._kept(round_id)
        self._accepted.pop(round_id, None)
        if kept is not None and as_journaled([t for _, _, _, t, _ in kept]):
            records = tuple(r for _, _, _, _, r in kept)
            return tuple(t for _, _, _, t, _ in kept), (records if None not in records else None)
        return self._journal.pool(round_id), None
