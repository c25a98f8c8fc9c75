"""The order of events on a simulated clock when labs of different speeds run with bounded staleness.

Pure and torch-free: used by the paced in-process transport (`hacfed.server.coordinator.paced`,
which drives `hacfed sim --lab-speed / --max-staleness`) and tested on its own. docs/staleness.md
has the rules and what they guarantee.

Each lab runs steps 0, 1, ..., R: step t < R trains on what it was sent and rolls out round t's plan,
step R (the final update) only trains and evaluates. A step takes its compute time times the lab's
speed factor. Lab l may start step t at

    S_l(t) = max(F_l(t - 1), C(t - 1 - K))         (t >= 1; S_l(0) = 0)

where F_l is when its step finished (its submission reaches the coordinator), C(q) when round q
closed (every lab's round-q submission is in) and K = max_staleness; the final step waits for
C(R - 1), so every sample is trained on. K = 0 is the synchronous federation: every lab starts step
t when round t - 1 closes. At equal times a finish comes before a start (a lab starting at the
instant a peer finishes sees the peer's samples), then labs in the order given.

    sched = Schedule(["a", "b"], {"b": 4.0}, max_staleness=1, rounds=10)
    while (event := sched.pop()) is not None:
        if event.kind == "start":
            sched.finished(event.lab, event.step, compute_seconds)   # scaled by b's factor 4
        elif <round q now complete>:
            sched.closed(q, event.time)

`order_events` runs that loop for compute times known in advance.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

_FINISH, _START = 0, 1  # at equal times a finish comes first


@dataclass(frozen=True)
class Event:
    time: float  # simulated seconds since the run started
    kind: str  # "start" (the lab takes its update and computes) or "finish" (its submission arrives)
    lab: str
    step: int  # the round whose plan the step rolls out; the final update is step `rounds`
    own_step: int | None = None  # round_join "newest" (`round_join`): the lab's steps before this one


def check_max_staleness(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_staleness must be an integer >= 0, got {value!r}")
    return value


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


def check_schedule(labs: Sequence[str], speeds: Mapping[str, float], max_staleness: int,
                   rounds: int) -> tuple[tuple[str, ...], dict[str, float], int, int]:
    """A schedule's labs (distinct, at least one), speeds, K and rounds (an integer >= 1), checked and
    normalised; a bad one is refused, naming it. Shared by `Schedule` and `round_join.JoinSchedule`."""
    if not labs or len(set(labs)) != len(labs):
        raise ValueError(f"labs must be distinct and at least one, got {list(labs)}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    labs = tuple(labs)
    return labs, check_speeds(speeds, labs), check_max_staleness(max_staleness), rounds


def check_compute(lab: str, step: int, compute: object) -> None:
    """A step's compute time at speed 1: a finite number >= 0."""
    if isinstance(compute, bool) or not isinstance(compute, (int, float)) or not math.isfinite(compute) \
            or compute < 0:
        raise ValueError(f"compute time of {lab} step {step} must be a finite number >= 0, got {compute!r}")


class Schedule:
    """Which lab starts or finishes which step next, on the simulated clock (module docstring)."""

    def __init__(self, labs: Sequence[str], speeds: Mapping[str, float], max_staleness: int, rounds: int) -> None:
        self.labs, self.speeds, self.max_staleness, self.rounds = check_schedule(labs, speeds, max_staleness, rounds)
        self._rank = {lab: i for i, lab in enumerate(self.labs)}
        self._heap: list[tuple[float, int, int, int, str]] = []
        self._starts: dict[str, list[float]] = {lab: [] for lab in self.labs}  # popped starts, by step
        self._finishes: dict[str, list[float]] = {lab: [] for lab in self.labs}  # popped finishes, by step
        self._queued: dict[str, int] = {lab: 0 for lab in self.labs}  # the next step whose start is not queued
        self._closed: dict[int, float] = {}
        self._running: set[tuple[str, int]] = set()  # started, finish not yet known
        self.now = 0.0
        self._queue_ready()

    def pop(self) -> Event | None:
        """The next event in time order, or None when nothing can happen until a round closes (or
        every lab is done)."""
        if not self._heap:
            return None
        time, kind, _, step, lab = heapq.heappop(self._heap)
        self.now = time
        if kind == _START:
            self._starts[lab].append(time)
            self._running.add((lab, step))
            return Event(time, "start", lab, step)
        self._finishes[lab].append(time)
        self._queue_ready()
        return Event(time, "finish", lab, step)

    def finished(self, lab: str, step: int, compute: float) -> None:
        """The started step took `compute` seconds at speed 1: its finish is due at start + compute x factor."""
        if (lab, step) not in self._running:
            raise ValueError(f"{lab} has no running step {step}")
        check_compute(lab, step, compute)
        self._running.discard((lab, step))
        due = self._starts[lab][step] + compute * self.speeds[lab]
        heapq.heappush(self._heap, (due, _FINISH, self._rank[lab], step, lab))

    def closed(self, round_id: int, at: float | None = None) -> None:
        """Round `round_id` closed at simulated time `at` (default: now); steps waiting for it may start."""
        self._closed[round_id] = self.now if at is None else at
        self._queue_ready()

    def start_of(self, lab: str, step: int) -> float:
        return self._starts[lab][step]

    def idle_before(self, lab: str, step: int) -> float:
        """How long the lab waited between finishing step - 1 and starting `step` (0 for step 0)."""
        return 0.0 if step == 0 else self._starts[lab][step] - self._finishes[lab][step - 1]

    def gate(self, lab: str, step: int) -> float | None:
        """When `lab` may start `step`, or None while what it waits for has not happened yet."""
        if step == 0:
            return 0.0
        if len(self._finishes[lab]) < step:
            return None
        at = self._finishes[lab][step - 1]
        waits_for = step - 1 if step == self.rounds else step - 1 - self.max_staleness
        if waits_for >= 0:
            if waits_for not in self._closed:
                return None
            at = max(at, self._closed[waits_for])
        return at

    def _queue_ready(self) -> None:
        for lab in self.labs:
            step = self._queued[lab]
            if step > self.rounds:
                continue
            at = self.gate(lab, step)
            if at is not None:
                heapq.heappush(self._heap, (at, _START, self._rank[lab], step, lab))
                self._queued[lab] = step + 1


def order_events(
    compute: Mapping[str, Sequence[float]], speeds: Mapping[str, float], max_staleness: int,
) -> list[Event]:
    """Every event of a run whose compute times are known: `compute[lab][t]` is step t's time at
    speed 1, for t = 0..R (R rounds and the final update), the same R for every lab. A round closes
    when every lab's step for it has finished."""
    labs = list(compute)
    lengths = {len(compute[lab]) for lab in labs}
    if len(lengths) != 1 or min(lengths) < 2:
        raise ValueError(f"every lab needs the same number (>= 2) of step times, got {sorted(lengths)}")
    rounds = lengths.pop() - 1
    sched = Schedule(labs, speeds, max_staleness, rounds)
    done: dict[int, int] = {}
    events: list[Event] = []
    while (event := sched.pop()) is not None:
        events.append(event)
        if event.kind == "start":
            sched.finished(event.lab, event.step, compute[event.lab][event.step])
        elif event.step < rounds:
            done[event.step] = done.get(event.step, 0) + 1
            if done[event.step] == len(labs):
                sched.closed(event.step, event.time)
    return events
