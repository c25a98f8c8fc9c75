"""The transport interface and its in-process implementation (docs/design.md "An in-process transport").

Runs in the coordinator's process: the in-process loop drives `hacfed sim`, tests and benchmarks;
the Flower transport is `hacfed.server.serverapp` + `hacfed.server.driver`. Both ask the coordinator's
round engine (`hacfed.server.coordinator.engine`) which step a lab may start and what it is sent.

One exchange per step: the coordinator sends a participant its `RoundUpdate` (what it trains on and
the plan of the round it rolls out, `RoundEngine.update_for`); the participant trains, rolls out the
plan and answers with a `Submission`. `run_rounds` drives that loop with direct calls:

    outcomes = run_rounds(coordinator, [participant_a, participant_b], on_round=print_summary)

On the real clock every step runs as soon as the engine's start rule allows it: with `max_staleness`
0 all labs run round r, it closes, all run round r + 1. Given `pacing` (`hacfed sim --lab-speed`,
docs/staleness.md) the steps run on a simulated clock: a lab's step takes cost(lab, update,
submission) simulated seconds at speed 1, times its speed factor, and its submission reaches the
coordinator when it is done; at equal times a submission arrives before a step starts, and labs start
in their given order. So the schedule, and every result, depends on the settings only, never on the
machine's load; `run_paced` runs a whole paced federation and returns each lab's `StepRecord`s.

A participant that raises or answers nothing does not stall a round: it is logged and the round
closes by quorum or at its deadline (waited for with `sleep`, which a test replaces with a fake clock
that advances); the lab goes on with its next step. After the last round a final update (no plan)
lets every participant train on what is left and send a final report. A quarantined lab takes no
more steps.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence, runtime_checkable

from hacfed.messages import RoundUpdate, Submission
from hacfed.server.coordinator.results import RoundOutcome, StepRecord, SubmissionResult
from hacfed.server.coordinator.state import Coordinator

log = logging.getLogger("hacfed.server.coordinator.transport")
_MAX_WAITS = 10_000  # a `sleep` that never advances the clock must not hang the caller forever


@runtime_checkable
class ParticipantEndpoint(Protocol):
    """One participant as the coordinator sees it. `exchange` returns None when it has nothing to
    submit (e.g. the final update, or a participant that is down)."""

    participant_id: str

    def exchange(self, update: RoundUpdate) -> Submission | None: ...


Cost = Callable[[str, RoundUpdate, "Submission | None"], float]

# A factor outside [1/100, 100] is a typo, not a lab (hacfed-client --slowdown takes 1 to 100).
MIN_SPEED, MAX_SPEED = 0.01, 100.0


def check_speeds(speeds: Mapping[str, float], labs: Sequence[str]) -> dict[str, float]:
    """Every lab's speed factor (1.0 unless given); an unknown lab or a factor that is not a number in
    [MIN_SPEED, MAX_SPEED] is refused, naming it."""
    out = {lab: 1.0 for lab in labs}
    for lab, factor in speeds.items():
        if lab not in out:
            raise ValueError(f"lab speed for unknown agent {lab!r}; agents: {', '.join(labs)}")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) \
                or not MIN_SPEED <= factor <= MAX_SPEED:
            raise ValueError(f"speed factor of {lab} must be a number from {MIN_SPEED:g} to {MAX_SPEED:g}, "
                             f"got {factor!r}")
        out[lab] = float(factor)
    return out


@dataclass(frozen=True)
class Pacing:
    """The simulated clock: each lab's speed factor (1.0 unless given) and the cost of a step at speed 1."""

    speeds: Mapping[str, float]
    cost: Cost


def run_rounds(
    coordinator: Coordinator,
    endpoints: Sequence[ParticipantEndpoint],
    rounds: int | None = None,
    on_round: Callable[[RoundOutcome], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    pacing: Pacing | None = None,
) -> list[RoundOutcome]:
    """Run up to `rounds` more rounds (default: to the end of the run, with the final update), resuming
    where the journal stands. Returns one outcome per round closed by this call."""
    return _InProcess(coordinator, endpoints, rounds, on_round, sleep, pacing).run()


def run_paced(
    coordinator: Coordinator,
    endpoints: Sequence[ParticipantEndpoint],
    speeds: Mapping[str, float],
    cost: Cost,
    on_round: Callable[[RoundOutcome], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[list[RoundOutcome], dict[tuple[str, int], StepRecord]]:
    """Run the whole federation on the simulated clock from a fresh journal. Returns the outcome of every
    round, in order, and every lab's step records by (lab, step)."""
    if coordinator.journal.latest_round() is not None:
        raise ValueError("a paced run starts from a fresh journal: give it an empty state directory")
    run = _InProcess(coordinator, endpoints, None, on_round, sleep, Pacing(speeds, cost))
    return run.run(), run.records


class _InProcess:
    """The state of one `run_rounds` call: labs' steps, submissions on their way, results, records."""

    def __init__(self, coordinator: Coordinator, endpoints: Sequence[ParticipantEndpoint], rounds: int | None,
                 on_round: Callable[[RoundOutcome], None] | None, sleep: Callable[[float], None],
                 pacing: Pacing | None) -> None:
        ids = [ep.participant_id for ep in endpoints]
        if len(set(ids)) != len(ids):
            raise ValueError(f"participant ids must be unique, got {ids}")
        if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0):
            raise ValueError(f"rounds must be an int >= 0 or None, got {rounds!r}")
        self.coordinator, self.engine = coordinator, coordinator.engine
        self.labs, self.endpoints = ids, {ep.participant_id: ep for ep in endpoints}
        self.speeds = check_speeds(pacing.speeds if pacing else {}, ids)
        self.cost = pacing.cost if pacing else None
        self.rounds, self.limit, self.on_round, self.sleep = coordinator.cfg.rounds, rounds, on_round, sleep
        self.joining = coordinator.cfg.round_join == "newest"
        self.now = 0.0
        self.finishes: list[tuple[float, int, str, int]] = []  # (due, rank, lab, step), a heap
        self.running: dict[str, tuple[int, Submission | None]] = {}
        self.last: dict[str, int] = {}  # lab -> the last step it started
        self.done: set[str] = set()
        self.free_at: dict[str, float] = {}  # lab -> when its previous step finished
        self.records: dict[tuple[str, int], StepRecord] = {}
        self.results: dict[int, dict[str, SubmissionResult]] = {}
        self.failures: dict[int, dict[str, str]] = {}
        self.outcomes: list[RoundOutcome] = []

    def run(self) -> list[RoundOutcome]:
        coordinator = self.coordinator
        coordinator.resume()
        if coordinator.finished:
            return []
        for pid in self.labs:
            coordinator.register(pid)
        first = coordinator.current_round if coordinator.current_round is not None else coordinator.next_round_id
        self.end = self.rounds if self.limit is None else min(self.rounds, first + self.limit)
        for pid in self.labs:  # where the journal says each lab is (after a restart)
            self.last[pid] = self.engine.unanswered(pid) - 1
        while True:
            if self.finishes and self.finishes[0][0] <= self.now:
                self.finish(*heapq.heappop(self.finishes))
            elif not self.start_one():
                if self.finishes:
                    self.now = self.finishes[0][0]
                elif coordinator.current_round is not None:
                    self.close_rounds(self.wait_until_closable())  # a round missing a submission
                else:
                    break
        return self.outcomes

    def next_step(self, lab: str) -> int | None:
        """The step `lab` may start now, if any (the engine's start rule)."""
        if self.joining:
            step = self.engine.next_step(lab, resend=False)
        else:
            step = self.last[lab] + 1
            if step > self.rounds or not self.engine.may_start(step):
                return None
        if step is None or (step >= self.end and step != self.rounds) or (step == self.rounds != self.end):
            return None
        return step

    def start_one(self) -> bool:
        """Start the first idle lab (in their given order) that may start a step now; False if none may."""
        for lab in self.labs:
            if lab in self.running or lab in self.done:
                continue
            step = self.next_step(lab)
            if step is None:
                continue
            if lab in {p.participant_id for p in self.coordinator.participants() if p.quarantined}:
                self.failures.setdefault(step, {})[lab] = "quarantined"
                self.done.add(lab)
                continue
            self.start(lab, step)
            return True
        return False

    def start(self, lab: str, step: int) -> None:
        coordinator = self.coordinator
        if step < self.rounds and step == coordinator.next_round_id:
            coordinator.open_round(step)
        own = sum(1 for (pid, _) in self.records if pid == lab)
        built = self.engine.update_for(lab, step)
        submission = exchange_with(self.endpoints[lab], built.update, self.failures.setdefault(step, {}))
        compute = 0.0 if self.cost is None else float(self.cost(lab, built.update, submission)) * self.speeds[lab]
        idle = self.now - self.free_at[lab] if lab in self.free_at else 0.0
        self.records[(lab, step)] = StepRecord(lab, step, self.now, self.now + compute, idle, compute, built.staleness,
                                               own if self.joining else None, built.skipped)
        self.last[lab] = step
        self.running[lab] = (step, submission)
        heapq.heappush(self.finishes, (self.now + compute, self.labs.index(lab), lab, step))
        self.settle()  # opening a round may leave the one before it to its takers alone

    def finish(self, due: float, rank: int, lab: str, step: int) -> None:
        _, submission = self.running.pop(lab)
        self.free_at[lab] = due
        if step == self.rounds:
            self.done.add(lab)
            if submission is not None:
                problem = self.coordinator.record_final_report(submission, sender=lab)
                if problem is not None:
                    log.warning("final report of %s refused: %s %s", lab, problem.code, problem.detail)
            return
        if submission is not None:
            self.results.setdefault(step, {})[lab] = self.coordinator.submit(submission, sender=lab)
        self.settle()

    def settle(self) -> None:
        reason = self.coordinator.poll()
        if reason is not None:
            self.close_rounds(reason)

    def close_rounds(self, reason: str | None) -> None:
        """Close the oldest open round, and each next one that may close too."""
        coordinator = self.coordinator
        while reason is not None:
            closed = coordinator.close_round(reason)
            q = closed.round_id
            steps = {lab: r for (lab, s), r in self.records.items() if s == q}
            outcome = RoundOutcome(q, closed, self.results.pop(q, {}), self.failures.pop(q, {}),
                                   coordinator.round_summary(q), steps)
            self.outcomes.append(outcome)
            if self.on_round is not None:
                self.on_round(outcome)
            reason = coordinator.poll()

    def wait_until_closable(self) -> str:
        coordinator = self.coordinator
        for _ in range(_MAX_WAITS):
            reason = coordinator.poll()
            if reason is not None:
                return reason
            record = coordinator.round_record(coordinator.open_rounds()[0])
            self.sleep(max(record.deadline - coordinator.now(), 0.0))
        raise RuntimeError(f"round {coordinator.open_rounds()[0]} never became closable: does `sleep` advance the "
                           f"coordinator's clock?")


def exchange_with(ep: ParticipantEndpoint, update: RoundUpdate, failures: dict[str, str]) -> Submission | None:
    """One participant's turn. Its failure is an expected event for a federation (security.md T10),
    so it is logged and recorded, and the round goes on without it."""
    try:
        submission = ep.exchange(update)
    except Exception as exc:  # noqa: BLE001 - any participant failure must not stop the others
        log.warning(
            "participant %s failed on the update after round %s: %s",
            ep.participant_id, update.pool_round, exc, exc_info=True,
        )
        failures[ep.participant_id] = f"{type(exc).__name__}: {exc}"
        return None
    if submission is None:
        failures[ep.participant_id] = "no submission"
    return submission
