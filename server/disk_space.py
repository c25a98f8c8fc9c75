"""A state dir whose writes fail for lack of space: hacfed-server pauses instead of giving up.

The headroom check (hacfed.server.headroom) pauses the round driver while free space is below
`server.min_free_mib`. Another process can still fill the disk to its last byte between two checks,
or with the check off: then a write fails (ENOSPC, SQLite's "database or disk is full") in the
journal, the audit log, the console or the SuperLink's database, and the ServerApp ends (a failed
journal write fails closed: hacfed.server.driver). hacfed-server takes that as the same pause
(`SpacePause`):

- it probes the state dir (`headroom.probe_space`) when the ServerApp or the SuperLink has ended, and
  every `HEALTHY_PROBE_S` while they run;
- a probe that fails for lack of space prints `PAUSED: ...` once; a ServerApp run that ends while
  paused does not count towards `server.max_run_restarts`, and nothing is restarted;
- it probes again with backoff (1 s, doubling, at most `headroom.CHECK_INTERVAL_S`);
- once a probe succeeds it prints `resumed: ...` and starts Flower's side again: the SuperLink and
  the ServerApp may have failed a write in any state (the SuperLink's SuperExec was seen to die, and
  with it every later run), so both are stopped, the open rounds' deadlines move later by the time
  paused (journaled as `deadline_held`: the labs could not deliver meanwhile; not again if the
  driver held them itself), and both start again on the same port; the ServerApp resumes from the
  journal and the labs' SuperNodes reconnect by themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hacfed.server.coordinator.audit import AuditLog
from hacfed.server.coordinator.journal import Journal
from hacfed.server.headroom import CHECK_INTERVAL_S, HEALTHY_PROBE_S, probe_space

FIRST_RETRY_S = 1.0


class SpacePause:
    """hacfed-server's pause while the state dir's writes fail for lack of space (module docstring)."""

    def __init__(self, state_dir: Path, say: Callable[[str], None], monotonic: Callable[[], float],
                 clock: Callable[[], float], probe: Callable[[Path], str | None] = probe_space) -> None:
        self.state_dir = Path(state_dir)
        self._say, self._monotonic, self._clock, self._probe = say, monotonic, clock, probe
        self._next_probe = 0.0
        self._retry_s = FIRST_RETRY_S
        self.since: float | None = None  # wall clock when the pause began (None: not paused)

    @property
    def paused(self) -> bool:
        return self.since is not None

    def check(self, now_needed: bool = False) -> tuple[float, float] | None:
        """Probe when due (`now_needed`: at once, e.g. a process just ended). Returns the pause, (when
        it began on the wall clock, how many seconds it lasted), when it ends on this call, else None."""
        now = self._monotonic()
        if not now_needed and now < self._next_probe:
            return None
        problem = self._probe(self.state_dir)
        if problem is not None:
            if self.since is None:
                self.since = self._clock()
                self._retry_s = FIRST_RETRY_S
                self._say(f"PAUSED: {problem}; no round is opened or closed and the ServerApp is not restarted "
                          f"until space returns (checked again with backoff, at most every {CHECK_INTERVAL_S:.0f}s)")
            self._next_probe = now + self._retry_s
            self._retry_s = min(self._retry_s * 2.0, CHECK_INTERVAL_S)
            return None
        self._next_probe = now + HEALTHY_PROBE_S
        if self.since is None:
            return None
        since, paused_s = self.since, max(self._clock() - self.since, 0.0)
        self.since = None
        self._say(f"resumed: the state dir {self.state_dir} can be written again (paused {paused_s:.0f}s)")
        return since, paused_s


def hold_open_deadlines(journal_path: Path, audit_path: Path, since: float, paused_s: float, now: float) -> list[int]:
    """hacfed-server, with no ServerApp running: move the open rounds' deadlines `paused_s` later
    (journaled and audited as `deadline_held`) unless a ServerApp that lived through the pause begun
    at `since` held them already (its driver's headroom check: hacfed.server.headroom); returns the
    rounds held."""
    with Journal(journal_path, audit=AuditLog(audit_path)) as journal:
        if any(event["at"] >= since for event in journal.events("deadline_held")):
            return []
        return journal.hold_deadlines(paused_s, now, held_detail(paused_s))


def held_detail(paused_s: float) -> str:
    return f"paused {paused_s:.1f}s for lack of space in the state dir: the deadline moves as much later"
