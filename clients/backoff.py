"""Reconnect backoff of a lab's SuperNode (security.md R5): 1 s, then x1.6 per attempt, +-20 % jitter,
at most 30 s. Runs in the SuperNode process that hacfed-client starts (`hacfed.clients.supernode`).

Each failed attempt is logged as one `RECONNECT_MARK` line on the SuperNode's stderr (its log file),
which hacfed-client prints: the lab sees that the coordinator is down and every reconnect attempt.

Several calls retry at once (the SuperNode's pull loop and its heartbeat), and the call that first gets
through after an outage need not be one that failed: a restarted SuperLink may answer a retried call
with a code that ends its retries, and a fresh call then succeeds at its first try. So the outage is
one `Outage` per SuperNode process, shared by every retry invoker: the first success of any call after
a failed attempt says "connected to the coordinator again".
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

BASE_DELAY_S = 1.0
FACTOR = 1.6
MAX_DELAY_S = 30.0
JITTER = 0.2
RECONNECT_MARK = "hacfed-reconnect:"


def backoff_delays(
    base: float = BASE_DELAY_S, factor: float = FACTOR, max_delay: float = MAX_DELAY_S, jitter: float = JITTER,
    rng: Callable[[], float] = random.random,
) -> Iterator[float]:
    """Waits before each retry: base * factor**n capped at max_delay, jittered by +-jitter (and
    never above max_delay)."""
    delay = base
    while True:
        yield min(max_delay, delay * (1.0 + jitter * (2.0 * rng() - 1.0)))
        delay = min(delay * factor, max_delay)


class Outage:
    """Failed attempts since the coordinator was last reached, across every call that retries."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._attempts = 0  # the most attempts one call has failed since the last success
        self._since: float | None = None  # when the first of them failed

    def failed(self, tries: int) -> None:
        with self._lock:
            if self._since is None:
                self._since = self._clock()
            self._attempts = max(self._attempts, tries)

    def reached(self) -> tuple[int, float] | None:
        """(attempts, seconds down) when this success ends an outage; None when none was going on."""
        with self._lock:
            if self._since is None:
                return None
            ended = (self._attempts + 1, self._clock() - self._since)
            self._attempts, self._since = 0, None
            return ended


_PROCESS_OUTAGE = Outage()  # one SuperNode per process: its invokers share it


def install(invoker: Any, out: Callable[[str], None] | None = None, outage: Outage | None = None) -> Any:
    """Make a flwr `RetryInvoker` wait with `backoff_delays`, log each failed attempt, and log the
    first success of any call after an outage (`outage`: the process's own unless given)."""
    write = out or (lambda line: print(line, file=sys.stderr, flush=True))
    outage = outage or _PROCESS_OUTAGE
    invoker.wait_gen_factory = backoff_delays
    invoker.jitter = None  # backoff_delays jitters already
    on_backoff, on_success = invoker.on_backoff, invoker.on_success

    def backing_off(state: Any) -> None:
        status = getattr(state.exception, "code", lambda: None)()
        reason = status.name if status is not None else type(state.exception).__name__
        write(f"{RECONNECT_MARK} the coordinator is unreachable ({reason}); attempt {state.tries} failed, next "
              f"attempt in {state.actual_wait:.1f}s")
        outage.failed(state.tries)
        if on_backoff is not None:
            on_backoff(state)

    def succeeded(state: Any) -> None:
        if (ended := outage.reached()) is not None:
            attempts, down_s = ended
            write(f"{RECONNECT_MARK} connected to the coordinator again after {attempts} attempts ({down_s:.1f}s)")
        if on_success is not None:
            on_success(state)

    invoker.on_backoff, invoker.on_success = backing_off, succeeded
    return invoker
