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
`PULL_MAX_TIME` (2 h). Pinned by tests/unit/test_flower_pins.py.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from types import ModuleType

from flwr.supercore.inflatable import inflatable_utils

FIRST_RETRY_S = 0.02
MAX_RETRY_WAIT_S = 0.5


def quick_pull_objects() -> Callable[..., dict[str, bytes]]:
    """flwr's `pull_objects` with hacfed's retry waits (see the module docstring)."""
    return functools.partial(inflatable_utils.pull_objects, initial_backoff=FIRST_RETRY_S,
                             backoff_cap=MAX_RETRY_WAIT_S, max_tries_per_object=None)


def shorten_pull_retries(module: ModuleType, readers: Sequence[Callable[..., object]]) -> None:
    """Make `module`'s `pull_objects` (the name `readers` call) retry with hacfed's waits.

    Raises if this flwr no longer pulls content that way, so an upgrade fails loudly instead of
    silently waiting a second again. Calling it twice changes nothing more.
    """
    current = getattr(module, "pull_objects", None)
    if isinstance(current, functools.partial) and current.func is inflatable_utils.pull_objects:
        return
    if current is not inflatable_utils.pull_objects:
        raise RuntimeError(f"{module.__name__}.pull_objects is not flwr's inflatable_utils.pull_objects")
    wanted = {"initial_backoff", "backoff_cap", "max_tries_per_object"}
    if not wanted <= set(inspect.signature(current).parameters):
        raise RuntimeError(f"flwr's pull_objects no longer takes {sorted(wanted)}")
    for reader in readers:
        if "pull_objects(" not in inspect.getsource(reader):
            raise RuntimeError(f"{reader.__qualname__} no longer calls pull_objects: hacfed cannot shorten its "
                               f"retries this way")
    module.pull_objects = quick_pull_objects()  # type: ignore[attr-defined]
