"""What a lab is sent under bounded staleness: the verified samples it has not trained on, at most K rounds old.

Runs in the coordinator's process, in-process for `hacfed sim --max-staleness K` (through
`hacfed.server.coordinator.paced`); torch-free. docs/staleness.md has the schedule and the equations.

A lab's step t trains on what it is sent, then rolls out round t's plan. With `max_staleness` K the
coordinator sends it, from every round q in [t - 1 - K, t - 1], the accepted samples of each
submission recorded for q that this lab was not sent before: its own of round t - 1 (always there:
a lab's next step starts after its submission is in) and whatever its peers' submissions of those
rounds brought since. The staleness of a sample is t - 1 - q: 0 for a sample of the round just before
(what the synchronous federation trains on), at most K. Round t - 1 - K must be closed first, so every
submission of it is in and nothing of it is left for later: a sample is sent once, and never older
than K rounds. The final update (t = R) waits for round R - 1 to close and sends the rest.

With K = 0 this is exactly `Coordinator.make_update` followed by the lab's share of the pool: round
t - 1 closed, every submission of it, in the journal's pool order, the capabilities P̂ of round t - 1.

Over Flower an update must fit one message: given `max_bytes`, a share whose encoding is larger is
cut the way the synchronous driver cuts its updates (`hacfed.server.round_updates`): fewer peers per
prompt, down to the lab's own samples only (`fitted_peers`). Its submissions count as sent all the
same (`Deliveries.take`): the samples the cut left out are never sent to that lab.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hacfed.messages import RoundPlan, RoundUpdate
from hacfed.server.coordinator.config import CoordinatorConfig
from hacfed.server.coordinator.errors import CoordinatorStateError
from hacfed.server.coordinator.journal import Journal
from hacfed.server.coordinator.pool_share import PoolShares, share_salt, shares_of
from hacfed.wire.pool_splice import encode_pool_items, header_of, round_update_parts


@dataclass(frozen=True)
class StaleUpdate:
    """A lab's update and, aligned with `update.pool`, each sample's round and staleness; the peers
    per prompt it was built with and, when it was cut to fit (`fitted_peers`), how many samples of
    its share that left out and the bytes of its encoding."""

    update: RoundUpdate
    rounds: tuple[int, ...]
    staleness: tuple[int, ...]
    skipped: int = 0  # round_join "newest": accepted samples of peer rounds skipped (`round_join.newest_update`)
    peers_per_prompt: int = 0
    left_out: int = 0
    size: int | None = None


class Deliveries:
    """Which (round, source) submissions each lab was sent, so that none is sent twice. In memory: a
    paced run is one process from start to end (`paced.run_paced` refuses to resume a journal)."""

    def __init__(self) -> None:
        self._sent: dict[str, set[tuple[int, str]]] = {}

    def take(self, learner: str, round_id: int, sources: set[str]) -> set[str]:
        """The sources of round `round_id` not yet sent to `learner`, now marked as sent."""
        sent = self._sent.setdefault(learner, set())
        new = {s for s in sources if (round_id, s) not in sent}
        sent.update((round_id, s) for s in new)
        return new


def window(next_round: int, rounds: int, max_staleness: int) -> tuple[int, range]:
    """(the round that must be closed before step `next_round` starts, or -1 for none; the rounds its
    update draws from)."""
    waits_for = next_round - 1 if next_round == rounds else next_round - 1 - max_staleness
    return waits_for, range(max(0, next_round - 1 - max_staleness), next_round)


def stale_update(
    cfg: CoordinatorConfig, journal: Journal, deliveries: Deliveries, learner: str, next_round: int,
    fresh_capabilities: dict[str, float], plan_for: Callable[[int], RoundPlan], *,
    peers_per_prompt: int | None = None, max_bytes: int | None = None,
) -> StaleUpdate:
    """`learner`'s update for its step `next_round` (module docstring). `fresh_capabilities`: P̂ before
    any round closed (the tracker's), used until one has; plan_for(round): the round's journaled plan;
    peers_per_prompt: the lab's share (None: `pool_peers_per_prompt`); max_bytes: fewer peers per prompt
    until its encoding fits (`fitted_peers`; None: never cut). Marks the closed rounds it drew from PUBLISHED."""
    if isinstance(next_round, bool) or not isinstance(next_round, int) or not 0 <= next_round <= cfg.rounds:
        raise ValueError(f"next_round must be an int in [0, {cfg.rounds}], got {next_round!r}")
    waits_for, rounds = window(next_round, cfg.rounds, cfg.max_staleness)
    if waits_for >= 0:
        record = journal.round(waits_for)
        if record is None or record.state == "OPEN":
            raise CoordinatorStateError(
                f"round {waits_for} must be closed before a lab starts step {next_round} (max_staleness "
                f"{cfg.max_staleness})"
            )
    active = tuple(p.participant_id for p in journal.participants() if not p.quarantined)
    closed = journal.latest_closed_round()
    capabilities = {pid: 1.0 for pid in active} | (
        dict(closed.capabilities or {}) if closed is not None and next_round > 0 else fresh_capabilities
    )
    pool, of_round = [], []
    for q in rounds:
        new = deliveries.take(learner, q, journal.submitter_ids(q))
        if new:
            samples = [t for t in journal.pool(q) if t.source_id in new]
            pool.extend(samples)
            of_round.extend([q] * len(samples))
    plan = None
    if next_round < cfg.rounds:
        if journal.round(next_round) is None:
            raise CoordinatorStateError(f"open round {next_round} before sending its plan")
        plan = plan_for(next_round)
    for q in rounds:  # a closed round whose samples were handed out (K = 0: make_update's one round)
        if journal.round(q).state == "CLOSED":
            journal.mark_published(q)
    pool_round = next_round - 1 if next_round > 0 else None
    update = RoundUpdate(cfg.run_id, pool_round, tuple(pool), capabilities, plan, active, cfg.hacpo)
    salt = share_salt(cfg.run_id, cfg.seed, next_round)
    k = cfg.pool_peers_per_prompt if peers_per_prompt is None else peers_per_prompt
    left_out, size = 0, None
    if max_bytes is not None:
        k, left_out, size = fitted_peers(update, learner, k, salt, cfg.pool_peer_choice, max_bytes)
    shared = shares_of(update, k, salt, cfg.pool_peer_choice)(learner)
    if shared is not update:  # a sub-sequence of the pool: keep each kept sample's round
        index = {id(t): i for i, t in enumerate(pool)}
        of_round = [of_round[index[id(t)]] for t in shared.pool]
    staleness = tuple(next_round - 1 - q for q in of_round)
    return StaleUpdate(shared, tuple(of_round), staleness, peers_per_prompt=k, left_out=left_out, size=size)


def fitted_peers(
    update: RoundUpdate, learner: str, peers_per_prompt: int, salt: str, choice: str, max_bytes: int,
) -> tuple[int, int, int]:
    """(k, left out, size): the most peers per prompt k <= `peers_per_prompt` whose share of `update` for
    `learner` (`shares_of`) encodes in at most `max_bytes`, or 0 (its own samples only) when none does;
    how many samples of its share at `peers_per_prompt` the share at k leaves out; the bytes of its
    encoding (over `max_bytes` at k = 0 when even its own samples and the plan do not fit). The
    synchronous driver's rule (`hacfed.server.round_updates.RoundUpdates`): every pool record is
    encoded once, and a share's size is summed from them."""
    items = encode_pool_items(update.pool)
    header = header_of(update)
    shares = PoolShares(update.pool, peers_per_prompt, salt, choice)
    sources = len({t.source_id for t in update.pool})
    k, full = peers_per_prompt, None
    while True:
        chosen = range(len(items)) if sources <= k + 1 else shares.indices_for(learner, k)  # as `shares_of`
        full = len(chosen) if full is None else full
        size = sum(map(len, round_update_parts(header, [items[i] for i in chosen])))
        if size <= max_bytes or k == 0:
            return k, full - len(chosen), size
        k -= 1
