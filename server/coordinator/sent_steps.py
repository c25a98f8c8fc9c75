"""What each lab was sent at each step under bounded staleness, journaled: the same update on a resend, no sample twice.

Runs in the coordinator's ServerApp process (`hacfed.server.stale_rounds`, through
`Coordinator.make_sent_update`); torch-free. `stale_pool` decides what a lab's step t is sent: of
every round q in [t - 1 - K, t - 1], the accepted samples of each (round, source) submission it was
not sent before. Here that choice is kept in the journal (schema 5):

- `sent_steps` (participant, step, sent_at, capabilities_round, peers_per_prompt): one row per update
  built, written in one transaction with its `sent_sources` rows before the update leaves the
  coordinator; `peers_per_prompt` is the share it was built with, fewer peers per prompt than the
  configured `pool_peers_per_prompt` when it was cut to fit one message (`stale_pool.fitted_peers`);
- `sent_sources` (participant, step, round, source): the submissions whose samples it carries (its
  share of them). The key (participant, round, source) makes the journal refuse to send a lab the
  same submission twice.

The first build of a step chooses its sources (those of its window not in `sent_sources` for the lab),
cuts its share until it fits `max_bytes`, and journals both; every later build of the same step (a
failed exchange sent again, a coordinator restarted after a kill) reads them back and sends the same
samples, in the same order, with the P̂ of the same closed round, never cut again. So after a crash
the lab's next step starts where the journal says, and no sample is sent twice or skipped; the samples
a cut left out are never sent to that lab (its window moves on). A step whose build found nothing new
still gets its `sent_steps` row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from hacfed.messages import RoundPlan
from hacfed.server.coordinator.config import CoordinatorConfig
from hacfed.server.coordinator.journal import Journal
from hacfed.server.coordinator.stale_pool import StaleUpdate, stale_update


@dataclass(frozen=True)
class SentStep:
    """One journaled update: when it was first built, whose P̂ it carries, the sources it drew by round,
    the peers per prompt of its share (None: the configured `pool_peers_per_prompt`)."""

    participant_id: str
    step: int
    sent_at: float
    capabilities_round: int | None
    sources: dict[int, frozenset[str]]
    peers_per_prompt: int | None = None


def sent_step(journal: Journal, learner: str, step: int) -> SentStep | None:
    """The journaled update of `learner`'s step `step`, or None when none was built."""
    row = journal.sent_step_row(learner, step)
    if row is None:
        return None
    sources: dict[int, set[str]] = {}
    for round_id, source in journal.sent_step_sources(learner, step):
        sources.setdefault(round_id, set()).add(source)
    return SentStep(learner, step, row[0], row[1], {q: frozenset(s) for q, s in sources.items()}, row[2])


def sent_steps(journal: Journal) -> list[SentStep]:
    """Every journaled update, by participant and step (for reports and tests)."""
    return [s for pid, step in journal.sent_step_keys() if (s := sent_step(journal, pid, step)) is not None]


def record_sent_step(journal: Journal, step: SentStep) -> None:
    """Journal one update's choice in one transaction (`sent_steps` and its `sent_sources` rows)."""
    journal.record_sent_step(step.participant_id, step.step, step.sent_at, step.capabilities_round,
                             step.peers_per_prompt, step.sources)


class _Choosing:
    """A `stale_pool.Deliveries` for a step's first build: the sources not sent before, recorded."""

    def __init__(self, sent: set[tuple[int, str]]) -> None:
        self._sent = sent
        self.chosen: dict[int, frozenset[str]] = {}

    def take(self, learner: str, round_id: int, sources: set[str]) -> set[str]:
        new = {s for s in sources if (round_id, s) not in self._sent}
        if new:
            self.chosen[round_id] = frozenset(new)
        return new


class _Replaying:
    """A `stale_pool.Deliveries` for a step built again: the sources journaled for it."""

    def __init__(self, sources: dict[int, frozenset[str]]) -> None:
        self._sources = sources

    def take(self, learner: str, round_id: int, sources: set[str]) -> set[str]:
        return set(self._sources.get(round_id, ()))


def journaled_update(
    cfg: CoordinatorConfig, journal: Journal, learner: str, step: int, now: float,
    fresh_capabilities: dict[str, float], plan_for: Callable[[int], RoundPlan], max_bytes: int | None = None,
) -> StaleUpdate:
    """`learner`'s update for `step` (`stale_pool.stale_update`), its choice journaled at the first build,
    its share cut to fit `max_bytes` then (None: never cut), and read back at every later one (module
    docstring). The caller holds the coordinator's lock, which makes the read, the build and the record one
    step: nothing else writes `sent_steps`."""
    kept = sent_step(journal, learner, step)
    if kept is None:
        closed = journal.latest_closed_round()
        choosing = _Choosing(journal.sent_pairs(learner))
        built = stale_update(cfg, journal, choosing, learner, step, fresh_capabilities, plan_for,
                             max_bytes=max_bytes)
        record_sent_step(journal, SentStep(learner, step, now, None if closed is None else closed.round_id,
                                           choosing.chosen, built.peers_per_prompt))
        return built
    built = stale_update(cfg, journal, _Replaying(kept.sources), learner, step, fresh_capabilities, plan_for,
                         peers_per_prompt=kept.peers_per_prompt)
    if step == 0:  # P̂ before any round closed
        return built
    capabilities = {pid: 1.0 for pid in (*built.update.participants, *fresh_capabilities)}  # no history: 1.0
    if kept.capabilities_round is not None:
        capabilities |= dict(journal.round(kept.capabilities_round).capabilities or {})
    return dataclasses.replace(built, update=dataclasses.replace(built.update, capabilities=capabilities))
