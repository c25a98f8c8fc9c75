"""Reconnect backoff of a lab's SuperNode (security.md R5): 1 s, then x1.6 per attempt, +-20 % jitter,
at most 30 s. Runs in the SuperNode process that hacfed-client starts (`hacfed.clients.supernode`).

Each failed attempt is logged as one `RECONNECT_MARK` line on the SuperNode's stderr (its log file),
which hacfed-client prints: the lab sees that the coordinator is down and every reconnect attempt.
"""

from __future__ import annotations

import random
import sys
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


def install(invoker: Any, out: Callable[[str], None] | None = None) -> Any:
    """Make a flwr `RetryInvoker` wait with `backoff_delays` and log each failed attempt and the
    reconnection."""
    write = out or (lambda line: print(line, file=sys.stderr, flush=True))
    invoker.wait_gen_factory = backoff_delays
    invoker.jitter = None  # backoff_delays jitters already
    on_backoff, on_success = invoker.on_backoff, invoker.on_success

    def backing_off(state: Any) -> None:
        status = getattr(state.exception, "code", lambda: None)()
        reason = status.name if status is not None else type(state.exception).__name__
        write(f"{RECONNECT_MARK} the coordinator is unreachable ({reason}); attempt {state.tries} failed, next "
              f"attempt in {state.actual_wait:.1f}s")
        if on_backoff is not None:
            on_backoff(state)

    def succeeded(state: Any) -> None:
        if state.tries > 1:
            write(f"{RECONNECT_MARK} connected to the coordinator again after {state.tries} attempts "
                  f"({state.elapsed_time:.1f}s)")
        if on_success is not None:
            on_success(state)

    invoker.on_backoff, invoker.on_success = backing_off, succeeded
    return invoker
