"""A time budget for verifying one batch of samples (one submission at the coordinator).

Used by `hacfed.server.coordinator.reward_verification` and, for the batches it hands a task,
by `hacfed.tasks.math_verifier.MathVerifier.start_concurrently`. Each sample is also bounded on its
own (the verifier's size screen and its sandbox's wall timeout); this bounds their sum, so one
submission cannot hold the coordinator's verifier for long with many slow-but-legal samples.

What is charged is the verification time the batch itself caused (a sandboxed worker's request, or
an in-process `verify`), never time spent waiting for another batch's requests: an honest
submission judged behind a hostile one is not charged for it. Once the budget is spent nothing more
of the batch is started (its remaining samples are not verified at all), and the batch's result
raises `VerifyBudgetSpent`: the coordinator refuses the whole submission
(`ErrorCode.VERIFY_BUDGET`, a strike). So a batch stops within the budget plus one per-sample
timeout per worker.
"""

from __future__ import annotations

import threading


class VerifyBudgetSpent(Exception):
    """A batch's verification used more than its time budget; the message says how much."""


class VerifyBudget:
    """Seconds of verification one batch may use (thread-safe; None: unbounded)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.spent = 0.0
        self._lock = threading.Lock()

    @property
    def exhausted(self) -> bool:
        """Whether the batch used its budget: start nothing more of it."""
        with self._lock:
            return self.seconds is not None and self.spent > self.seconds

    def charge(self, seconds: float) -> None:
        with self._lock:
            self.spent += seconds

    def check(self) -> None:
        """Raise `VerifyBudgetSpent` when the budget is spent."""
        if self.exhausted:
            raise VerifyBudgetSpent(f"verification took {self.spent:.2f} s, over the budget of {self.seconds:g} s "
                                    f"per submission")
