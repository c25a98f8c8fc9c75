"""The in-process transport on a simulated clock: labs of different speeds, bounded staleness.

Runs in `hacfed sim --lab-speed AGENT=FACTOR --max-staleness K` (docs/staleness.md). The same
`Coordinator` and participant endpoints as `transport.run_rounds`, driven by the event order of a
`schedule.Schedule`: at a lab's "start" event it is sent its update (`Coordinator.make_stale_update`)
and computes its step at once; `cost(lab, update, submission)` gives the step's compute time at speed
1, which the schedule scales by the lab's factor; at its "finish" event its submission reaches the
coordinator (verified, journaled), and every round that now has all its submissions closes. So the
coordinator sees submissions in simulated time, whatever the machine's load.

    outcomes = run_paced(coordinator, endpoints, {"tiny-gpt2": 4.0}, cost, on_round=print_rows)

With K = 0 every lab's update is the one `run_rounds` sends and the rounds close in the same order,
so the training is the same (tests/unit/test_staleness_sim.py). A lab whose exchange fails sends
nothing for that step and goes on with the next; a round missing a submission then closes at its
deadline (waited for with `sleep`), as in `run_rounds`.

With `round_join = "newest"` the events come from a `round_join.JoinSchedule`: a lab's step rolls
out the round the schedule gives it (it may open it), the coordinator learns who took each round once
no other lab can (`Coordinator.joined`), the lab is sent of each peer only its newest round
(`round_join.newest_update`) and asked to evaluate every `eval_every` of its own steps
(`round_join.own_step_plan`); a lab found quarantined takes no more steps.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from hacfed.messages import RoundUpdate, Submission
from hacfed.server.coordinator.round_join import JoinSchedule, own_step_plan
from hacfed.server.coordinator.schedule import Schedule
from hacfed.server.coordinator.state import Coordinator
from hacfed.server.coordinator.transport import ParticipantEndpoint, RoundOutcome, exchange_with, wait_until_closable

log = logging.getLogger("hacfed.server.coordinator.paced")


@dataclass(frozen=True)
class StepRecord:
    """One lab's step on the simulated clock and what it trained on."""

    participant_id: str
    step: int  # the round whose plan it rolled out; `rounds` for the final update
    start: float
    finish: float
    idle: float  # waited since its previous step finished
    compute: float  # simulated seconds: cost x speed factor
    staleness: tuple[int, ...]  # of each sample it was sent (0: the round just before its step)
    own_step: int | None = None  # round_join "newest": how many rounds the lab rolled out before this step
    skipped: int = 0  # round_join "newest": accepted samples of peer rounds skipped for this step

    def metrics(self) -> dict[str, float]:
        """The metrics row's `sim/*` keys (docs/experiments.md)."""
        out = {"sim/start_s": self.start, "sim/finish_s": self.finish, "sim/idle_s": self.idle,
               "sim/compute_s": self.compute, "sim/trained_samples": float(len(self.staleness))}
        if self.staleness:
            out["sim/staleness_mean"] = sum(self.staleness) / len(self.staleness)
            out["sim/staleness_max"] = float(max(self.staleness))
        for s in sorted(set(self.staleness)):
            out[f"sim/staleness_{s}"] = float(self.staleness.count(s))
        if self.own_step is not None:
            out["sim/own_step"] = float(self.own_step)
            out["sim/skipped_samples"] = float(self.skipped)
        return out


Cost = Callable[[str, RoundUpdate, "Submission | None"], float]


def run_paced(
    coordinator: Coordinator,
    endpoints: Sequence[ParticipantEndpoint],
    speeds: Mapping[str, float],
    cost: Cost,
    on_round: Callable[[RoundOutcome, Mapping[str, StepRecord]], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[list[RoundOutcome], dict[tuple[str, int], StepRecord]]:
    """Run the whole federation from a fresh journal. Returns the outcome of every round, in order,
    and every lab's step records by (lab, step). on_round(outcome, records of the round's steps by lab)."""
    ids = [ep.participant_id for ep in endpoints]
    if len(set(ids)) != len(ids):
        raise ValueError(f"participant ids must be unique, got {ids}")
    cfg = coordinator.cfg
    if coordinator.journal.latest_round() is not None:
        raise ValueError("a paced run starts from a fresh journal: give it an empty state directory")
    for pid in ids:
        coordinator.register(pid)
    by_id = {ep.participant_id: ep for ep in endpoints}
    joining = cfg.round_join == "newest"
    sched = (JoinSchedule if joining else Schedule)(ids, speeds, cfg.max_staleness, cfg.rounds)
    run = _PacedRun(coordinator, by_id, sched, cost, on_round, sleep)
    while True:
        event = sched.pop()
        if event is None:
            if coordinator.current_round is None:
                break
            run.close_rounds(wait_until_closable(coordinator, sleep))  # a round missing a submission
            continue
        if event.kind == "start":
            run.start(event.lab, event.step, event.own_step)
            if joining:  # opening a round may leave the one before it to its takers alone
                run.settle()
        else:
            run.finish(event.lab, event.step)
    return run.outcomes, run.records


class _PacedRun:
    """The state of one `run_paced` call: submissions on their way, results, records."""

    def __init__(self, coordinator: Coordinator, endpoints: Mapping[str, ParticipantEndpoint],
                 sched: Schedule | JoinSchedule,
                 cost: Cost, on_round: Callable | None, sleep: Callable[[float], None]) -> None:
        self.coordinator, self.endpoints, self.sched, self.cost = coordinator, endpoints, sched, cost
        self.on_round, self.sleep = on_round, sleep
        self.rounds = coordinator.cfg.rounds
        self.in_flight: dict[tuple[str, int], Submission | None] = {}
        self.staleness: dict[tuple[str, int], tuple[int, ...]] = {}
        self.skipped: dict[tuple[str, int], int] = {}
        self.records: dict[tuple[str, int], StepRecord] = {}
        self.results: dict[int, dict] = {}
        self.failures: dict[int, dict[str, str]] = {}
        self.outcomes: list[RoundOutcome] = []

    def start(self, lab: str, step: int, own_step: int | None = None) -> None:
        coordinator = self.coordinator
        while step < self.rounds and coordinator.next_round_id <= step:
            coordinator.open_round(coordinator.next_round_id)
        quarantined = {p.participant_id for p in coordinator.participants() if p.quarantined}
        failures = self.failures.setdefault(step, {})
        if lab in quarantined:
            if isinstance(self.sched, JoinSchedule):
                self.sched.drop(lab)
            failures[lab] = "quarantined"
            self.in_flight[(lab, step)], self.staleness[(lab, step)] = None, ()
            self.sched.finished(lab, step, 0.0)
            return
        built = coordinator.make_stale_update(lab, step)
        update = built.update if own_step is None else own_step_plan(built.update, own_step, coordinator.cfg.eval_every)
        submission = exchange_with(self.endpoints[lab], update, failures)
        self.in_flight[(lab, step)], self.staleness[(lab, step)] = submission, built.staleness
        self.skipped[(lab, step)] = built.skipped
        self.sched.finished(lab, step, float(self.cost(lab, built.update, submission)))

    def finish(self, lab: str, step: int) -> None:
        sched = self.sched
        start = sched.start_of(lab, step)
        own = sched.own_step(lab, step) if isinstance(sched, JoinSchedule) else None
        self.records[(lab, step)] = StepRecord(lab, step, start, sched.now, sched.idle_before(lab, step),
                                               sched.now - start, self.staleness.pop((lab, step)), own,
                                               self.skipped.pop((lab, step), 0))
        submission = self.in_flight.pop((lab, step))
        if step == self.rounds:
            if submission is not None:
                problem = self.coordinator.record_final_report(submission, sender=lab)
                if problem is not None:
                    log.warning("final report of %s refused: %s %s", lab, problem.code, problem.detail)
            return
        if submission is not None:
            self.results.setdefault(step, {})[lab] = self.coordinator.submit(submission, sender=lab)
        self.settle()

    def settle(self) -> None:
        """Close what may close now; with round_join "newest" first tell the coordinator who took each
        round no other lab can take any more, and stop scheduling labs it quarantined."""
        coordinator, sched = self.coordinator, self.sched
        if isinstance(sched, JoinSchedule):
            for p in coordinator.participants():
                if p.quarantined:
                    sched.drop(p.participant_id)
            for q in coordinator.open_rounds():
                takers = sched.expected(q)
                if takers is not None:
                    coordinator.joined[q] = takers
        reason = coordinator.poll()
        if reason is not None:
            self.close_rounds(reason)

    def close_rounds(self, reason: str) -> None:
        """Close the oldest open round, and each next one that has all its submissions too."""
        coordinator = self.coordinator
        while reason is not None:
            closed = coordinator.close_round(reason)
            q = closed.round_id
            self.sched.closed(q)
            outcome = RoundOutcome(q, closed, self.results.pop(q, {}), self.failures.pop(q, {}),
                                   coordinator.round_summary(q))
            self.outcomes.append(outcome)
            if self.on_round is not None:
                self.on_round(outcome, {lab: r for (lab, s), r in self.records.items() if s == q})
            reason = coordinator.poll()
