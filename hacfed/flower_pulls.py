"""A shorter first retry when a Flower process pulls a message's content that is still arriving.

Shared by a lab's SuperNode (`hacfed.clients.supernode`, pulling the coordinator's messages from the
SuperLink) and the coordinator's ServerApp (`hacfed.server.driver`, pulling the labs' replies).

Why: a Flower message travels in two steps, its metadata (PushMessages) and then its content
(PushObject per object); the receiver sees the metadata at once and pulls the content with
`flwr.supercore.inflatable.inflatable_utils.pull_objects`, which waits 1 s, 2 s, 4 s ... up to 10 s
(`PULL_INITIAL_BACKOFF`) whenever a piece is not there yet. On loopback the content follows within
milliseconds, but a 0.2 s poll still lands in that gap for about a quarter of the replies (measured:
docs/results.md, "Round time over Flower"), and each such reply then costs a whole extra second.
flwr 1.32 has no option for it. Here the first retry comes after 20 ms, the waits grow to at most
0.5 s, and the number of tries is unbounded, so a slow link is still given Flower's full
`PULL_MAX_TIME` (2 h), unless the caller bounds the time (`max_time_s`). Pinned by
tests/unit/test_flower_pins.py.

The coordinator's ServerApp bounds it (`reply_content_wait_s`): it pulls the labs' replies one after
the other in its only loop, and a reply whose content never comes (the lab's SuperNode was stopped
between its PushMessages and its PushObject: a lab restarted with the same state dir stops the
SuperNode it left behind) held that loop, every round and every other lab's reply, for the 2 h.
Past the bound Flower hands the loop an error reply for that lab, which is asked again later.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from types import ModuleType

from flwr.supercore.inflatable import inflatable_utils

FIRST_RETRY_S = 0.02
MAX_RETRY_WAIT_S = 0.5
REPLY_CONTENT_WAIT_S = 60.0  # the ServerApp's bound on one reply's content (at most its exchange's timeout)


def reply_content_wait_s(exchange_timeout_s: float) -> float:
    """How long the ServerApp waits for one reply's content: a reply later than its exchange's
    timeout (its TTL) is of no use, and one lab must not hold the others' replies for longer
    than REPLY_CONTENT_WAIT_S."""
    return min(REPLY_CONTENT_WAIT_S, exchange_timeout_s)


def quick_pull_objects(max_time_s: float | None = None) -> Callable[..., dict[str, bytes]]:
    """flwr's `pull_objects` with hacfed's retry waits (see the module docstring); `max_time_s`
    bounds one message's pull (None: flwr's PULL_MAX_TIME)."""
    bound = {} if max_time_s is None else {"max_time": max_time_s}
    return functools.partial(inflatable_utils.pull_objects, initial_backoff=FIRST_RETRY_S,
                             backoff_cap=MAX_RETRY_WAIT_S, max_tries_per_object=None, **bound)


def shorten_pull_retries(module: ModuleType, readers: Sequence[Callable[..., object]],
                         max_time_s: float | None = None) -> None:
    """Make `module`'s `pull_objects` (the name `readers` call) retry with hacfed's waits, each
    message's pull bounded by `max_time_s` when given.

    Raises if this flwr no longer pulls content that way, so an upgrade fails loudly instead of
    silently waiting a second again. Calling it twice changes nothing more.
    """
    current = getattr(module, "pull_objects", None)
    if isinstance(current, functools.partial) and current.func is inflatable_utils.pull_objects:
        return
    if current is not inflatable_utils.pull_objects:
        raise RuntimeError(f"{module.__name__}.pull_objects is not flwr's inflatable_utils.pull_objects")
    wanted = {"initial_backoff", "backoff_cap", "max_tries_per_object", "max_time"}
    if not wanted <= set(inspect.signature(current).parameters):
        raise RuntimeError(f"flwr's pull_objects no longer takes {sorted(wanted)}")
    for reader in readers:
        if "pull_objects(" not in inspect.getsource(reader):
            raise RuntimeError(f"{reader.__qualname__} no longer calls pull_objects: hacfed cannot shorten its "
                               f"retries this way")
    module.pull_objects = quick_pull_objects(max_time_s)  # type: ignore[attr-defined]
