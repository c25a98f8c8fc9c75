"""What an open round is waiting for, said on the coordinator's console at a steady interval.

    round 4 waiting for lab-b (2 of 3 replied; deadline in 412s)

A round that waits for a lab that is down or slow used to be silent until its deadline; the line
names the labs it still waits for (`Coordinator.awaited`: journaled, not quarantined, not revoked)
and how long the deadline leaves. The driver calls `tick` on every exchange; the first call for a
round only starts its clock, and the journal is read only when a line is due.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

WAITING_LINE_S = 30.0


class WaitingLine:
    def __init__(self, console: Callable[[str], None], interval_s: float = WAITING_LINE_S) -> None:
        self.console, self.interval_s = console, interval_s
        self._round: int | None = None
        self._said_at = 0.0

    def tick(self, coordinator: Any, round_id: int, now: float) -> None:
        """`coordinator`: a hacfed.server.coordinator.Coordinator with `round_id` open; `now`: monotonic s."""
        if round_id != self._round:
            self._round, self._said_at = round_id, now
            return
        if now - self._said_at < self.interval_s:
            return
        self._said_at = now
        awaited = sorted(coordinator.awaited())
        missing = [pid for pid in awaited if not coordinator.has_submitted(pid, round_id)]
        if missing:
            left = max(coordinator.round_record(round_id).deadline - coordinator.now(), 0.0)
            self.console(f"round {round_id} waiting for {', '.join(missing)} ({len(awaited) - len(missing)} of "
                         f"{len(awaited)} replied; deadline in {left:.0f}s)")
