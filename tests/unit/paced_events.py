"""The events of a paced in-process run of scripted labs whose step costs are known in advance: each
lab's step starts and finishes on the simulated clock (`transport.run_paced`), for tests of the start
rule worked by hand (tests/unit/test_staleness.py, test_round_join.py)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from hacfed.server.coordinator.transport import run_paced
from tests.unit.test_coordinator_fakes import ScriptedLab, make_coordinator


@dataclass(frozen=True)
class Event:
    time: float  # simulated seconds since the run started
    kind: str  # "start" (the lab takes its update and computes) or "finish" (its submission arrives)
    lab: str
    step: int  # the round whose plan the step rolls out; the final update is step `rounds`
    own_step: int | None = None  # round_join "newest": the lab's steps before this one


def paced_events(compute: Mapping[str, float | Sequence[float]], speeds: Mapping[str, float], max_staleness: int,
                 rounds: int, round_join: str = "every") -> list[Event]:
    """Every event of the run in time order (at equal times a finish before a start, labs in their given
    order). compute[lab]: its step's cost at speed 1, one number or one per own step."""
    labs = list(compute)
    own = dict.fromkeys(labs, 0)

    def cost(lab, update, submission) -> float:
        per, i = compute[lab], own[lab]
        own[lab] += 1
        if isinstance(per, (int, float)):
            return float(per)
        if i >= len(per):
            raise ValueError(f"compute of {lab} has {len(per)} step times, its step {i} needs one more")
        return float(per[i])

    with tempfile.TemporaryDirectory() as state:
        coord = make_coordinator(Path(state), rounds=rounds, expected_participants=len(labs),
                                 min_participants=len(labs), max_staleness=max_staleness, round_join=round_join)
        _, records = run_paced(coord, [ScriptedLab(lab) for lab in labs], speeds, cost)
        coord.journal.close()
    joining = round_join == "newest"
    events = []
    for r in records.values():
        events.append(Event(r.start, "start", r.participant_id, r.step, r.own_step if joining else None))
        events.append(Event(r.finish, "finish", r.participant_id, r.step, r.own_step if joining else None))
    return sorted(events, key=lambda e: (e.time, e.kind == "start", labs.index(e.lab)))
