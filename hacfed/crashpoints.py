"""Deterministic crash points for the fault suite (security.md R1): `HACFED_CRASH_AT=name[@n]`.

Shared by both sides. When the variable names a point, the process exits at once with
`os._exit(CRASH_EXIT_CODE)` the n-th time (default: the first) it reaches that point: no
`finally`, no atexit, no flush, as close to `kill -9` as a process can do to itself. A line
on stderr (written unbuffered) says which point fired, so a test can tell the crash it asked for
from any other death.

Points (where each sits):
  before_commit            coordinator journal: a submission's rows and audit line are written, COMMIT is next
  after_commit_before_ack  coordinator: the submission committed, its receipt not yet built or sent
  after_ack                coordinator driver: the lab's reply proves it received the receipt
  mid_round_close          coordinator journal: the round's CLOSED row is written, COMMIT is next
  mid_checkpoint           lab: the checkpoint's files are written and fsynced, the rename is next
"""

from __future__ import annotations

import os

CRASH_ENV = "HACFED_CRASH_AT"
CRASH_EXIT_CODE = 86
POINTS = ("before_commit", "after_commit_before_ack", "after_ack", "mid_round_close", "mid_checkpoint")
_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Exit here if HACFED_CRASH_AT names this point (and this is its n-th hit)."""
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}; known: {POINTS}")
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    point, _, nth = spec.partition("@")
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] != (int(nth) if nth.isdigit() and int(nth) > 0 else 1):
        return
    os.write(2, f"hacfed: {CRASH_ENV}={spec}: crashing at {name} (pid {os.getpid()})\n".encode())
    os._exit(CRASH_EXIT_CODE)
