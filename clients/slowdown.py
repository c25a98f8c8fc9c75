"""`hacfed-client --slowdown FACTOR`: a lab whose step takes FACTOR times as long, to test labs of
different speeds over the real Flower path (docs/staleness.md; `hacfed sim --lab-speed` is the
simulated counterpart).

Runs in a lab's hacfed-client process, around its `Participant`. After each step (the submission is
in the outbox and the checkpoint written, so a kill during the wait loses nothing) it sleeps
(FACTOR - 1) x the step's compute time, its rollout and training seconds (`Participant.timings`),
before the reply goes back: the coordinator sees a lab FACTOR times slower.

    participant = SlowedParticipant(Participant.from_spec(cfg, task), factor=4.0)
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from hacfed.messages import RoundUpdate, Submission

MAX_SLOWDOWN = 100.0  # beyond it a step's sleep is a hang, not a test of a slow lab


def check_slowdown(value: object) -> float:
    """A slowdown factor: a finite number in [1, MAX_SLOWDOWN] (1: the lab's own speed)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1
            or value > MAX_SLOWDOWN):
        raise ValueError(f"slowdown must be a finite number >= 1 and <= 100 (1: no slowdown), got {value!r}")
    return float(value)


def stretch_s(factor: float, compute_s: float) -> float:
    """How long to sleep after a step of `compute_s` seconds so that it takes `factor` times as long."""
    return max(factor - 1.0, 0.0) * max(compute_s, 0.0)


def compute_seconds(participant: Any, wall_s: float) -> float:
    """The step's rollout and training seconds, when the participant reports them; else its wall time."""
    timings = getattr(participant, "timings", None)
    if timings is None:
        return wall_s
    return float(getattr(timings, "rollout_s", 0.0)) + float(getattr(timings, "training_s", 0.0))


class SlowedParticipant:
    """A participant whose every step is stretched to `factor` times its compute time (module docstring).
    Everything else is the wrapped participant's."""

    def __init__(self, inner: Any, factor: float, sleep: Callable[[float], None] = time.sleep) -> None:
        self.inner = inner
        self.factor = check_slowdown(factor)
        self._sleep = sleep
        self.slept_s = 0.0  # the last step's added wait

    def __getattr__(self, name: str) -> Any:  # participant_id, last_round, policy_version, ...
        return getattr(self.inner, name)

    def step(
        self, update: RoundUpdate, before_checkpoint: Callable[[Submission], None] | None = None
    ) -> Submission:
        started = time.perf_counter()
        submission = self.inner.step(update, before_checkpoint=before_checkpoint)
        self.slept_s = stretch_s(self.factor, compute_seconds(self.inner, time.perf_counter() - started))
        if self.slept_s > 0:
            self._sleep(self.slept_s)
        return submission
