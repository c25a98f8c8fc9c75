"""Each lab's pace as the coordinator's journal shows it: the last round it answered, how far behind
the latest round that is, how long it waited between its reply and its next plan, and (K >= 1) how
many rounds old the samples of its latest update were.

    paces = lab_paces(submissions, rounds, total_rounds=20, now=time.time())
    paces["lab-b"]      # {"last_round": 7, "behind": 1, "idle_last_s": 0.4, "idle_s": 3.1, ...}

`submissions` are the journal's (participant_id, round_id, received_at) rows, `rounds` its rounds
(round_id, state, opened_at, closed_at); every time is the coordinator's clock. For a submission to
round r the lab's next plan is sent when round r + 1 opens (the last round: when it closes, with the
final update), so its idle time for r is next plan − received_at, the time it waited for the slower
labs (and for the coordinator to close the round). A lab that replied and has no next plan yet is
waiting now. Idle share: its idle time over the time from each answered round's opening to its next
plan. `behind` is the latest round's id minus the last round the lab answered: 0 when it answered
the latest round, 1 while it works on the open round, more when it missed rounds.

Staleness (`max_staleness` K >= 1, docs/staleness.md "Over Flower"): `lab_staleness(sent)` reads the
journal's `sent_sources` rows (participant_id, step, round_id), one per submission a lab's update for
a step carries. For each lab's latest step that carried any, a submission of round q sent with step t
is t - 1 - q rounds old (0: the round just before the step, at most K); `stale_max` and `stale_mean`
are over that step's submissions (each counts once, whatever its share of samples). A synchronous
run (K = 0) journals no such rows, and a journal older than schema 4 has no such table: no value.

    lab_staleness(sent)["lab-a"]   # {"stale_step": 3, "stale_max": 1, "stale_mean": 0.5, "stale_sources": 2}
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

MAX_IDLE_S = 86_400.0 * 365  # a wait beyond a year is a clock jump, not a wait: left out


def _time(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _wait(start: float | None, end: float | None) -> float | None:
    if start is None or end is None or not 0.0 <= end - start <= MAX_IDLE_S:
        return None
    return end - start


def next_plan_at(round_id: int, rounds: Mapping[int, Mapping[str, Any]], total_rounds: int) -> float | None:
    """When the plan after round `round_id` was sent: round + 1's opening, or for the last round its
    close (the final update); None while it has not been sent."""
    following = rounds.get(round_id + 1)
    if following is not None:
        return _time(following["opened_at"])
    this = rounds.get(round_id)
    if this is not None and round_id == total_rounds - 1 and this["state"] != "OPEN":
        return _time(this["closed_at"])
    return None


def lab_paces(submissions: Sequence[Mapping[str, Any]], rounds: Sequence[Mapping[str, Any]], total_rounds: int,
              now: float) -> dict[str, dict[str, Any]]:
    """participant -> its pace (module docstring), for every participant with a submission."""
    by_id = {int(r["round_id"]): r for r in rounds}
    latest = max(by_id) if by_id else None
    out: dict[str, dict[str, Any]] = {}
    for sub in sorted(submissions, key=lambda s: (str(s["participant_id"]), int(s["round_id"]))):
        pid, rnd, received = str(sub["participant_id"]), int(sub["round_id"]), _time(sub["received_at"])
        pace = out.setdefault(pid, {"last_round": None, "behind": None, "idle_last_s": None, "idle_s": 0.0,
                                    "idle_share": None, "waiting_s": None, "_window_s": 0.0})
        pace["last_round"] = rnd
        pace["behind"] = None if latest is None else max(latest - rnd, 0)
        next_plan = next_plan_at(rnd, by_id, total_rounds)
        idle = _wait(received, next_plan)
        window = _wait(_time(by_id[rnd]["opened_at"]) if rnd in by_id else None, next_plan)
        pace["waiting_s"] = _wait(received, now) if next_plan is None else None
        if idle is not None and window is not None:
            pace["idle_last_s"] = idle
            pace["idle_s"] += idle
            pace["_window_s"] += window
    for pace in out.values():
        window = pace.pop("_window_s")
        pace["idle_share"] = min(pace["idle_s"] / window, 1.0) if window > 0 else None
    return out


NO_STALENESS = {"stale_step": None, "stale_max": None, "stale_mean": None, "stale_sources": None}


def lab_staleness(sent: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """participant -> the staleness of its latest update that carried samples (module docstring), for
    every participant with a `sent_sources` row."""
    by_lab: dict[str, list[tuple[int, int]]] = {}
    for row in sent:
        by_lab.setdefault(str(row["participant_id"]), []).append((int(row["step"]), int(row["round_id"])))
    out: dict[str, dict[str, Any]] = {}
    for pid, pairs in by_lab.items():
        step = max(s for s, _ in pairs)
        ages = [step - 1 - q for s, q in pairs if s == step]
        out[pid] = {"stale_step": step, "stale_max": max(ages), "stale_mean": sum(ages) / len(ages),
                    "stale_sources": len(ages)}
    return out
