"""What the round driver writes of each round: its metrics rows and console lines, with the round's
time split between the labs' steps, the coordinator and the transport.

Runs in the coordinator's ServerApp process, owned by `hacfed.server.driver.FederationDriver`, which
decides when a round opens and closes; this class only records what each lab's submission said of its
step (`record_steps`), the coordinator's own seconds (`timed`), and writes the round when it closed
(`closed`), or, after a restart, the rows of the rounds that closed while the coordinator was down
(`rows_missing_after_resume`). The rows and lines are `hacfed.server.reporting`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from hacfed.server.coordinator import Coordinator
from hacfed.server.coordinator.results import RoundClosed
from hacfed.server.reporting import (
    StepTimes,
    append_rows,
    participant_lines,
    round_line,
    round_rows,
    rounds_written,
    split_round,
)


class RoundReport:
    """The metrics rows and console lines of the rounds one driver closes (module docstring)."""

    def __init__(self, coordinator: Coordinator, metrics_out: Path, console: Callable[[str], None],
                 monotonic: Callable[[], float]) -> None:
        self._coordinator = coordinator
        self._metrics_out = metrics_out
        self._console = console
        self._monotonic = monotonic
        self._steps: dict[int, dict[str, StepTimes]] = {}  # round -> lab -> the step times its submission reported
        self._coordinator_s = 0.0  # the coordinator's own seconds since the last synchronous round opened

    def record_steps(self, participant_id: str, round_id: int, times: StepTimes) -> None:
        self._steps.setdefault(round_id, {})[participant_id] = times

    def steps_of(self, round_id: int) -> dict[str, StepTimes]:
        """The step times recorded so far for open round `round_id`, by lab (a copy)."""
        return dict(self._steps.get(round_id, {}))

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Counts the block's seconds as the coordinator's own work in the round."""
        started = self._monotonic()
        try:
            yield
        finally:
            self._coordinator_s += self._monotonic() - started

    def opened(self) -> None:
        """A synchronous round opened: its split starts from nothing."""
        self._steps, self._coordinator_s = {}, 0.0

    def closed(self, round_id: int, opened_at: float, closed: RoundClosed, connected: Collection[str]) -> None:
        """Round `round_id` (opened at `opened_at` on the coordinator's clock) closed: its rows and lines."""
        cfg, steps = self._coordinator.cfg, self._steps.pop(round_id, {})
        summary = self._coordinator.round_summary(round_id)
        times = split_round(self._coordinator.now() - opened_at, self._coordinator_s, steps)
        append_rows(self._metrics_out, round_rows(summary, cfg.hacpo.mode, cfg.seed, times, steps))
        for line in participant_lines(summary, steps, connected):
            self._console(line)
        self._console(round_line(summary, times) + f"; contributors {list(closed.contributors)}")

    def rows_missing_after_resume(self) -> None:
        """The rows, without timings, of every round that closed while the coordinator was down."""
        cfg, coordinator = self._coordinator.cfg, self._coordinator
        written, _ = rounds_written(self._metrics_out)
        for round_id in range(coordinator.next_round_id):
            record = coordinator.round_record(round_id)
            if record is not None and record.state != "OPEN" and round_id not in written:
                summary = coordinator.round_summary(round_id)
                append_rows(self._metrics_out, round_rows(summary, cfg.hacpo.mode, cfg.seed, None, {}))


__all__ = ["RoundReport"]
