"""The coordinator's round engine: which step each lab may start, and the one update it is sent for it.

Runs in the coordinator's process (the Flower ServerApp, `hacfed sim`, tests); torch-free. The
`Coordinator` owns one (`Coordinator.engine`) and hands it the journal, the samples kept for the next
pool, its lock and the capability tracker's reading; both transports, in-process
(`hacfed.server.coordinator.transport`) and Flower (`hacfed.server.driver`), ask it. Everything it
decides it reads from the journal, so a restarted coordinator decides the same. docs/staleness.md has
the rules and what they guarantee.

A lab's step t trains on what it is sent, then rolls out round t's plan; step R (`rounds`) is the
final update. With `max_staleness` K:

- **the start rule** (`waits_for`): step t waits for round t - 1 - K to close, the final update for
  round R - 1; K = 0 is the synchronous round;
- **the window** (`window`): step t draws from rounds max(0, t - 1 - K) .. t - 1; K = 0 is a window
  of one round;
- **what the lab is sent** (`update_for`): of the window, the accepted samples of every submission it
  was not sent before, the capabilities P̂ of the latest closed round, the plan of round t, cut to its
  share (`pool_share`: its own samples and `pool_peers_per_prompt` peers per prompt) and, given
  `max_bytes`, to fewer peers until it fits one message (`pool_share.fitted_peers`);
- **the step a lab is at** (`step_of`, over Flower): the first round not closed that it has not
  submitted for; with `round_join = "newest"` (`next_step`) the newest open round it has not taken,
  or the next round once round n - K closed.

Under a window of one round (K = 0, `round_join = "every"`) every lab is sent all of round t - 1, and
nothing needs recording: the update is built once per step (`round_update`) and each lab is sent its
share, which the Flower driver splices from blocks shared between labs
(`hacfed.server.round_updates`). Otherwise the first build of a lab's step chooses its submissions and
journals them (`Journal.record_sent_step`, before the update leaves the coordinator), and every later
build of it (a failed exchange, a restarted coordinator) reads them back: the same samples, in the
same order, with the P̂ of the same closed round, never cut again; the key (lab, round, source) of the
journal refuses to send a lab a submission twice. With `round_join = "newest"` a lab is sent of each
peer only the newest round among those it had not been sent; the older ones are recorded as sent and
never sent (`skipped`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from hacfed.messages import RoundPlan, RoundUpdate
from hacfed.server.coordinator.config import CoordinatorConfig
from hacfed.server.coordinator.errors import CoordinatorStateError
from hacfed.server.coordinator.journal import Journal, SentStep
from hacfed.server.coordinator.kept_pool import KeptSamples
from hacfed.server.coordinator.pool_share import fitted_peers, share_salt, shares_of
from hacfed.trajectory import Trajectory


def waits_for(step: int, rounds: int, max_staleness: int) -> int:
    """The round that must be closed before a lab starts `step` (-1: none). The start rule, written once."""
    return step - 1 if step == rounds else step - 1 - max_staleness


def window(step: int, max_staleness: int) -> range:
    """The rounds the update of `step` draws from."""
    return range(max(0, step - 1 - max_staleness), step)


@dataclass(frozen=True)
class BuiltUpdate:
    """A lab's update and, aligned with `update.pool`, each sample's round and staleness; the peers per
    prompt it was built with and, when it was cut to fit (`fitted_peers`), how many samples of its share
    that left out and the bytes of its encoding; under round_join "newest" the samples of skipped rounds."""

    update: RoundUpdate
    rounds: tuple[int, ...]
    staleness: tuple[int, ...]
    skipped: int = 0
    peers_per_prompt: int = 0
    left_out: int = 0
    size: int | None = None


class RoundEngine:
    """The round logic of one coordinator (module docstring). Its builders take the coordinator's lock; what
    it reads of the journal needs none (each read is one statement)."""

    def __init__(
        self, cfg: CoordinatorConfig, journal: Journal, kept: KeptSamples, *, lock: AbstractContextManager,
        capabilities: Callable[[], dict[str, float]], plan_for: Callable[[int], RoundPlan],
        clock: Callable[[], float], audited: Callable[[], AbstractContextManager], credit: Callable,
    ) -> None:
        """capabilities: the tracker's P̂ (before any round closed); audited: a journal write whose audit
        line fails makes the coordinator fail closed; credit(round): the `successes` choice's group credit."""
        self.cfg, self.journal, self.kept = cfg, journal, kept
        self._lock, self._capabilities, self._plan_for = lock, capabilities, plan_for
        self._clock, self._audited, self._credit = clock, audited, credit
        # A window of more than one round, or labs that skip rounds: each lab's choice is journaled.
        self.journaled = cfg.max_staleness > 0 or cfg.round_join == "newest"
        self._shares: tuple[tuple[int, tuple[str, ...]], RoundUpdate, Callable[[str], RoundUpdate]] | None = None

    # -- when a lab may start which step -------------------------------------------------------------

    def waits_for(self, step: int) -> int:
        return waits_for(step, self.cfg.rounds, self.cfg.max_staleness)

    def _first_unclosed(self) -> int:
        closed = self.journal.latest_closed_round()
        return 0 if closed is None else closed.round_id + 1

    def may_start(self, step: int) -> bool:
        """Whether a lab may start `step` now: the round it waits for (`waits_for`) has closed."""
        return self.waits_for(step) < self._first_unclosed()

    def unanswered(self, lab: str) -> int:
        """The first round not closed that `lab` has not submitted for (`rounds` once every round closed)."""
        step, opened = self._first_unclosed(), self._next_round_id()
        while step < opened and self.journal.submission_seq(lab, step) is not None:
            step += 1
        return min(step, self.cfg.rounds)

    def step_of(self, lab: str) -> int | None:
        """The step `lab` may be sent now, or None while it must wait (round_join "every"): its `unanswered`
        step once the start rule allows and the round is open or may open; `rounds` (the final update)
        once every round closed."""
        step = self.unanswered(lab)
        if step >= self.cfg.rounds:
            return self.cfg.rounds if self._first_unclosed() >= self.cfg.rounds else None
        if not self.may_start(step) or self._first_unclosed() == self._next_round_id():  # no round open
            return None
        return step

    def next_step(self, lab: str, *, resend: bool) -> int | None:
        """The step `lab` may be sent now under round_join "newest" (docs/staleness.md "The rule"), or None
        while it must wait: with `resend` (over Flower, where a failed exchange is sent again) the step it
        was sent and has not answered while its round is open; else the newest opened round n if it is
        open and `lab` did not take it; else round n + 1 once round n - K closed; once round R - 1 is
        opened and `lab` cannot take it, the final update once round R - 1 closed."""
        taken = self.journal.sent_steps_of(lab)
        if resend:
            pending = [s for s in taken if s < self.cfg.rounds and s >= self._first_unclosed()
                       and self.journal.submission_seq(lab, s) is None]
            if pending:
                return pending[0]
            if self.cfg.rounds in taken:
                return self.cfg.rounds
        newest = self._next_round_id() - 1
        if newest >= 0 and newest >= self._first_unclosed() and newest not in taken:
            return newest
        step = newest + 1
        return step if step <= self.cfg.rounds and self.may_start(step) else None

    def takers(self, round_id: int) -> frozenset[str] | None:
        """round_join "newest": the labs that took round `round_id`, once no lab can take it any more (a
        newer round is open, it is the run's last round, or every active lab took it); None while one can."""
        takers = frozenset(self.journal.sent_to(round_id))
        active = {p.participant_id for p in self.journal.participants() if not p.quarantined}
        newest = self._next_round_id() - 1
        if round_id < newest or round_id == self.cfg.rounds - 1 or active <= takers:
            return takers
        return None

    def _next_round_id(self) -> int:
        latest = self.journal.latest_round()
        return 0 if latest is None else latest.round_id + 1

    # -- what a lab is sent ----------------------------------------------------------------------------

    def round_update(self, step: int) -> RoundUpdate:
        """The update of `step` under a window of one round, before any lab's share: every accepted sample
        of round step - 1 (closed) in the journal's order, its P̂, the plan of `step` (opened first; none
        for the final update). Marks round step - 1 PUBLISHED."""
        self._check_step(step)
        with self._lock:
            return self._build(step, None)[0]

    def update_for(self, lab: str, step: int, max_bytes: int | None = None) -> BuiltUpdate:
        """What `lab` is sent for its step `step` (module docstring); max_bytes: fewer peers per prompt
        until its encoding fits (None: never cut)."""
        self._check_step(step)
        with self._lock:
            if not self.journaled:
                return self._shared_round(lab, step, max_bytes)
            with self._audited():
                return self._journaled(lab, step, max_bytes)

    def _check_step(self, step: int) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= self.cfg.rounds:
            raise ValueError(f"step must be an int in [0, {self.cfg.rounds}], got {step!r}")

    def _shared_round(self, lab: str, step: int, max_bytes: int | None) -> BuiltUpdate:
        """A window of one round: the lab's share of `round_update(step)`, built once per step and set of labs."""
        active = tuple(p.participant_id for p in self.journal.participants() if not p.quarantined)
        if self._shares is None or self._shares[0] != (step, active):
            self._shares = None  # the last step's pool goes before this one's is built
            update = self._build(step, None)[0]
            cfg = self.cfg
            credit = self._credit(update.pool_round)
            share = shares_of(update, cfg.pool_peers_per_prompt, self._salt(step), cfg.pool_peer_choice, credit)
            self._shares = ((step, active), update, share)
        update, share = self._shares[1], self._shares[2]
        k, left_out, size = self.cfg.pool_peers_per_prompt, 0, None
        if max_bytes is not None:
            k, left_out, size = self._fitted(update, lab, k, step, max_bytes)
        if k != self.cfg.pool_peers_per_prompt:
            share = shares_of(update, k, self._salt(step), self.cfg.pool_peer_choice,
                              self._credit(update.pool_round))
        shared = share(lab)
        rounds = (step - 1,) * len(shared.pool)
        return BuiltUpdate(shared, rounds, (0,) * len(rounds), peers_per_prompt=k, left_out=left_out, size=size)

    def _journaled(self, lab: str, step: int, max_bytes: int | None) -> BuiltUpdate:
        """The lab's choice of submissions, journaled at the first build of its step and read back after."""
        kept = self.journal.sent_step(lab, step)
        if kept is None:
            self._check_closed(step)
            sent = self.journal.sent_pairs(lab)
            chosen: dict[int, frozenset[str]] = {}
            for q in window(step, self.cfg.max_staleness):
                new = frozenset(s for s in self.journal.submitter_ids(q) if (q, s) not in sent)
                if new:
                    chosen[q] = new
            closed = self.journal.latest_closed_round()
            capabilities_round = None if closed is None or step == 0 else closed.round_id
        else:
            chosen, capabilities_round = kept.sources, kept.capabilities_round
        carried, skipped = self._newest_of_each_peer(lab, chosen)
        update, of_round = self._build(step, carried, capabilities_round)
        k = self.cfg.pool_peers_per_prompt if kept is None or kept.peers_per_prompt is None else kept.peers_per_prompt
        left_out, size = 0, None
        if kept is None and max_bytes is not None:
            k, left_out, size = self._fitted(update, lab, k, step, max_bytes)
        if kept is None:
            self.journal.record_sent_step(SentStep(lab, step, self._clock(), capabilities_round, chosen, k))
        shared = shares_of(update, k, self._salt(step), self.cfg.pool_peer_choice, self._window_credit(step))(lab)
        if shared is not update:  # a sub-sequence of the pool: keep each kept sample's round
            index = {id(t): i for i, t in enumerate(update.pool)}
            of_round = [of_round[index[id(t)]] for t in shared.pool]
        if self.cfg.round_join == "newest":
            shared = self._own_step_plan(shared, lab, step)
        staleness = tuple(step - 1 - q for q in of_round)
        return BuiltUpdate(shared, tuple(of_round), staleness, skipped, k, left_out, size)

    def _newest_of_each_peer(self, lab: str, chosen: dict[int, frozenset[str]]) -> tuple[dict, int]:
        """(the submissions a step carries, the accepted samples of those it skips): all of `chosen` under
        round_join "every"; under "newest" the lab's own and, of each peer, its newest chosen round only
        (a lab's submissions arrive in the order of its rounds, so that is the peer's newest in the window)."""
        if self.cfg.round_join != "newest":
            return chosen, 0
        newest: dict[str, int] = {}
        for q in sorted(chosen):
            newest.update((s, q) for s in chosen[q] if s != lab)
        carried = {q: frozenset(s for s in sources if newest.get(s, q) == q) for q, sources in chosen.items()}
        skipped = sum(1 for q, sources in chosen.items() for t in self.journal.pool(q)
                      if t.source_id in sources - carried[q])
        return carried, skipped

    def _check_closed(self, step: int) -> None:
        before = self.waits_for(step)
        if before >= 0:
            record = self.journal.round(before)
            if record is None or record.state == "OPEN":
                raise CoordinatorStateError(f"round {before} must be closed before a lab starts step {step} "
                                            f"(max_staleness {self.cfg.max_staleness})")

    def _build(self, step: int, chosen: dict[int, frozenset[str]] | None,
               capabilities_round: int | None = None) -> tuple[RoundUpdate, list[int]]:
        """The one update builder: (the update of `step` carrying the `chosen` submissions by round, or all
        of round step - 1 when None, with the P̂ of `capabilities_round`; each sample's round)."""
        cfg, journal = self.cfg, self.journal
        active = tuple(p.participant_id for p in journal.participants() if not p.quarantined)
        fresh = self._capabilities()
        pool: tuple[Trajectory, ...] | list[Trajectory] = ()
        of_round: list[int] = []
        capabilities = {pid: 1.0 for pid in active} | fresh
        if chosen is None and step > 0:
            record = journal.round(step - 1)
            if record is None or record.state == "OPEN":
                raise CoordinatorStateError(f"round {step - 1} must be closed before its pool is published")
            pool = self.kept.pool(step - 1)
            of_round = [step - 1] * len(pool)
            capabilities = {pid: 1.0 for pid in active} | dict(record.capabilities or {})
        elif chosen is not None:
            pool = []
            for q in sorted(chosen):
                samples = [t for t in journal.pool(q) if t.source_id in chosen[q]]
                pool.extend(samples)
                of_round.extend([q] * len(samples))
            if step > 0:  # P̂ of the latest round closed at the first build; 1.0 without history
                capabilities = {pid: 1.0 for pid in (*active, *fresh)}
            if capabilities_round is not None:
                capabilities |= dict(journal.round(capabilities_round).capabilities or {})
        plan = None
        if step < cfg.rounds:
            if journal.round(step) is None:
                raise CoordinatorStateError(f"open round {step} before sending its plan")
            plan = self._plan_for(step)
        for q in (window(step, 0) if chosen is None else window(step, cfg.max_staleness)):
            record = journal.round(q)
            if record is not None and record.state == "CLOSED":  # its samples were handed out
                journal.mark_published(q)
        pool_round = step - 1 if step > 0 else None
        return RoundUpdate(cfg.run_id, pool_round, tuple(pool), capabilities, plan, active, cfg.hacpo), of_round

    def _own_step_plan(self, update: RoundUpdate, lab: str, step: int) -> RoundUpdate:
        """round_join "newest": the plan asks for an evaluation every `eval_every` of the lab's OWN steps
        (the rounds it took before this one: 0, eval_every, ...); the journaled plan keeps the round's."""
        plan = update.next_plan
        if plan is None:
            return update
        own = sum(1 for s in self.journal.sent_steps_of(lab) if s < step)
        evaluate = self.cfg.eval_every > 0 and own % self.cfg.eval_every == 0
        return update if plan.evaluate == evaluate else \
            dataclasses.replace(update, next_plan=dataclasses.replace(plan, evaluate=evaluate))

    def _salt(self, step: int) -> str:
        return share_salt(self.cfg.run_id, self.cfg.seed, step)

    def _window_credit(self, step: int) -> dict | None:
        """The `successes` choice's group credit over the window's rounds (a later round's group first)."""
        merged: dict | None = None
        for q in window(step, self.cfg.max_staleness):
            credit = self._credit(q)
            if credit is not None:
                merged = {**(merged or {}), **credit}
        return merged

    def _fitted(self, update: RoundUpdate, lab: str, k: int, step: int, max_bytes: int) -> tuple[int, int, int]:
        return fitted_peers(update, lab, k, self._salt(step), self.cfg.pool_peer_choice, max_bytes)
