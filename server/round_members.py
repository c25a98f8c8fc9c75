"""Which admitted labs the rounds count on: not quarantined, not revoked, not on another task.

Runs in the coordinator's ServerApp process, owned by the round driver (`hacfed.server.driver`).

- A quarantined lab (reward mismatches) gets no more updates (named once on the console).
- A revoked lab (no longer in the registry) is not waited for: the coordinator's `withdrawn`.
- A lab that answered an exchange with HACFED-E-TASK-MISMATCH (its `[task]` differs from the
  coordinator's; its hacfed-client says so in one line and exits 2) is not waited for either, from
  that error on, and is sent nothing more, until a node proves to be that lab again with a new hello
  (it was restarted, presumably on the right task). Without this every round waited its whole
  deadline for a lab that can never answer it.
"""

from __future__ import annotations

from collections.abc import Callable

from hacfed.server.coordinator import Coordinator
from hacfed.server.coordinator.errors import safe_text
from hacfed.server.membership import Membership

TASK_MISMATCH = "HACFED-E-TASK-MISMATCH"  # what a lab's relay answers when a plan is not of its task


class RoundMembers:
    def __init__(self, coordinator: Coordinator, membership: Membership, console: Callable[[str], None]) -> None:
        self._coordinator = coordinator
        self._membership = membership
        self._console = console
        self._told: set[str] = set()  # quarantined labs already named
        self._mismatched: set[str] = set()  # labs whose last answer was a task mismatch

    def refresh(self) -> None:
        """The coordinator's `withdrawn` (the labs an open round stops waiting for): the revoked ones
        (the registry as the membership read it last) and those on another task."""
        revoked = {p.participant_id for p in self._coordinator.participants()
                   if not self._membership.known(p.participant_id)}
        self._coordinator.withdrawn = frozenset(revoked | self._mismatched)

    def active(self, admitted: set[str]) -> set[str]:
        """The admitted labs that get rounds: neither quarantined nor on another task."""
        quarantined = {p.participant_id for p in self._coordinator.participants() if p.quarantined}
        for pid in sorted((admitted & quarantined) - self._told):
            self._told.add(pid)
            self._console(f"{pid} is quarantined (reward mismatches): it gets no more updates")
        return admitted - quarantined - self._mismatched

    def failed(self, participant_id: str, error: str) -> bool:
        """True when `error` (a lab's answer to an exchange) says that its task is not the
        coordinator's: from now on it is not waited for (said once on the console)."""
        if not error.startswith(TASK_MISMATCH):
            return False
        if participant_id not in self._mismatched:
            self._mismatched.add(participant_id)
            self._console(f"{participant_id} is on another task ({safe_text(error, 300)}): it is sent nothing more and "
                          f"rounds stop waiting for it until it joins again")
        self.refresh()
        return True

    def rejoined(self, participant_id: str) -> None:
        """A node proved to be `participant_id` with a new hello: it is counted on again."""
        if participant_id in self._mismatched:
            self._mismatched.discard(participant_id)
            self.refresh()
