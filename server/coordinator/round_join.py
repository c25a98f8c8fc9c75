"""`round_join = "newest"`: a lab that finished its step joins the newest round; a fast lab need not wait.

Pure and torch-free: the order of events on the simulated clock for the paced in-process transport
(`hacfed.server.coordinator.paced`, which drives `hacfed sim --round-join newest`), the rule by which
such a round closes (`Coordinator.quorum`, read by `Coordinator.ready_to_close`), what a lab's step is told
to do (`own_step_plan`) and what it is sent (`newest_update`: of each peer, only its newest round).
docs/staleness.md, "Joining the newest round", has the rules and what they guarantee.
`round_join = "every"` (the default) is `schedule.Schedule`: every lab rolls out every round.

A lab starting a step rolls out the newest opened round if it has not rolled it out and it is still
open; otherwise it opens the next round n, allowed once round n - 1 - K has closed (K =
max_staleness); once every round is opened its last step is the final update (step index `rounds`),
allowed once round R - 1 has closed. A slow lab thus skips the rounds opened while it was busy. The
labs that took a round are the ones it waits for; it closes (oldest first) once they all submitted and
no lab can still take it: a newer round is open, it is the run's last round, or every lab took it.
A lab is sent its own samples and, of each peer, the samples of that peer's newest round in its
window; the peer's older rounds it was not sent are skipped, never sent later (`NewestOfEachPeer`),
so a slow lab's step trains on as much as a synchronous step does.

    sched = JoinSchedule(["a", "b"], {"b": 4.0}, max_staleness=3, rounds=40)
    while (event := sched.pop()) is not None:       # event.step: the round taken (or 40, the final)
        if event.kind == "start":
            sched.finished(event.lab, event.step, compute_seconds)   # scaled by b's factor 4
        ... close what `expected` allows, then sched.closed(q)

`order_join_events` runs that loop for compute times known in advance, closing rounds by the same rule.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from hacfed.messages import ROUND_JOINS, RoundPlan, RoundUpdate
from hacfed.server.coordinator.schedule import Event, check_compute, check_schedule

_FINISH, _TRY = 0, 1  # at equal times a finish comes first, then labs try to start in their given order


def check_round_join(value: object) -> str:
    if value not in ROUND_JOINS:
        raise ValueError(f"round_join must be one of {', '.join(map(repr, ROUND_JOINS))}, got {value!r}")
    return value  # type: ignore[return-value]


class JoinSchedule:
    """Which lab starts or finishes which round next under round_join "newest" (module docstring).
    Events carry the round a step rolls out (`rounds` for the final update) and the lab's own step
    count before it (`own_step`)."""

    def __init__(self, labs: Sequence[str], speeds: Mapping[str, float], max_staleness: int, rounds: int) -> None:
        self.labs, self.speeds, self.max_staleness, self.rounds = check_schedule(labs, speeds, max_staleness, rounds)
        self.now = 0.0
        self.newest = -1  # the newest opened round
        self._rank = {lab: i for i, lab in enumerate(self.labs)}
        self._heap: list[tuple[float, int, int, int, str]] = []
        self._active = set(self.labs)  # not dropped
        self._waiting: set[str] = set()  # ready, but what they wait for has not happened
        self._taken: dict[str, list[int]] = {lab: [] for lab in self.labs}  # rounds taken, in order
        self._takers: dict[int, set[str]] = {}
        self._starts: dict[tuple[str, int], float] = {}
        self._idle: dict[tuple[str, int], float] = {}
        self._last_finish: dict[str, float] = {}
        self._running: dict[str, int] = {}  # lab -> started round whose finish is not yet known
        self._closed: dict[int, float] = {}
        for lab in self.labs:
            heapq.heappush(self._heap, (0.0, _TRY, self._rank[lab], 0, lab))

    def pop(self) -> Event | None:
        """The next event in time order, or None when nothing can happen until a round closes (or
        every lab is done)."""
        while self._heap:
            time, kind, _, step, lab = heapq.heappop(self._heap)
            self.now = time
            if kind == _FINISH:
                self._last_finish[lab] = time
                if step < self.rounds and lab in self._active:
                    heapq.heappush(self._heap, (time, _TRY, self._rank[lab], 0, lab))
                return Event(time, "finish", lab, step, self.own_step(lab, step))
            if lab not in self._active:
                continue
            step = self._choose(lab)
            if step is None:
                self._waiting.add(lab)
                continue
            return self._start(lab, step, time)
        return None

    def finished(self, lab: str, step: int, compute: float) -> None:
        """The started step took `compute` seconds at speed 1: its finish is due at start + compute x factor."""
        if self._running.get(lab) != step:
            raise ValueError(f"{lab} has no running step {step}")
        check_compute(lab, step, compute)
        del self._running[lab]
        due = self._starts[(lab, step)] + compute * self.speeds[lab]
        heapq.heappush(self._heap, (due, _FINISH, self._rank[lab], step, lab))

    def closed(self, round_id: int, at: float | None = None) -> None:
        """Round `round_id` closed at simulated time `at` (default: now); labs waiting for it try again."""
        at = self.now if at is None else at
        self._closed[round_id] = at
        for lab in sorted(self._waiting, key=self._rank.__getitem__):
            heapq.heappush(self._heap, (max(at, self.now), _TRY, self._rank[lab], 0, lab))
        self._waiting.clear()

    def drop(self, lab: str) -> None:
        """`lab` takes no more steps (it was quarantined): rounds no longer count on it to take them."""
        self._active.discard(lab)
        self._waiting.discard(lab)

    def expected(self, round_id: int) -> frozenset[str] | None:
        """The labs round `round_id` waits for, once no lab can take it any more (a newer round is
        open, it is the last round, or every lab took it); None while one still can."""
        takers = self._takers.get(round_id, set())
        if round_id < self.newest or round_id == self.rounds - 1 or self._active <= takers:
            return frozenset(takers)
        return None

    def takers(self, round_id: int) -> frozenset[str]:
        return frozenset(self._takers.get(round_id, ()))

    def own_step(self, lab: str, step: int) -> int:
        """How many rounds `lab` rolled out before its step `step` (a round it took, or the final)."""
        taken = self._taken[lab]
        return len(taken) if step == self.rounds else taken.index(step)

    def start_of(self, lab: str, step: int) -> float:
        return self._starts[(lab, step)]

    def idle_before(self, lab: str, step: int) -> float:
        """How long the lab waited between finishing its previous step and starting `step` (0 for its first)."""
        return self._idle[(lab, step)]

    def _choose(self, lab: str) -> int | None:
        newest = self.newest
        if newest >= 0 and newest not in self._closed and lab not in self._takers[newest]:
            return newest
        nxt = newest + 1
        waits_for = nxt - 1 if nxt == self.rounds else nxt - 1 - self.max_staleness
        if waits_for >= 0 and waits_for not in self._closed:
            return None
        return nxt

    def _start(self, lab: str, step: int, time: float) -> Event:
        own = len(self._taken[lab])
        if step < self.rounds:
            self.newest = max(self.newest, step)
            self._taken[lab].append(step)
            self._takers.setdefault(step, set()).add(lab)
        else:
            self._active.discard(lab)
        self._starts[(lab, step)] = time
        self._idle[(lab, step)] = time - self._last_finish[lab] if lab in self._last_finish else 0.0
        self._running[lab] = step
        return Event(time, "start", lab, step, own)


def own_step_plan(update: RoundUpdate, own_step: int, eval_every: int) -> RoundUpdate:
    """The update with its plan asking for an evaluation every `eval_every` of the lab's OWN steps
    (own_step 0, eval_every, ...) instead of every eval_every rounds; the final update (no plan)
    evaluates anyway."""
    plan = update.next_plan
    if plan is None:
        return update
    evaluate = eval_every > 0 and own_step % eval_every == 0
    return update if plan.evaluate == evaluate else replace(update, next_plan=replace(plan, evaluate=evaluate))


def order_join_events(
    compute: Mapping[str, float | Sequence[float]], speeds: Mapping[str, float], max_staleness: int, rounds: int,
) -> list[Event]:
    """Every event of a run whose compute times are known: `compute[lab]` is its time per step at
    speed 1, one number or one per own step (as many as it makes). A round closes by the rule of
    `Coordinator.quorum`: oldest first, once every lab that took it has finished it and `expected` allows."""
    labs = list(compute)
    sched = JoinSchedule(labs, speeds, max_staleness, rounds)
    finished: dict[int, set[str]] = {}
    oldest, events = 0, []
    while (event := sched.pop()) is not None:
        events.append(event)
        if event.kind == "start":
            per = compute[event.lab]
            own = event.own_step
            if not isinstance(per, (int, float)) and own >= len(per):
                raise ValueError(f"compute of {event.lab} has {len(per)} step times, its step {own} needs one more")
            sched.finished(event.lab, event.step, per if isinstance(per, (int, float)) else per[own])
        elif event.step < rounds:
            finished.setdefault(event.step, set()).add(event.lab)
        while oldest <= sched.newest:
            expected = sched.expected(oldest)
            if expected is None or not expected <= finished.get(oldest, set()):
                break
            sched.closed(oldest, event.time)
            oldest += 1
    return events


class NewestOfEachPeer:
    """A lab's `stale_pool.Deliveries` seen through round_join "newest" for one step whose update draws
    from `rounds`: of each peer, only the newest round in `rounds` with a submission of it is sent;
    its older rounds there that the lab was not sent are recorded as sent without sending them
    (`skipped`: how many accepted samples they held). The lab's own submissions pass as they are."""

    def __init__(self, deliveries: Any, journal: Any, learner: str, rounds: range) -> None:
        self._deliveries, self._journal, self.skipped = deliveries, journal, 0
        self.newest: dict[str, int] = {}  # peer -> its newest round in `rounds` with a submission
        for q in rounds:
            self.newest.update((pid, q) for pid in journal.submitter_ids(q) if pid != learner)

    def take(self, learner: str, round_id: int, sources: set[str]) -> set[str]:
        new = self._deliveries.take(learner, round_id, sources)
        older = {pid for pid in new if round_id < self.newest.get(pid, round_id)}
        if older:
            self.skipped += sum(1 for t in self._journal.pool(round_id) if t.source_id in older)
        return new - older


def newest_update(cfg: Any, journal: Any, deliveries: Any, learner: str, next_round: int,
                  fresh_capabilities: dict[str, float], plan_for: Callable[[int], RoundPlan]) -> Any:
    """`stale_pool.stale_update` under round_join "newest": the same update, with of each peer only its
    newest round in the window (`NewestOfEachPeer`), and `skipped` set."""
    from hacfed.server.coordinator.stale_pool import stale_update, window  # stale_pool -> config -> here

    view = NewestOfEachPeer(deliveries, journal, learner, window(next_round, cfg.rounds, cfg.max_staleness)[1])
    built = stale_update(cfg, journal, view, learner, next_round, fresh_capabilities, plan_for)
    return replace(built, skipped=view.skipped)
