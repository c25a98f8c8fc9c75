"""What each accepted sample is credited for P̂ and for the `successes` pool choice when the
coordinator's `dedup_successes` (docs/security.md, "Duplicate successes count once") or
`format_gate` (docs/security.md, "Inbound checks on peer text") is on.

Runs in the coordinator's ServerApp process and, in-process, in `hacfed sim`, owned by the
coordinator's `SubmissionIntake` (`intake`), which calls it under the coordinator's lock only:
`judge` before a submission's commit, `committed` after it. The rule is the pure
`hacfed.capability.credit_successes`; this module keeps its memory (with `dedup_successes`), the
last `DEDUP_MEMORY` accepted successes with a key (`hacfed.capability.SuccessMemory`), and the
credits of the latest rounds (the round being closed and the pool being published; K + 2 with `max_staleness` K).

Everything here is a function of the journal, which holds every accepted sample in the order it
was committed: a restarted coordinator rebuilds the memory from the journal's newest successes
before the latest rounds it keeps and replays every submission committed since, and so credits what it
would have credited without the restart (tests/unit/test_dedup_successes.py). The rebuild reads
at most `DEDUP_MEMORY` successes' texts, once per process, at its first need.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import groupby

from hacfed.capability import (
    DEDUP_MEMORY,
    DEDUP_MIN_CHARS,
    SuccessMemory,
    credit_successes,
    refused_groups,
    response_key,
)
from hacfed.server.coordinator.journal import Journal
from hacfed.server.coordinator.validation import AcceptedTrajectory

# one accepted sample as credited: (lab, prompt id, credited reward, whether its group is outside the format)
Credited = tuple[str, str, float, bool]
# one submission as judged: its samples' credits, its successes' (key, lab) to remember, and the
# (lab, prompt id) groups with a sample outside the task's format (`format_gate`)
Judged = tuple[list[float], list[tuple[bytes, str]], set[tuple[str, str]]]
# what the `successes` choice ranks a group outside the format by: below every group a lab's inbound
# filter keeps, those without a success included (the filter would leave it out: it is worth nothing)
REFUSED_GROUP = float("-inf")


class SuccessCredits:
    """The credits of the latest rounds and the memory they are judged against (module docstring)."""

    def __init__(
        self, journal: Journal, memory_size: int = DEDUP_MEMORY, min_chars: int = DEDUP_MIN_CHARS, keep_rounds: int = 2,
        *, dedup: bool = True, fits: Callable[[str, float], bool] | None = None,
    ) -> None:
        """keep_rounds: how many of the latest rounds' credits are kept (an older round's are judged
        again from the journal when asked for). dedup: repeated and replayed successes count 0 (a
        memory is kept); fits: the task's response format (`format_gate`; None: off)."""
        self._journal = journal
        self._keep = keep_rounds
        self._size = memory_size
        self._min_chars = min_chars
        self._dedup = dedup
        self._fits = fits
        self._built = False  # the memory and the latest rounds' credits are rebuilt from the journal once
        self._memory: SuccessMemory | None = None  # None without dedup
        self._rounds: dict[int, list[Credited]] = {}
        self._from = 0  # the first round whose credits `_rounds` holds all of (a round not there has none)

    def judge(self, accepted: Sequence[AcceptedTrajectory]) -> Judged:
        """One submission as judged (`Judged`), before its commit (nothing changes here)."""
        samples = [(a.trajectory.source_id, a.trajectory.prompt_id, a.trajectory.response_text, a.trajectory.reward)
                   for a in accepted]
        credits, added = credit_successes(samples, self._current(), self._min_chars, self._fits)
        return credits, added, refused_groups(samples, self._fits)

    def committed(
        self, round_id: int, accepted: Sequence[AcceptedTrajectory], judged: Judged,
    ) -> None:
        """After the submission's COMMIT: remember its successes and keep its credits."""
        memory = self._current()
        credits, added, refused = judged
        for key, lab in added:
            if memory is not None:
                memory.add(key, lab)
        self._from = max(self._from, round_id - self._keep + 1)
        for old in [r for r in self._rounds if r < self._from]:
            del self._rounds[old]
        self._rounds.setdefault(round_id, []).extend(
            (t.source_id, t.prompt_id, c, (t.source_id, t.prompt_id) in refused)
            for t, c in zip((a.trajectory for a in accepted), credits))

    def rewards(self, round_id: int) -> list[tuple[str, float]]:
        """(lab, credited reward) of every accepted sample of the round, for P̂ (`CapabilityTracker.update`)."""
        return [(lab, credit) for lab, _, credit, _ in self._credited(round_id)]

    def group_credit(self, round_id: int) -> dict[tuple[str, str], float]:
        """(prompt id, lab) -> the credited reward of the lab's group, for the `successes` choice
        (`PoolShares`); REFUSED_GROUP for a group outside the task's format."""
        out: dict[tuple[str, str], float] = {}
        for lab, prompt_id, credit, refused in self._credited(round_id):
            out[prompt_id, lab] = REFUSED_GROUP if refused else out.get((prompt_id, lab), 0.0) + credit
        return out

    # -- internals --------------------------------------------------------------------------------

    def _credited(self, round_id: int) -> list[Credited]:
        self._current()
        if round_id >= self._from:
            return list(self._rounds.get(round_id, ()))
        _, rounds = self._replay(round_id, [round_id])  # an older round: judged again, the memory untouched
        return rounds[round_id]

    def _current(self) -> SuccessMemory | None:
        """The memory of every committed submission, rebuilt from the journal once per process."""
        if not self._built:
            latest = self._journal.latest_round()
            last = latest.round_id if latest is not None else 0
            first = max(last - self._keep + 1, 0)
            self._memory, self._rounds = self._replay(first, list(range(first, last + 1)))
            self._from = first
            self._built = True
        return self._memory

    def _replay(self, first: int, round_ids: list[int]) -> tuple[SuccessMemory | None, dict[int, list[Credited]]]:
        """The memory as it was before the first sample of a round >= `first` was committed, then
        every submission committed since judged and remembered in that order: the memory after
        them (None without dedup) and the credits of those of `round_ids`."""
        memory = SuccessMemory(self._size) if self._dedup else None
        before, rows = self._journal.samples_from(first)
        def keyed(lab: str, prompt_id: str, text: str) -> tuple[bytes, str] | None:
            if self._fits is not None and not self._fits(text, 1.0):  # (a success) outside the format: no key
                return None
            key = response_key(prompt_id, text, self._min_chars)
            return None if key is None else (key, lab)

        if memory is not None:
            for key, lab in self._journal.successes_before(before, keyed, self._size):
                memory.add(key, lab)
        rounds: dict[int, list[Credited]] = {round_id: [] for round_id in round_ids}
        for (round_id, _), submission in groupby(rows, key=lambda row: row[:2]):
            samples = [(lab, prompt_id, text, reward) for _, _, lab, prompt_id, text, reward in submission]
            credits, added = credit_successes(samples, memory, self._min_chars, self._fits)
            refused = refused_groups(samples, self._fits)
            for key, lab in added:
                if memory is not None:
                    memory.add(key, lab)
            if round_id in rounds:
                rounds[round_id].extend((lab, prompt_id, c, (lab, prompt_id) in refused)
                                        for (lab, prompt_id, _, _), c in zip(samples, credits))
        return memory, rounds
