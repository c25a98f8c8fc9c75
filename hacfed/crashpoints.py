"""Deterministic crash points for the fault suite (security.md R1): `HACFED_CRASH_AT=name[@n]`.

Shared by both sides. When the variable names a point, the process exits at once with
`os._exit(CRASH_EXIT_CODE)` the n-th time (default: the first) it reaches that point: no
`finally`, no atexit, no flush, as close to `kill -9` as a process can do to itself. A line
on stderr (written unbuffered) says which point fired, so a test can tell the crash it asked for
from any other death.

`HACFED_STOP_AT=name[@n]` names a point where the process stops itself instead (SIGSTOP) until a
SIGCONT: a test then holds a process at an exact place, where stopping it from outside would race
with its work (tests/integration/test_state_dir_filled.py holds a lab between taking in a round's
task and sending its reply).

Points (where each sits):
  before_commit            coordinator journal: a submission's rows and audit line are written, COMMIT is next
  after_commit_before_ack  coordinator: the submission committed, its receipt not yet built or sent
  after_ack                coordinator driver: the lab's reply proves it received the receipt
  mid_round_close          coordinator journal: the round's CLOSED row is written, COMMIT is next
  mid_checkpoint           lab: the checkpoint's files are written and fsynced, the rename is next
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "HACFED_CRASH_AT"
STOP_ENV = "HACFED_STOP_AT"
CRASH_EXIT_CODE = 86
POINTS = ("before_commit", "after_commit_before_ack", "after_ack", "mid_round_close", "mid_checkpoint")
_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Exit here if HACFED_CRASH_AT names this point, or stop here if HACFED_STOP_AT does (and this is
    its n-th hit)."""
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}; known: {POINTS}")
    if _fires(CRASH_ENV, name):
        os.write(2, f"hacfed: {CRASH_ENV}={os.environ[CRASH_ENV]}: crashing at {name} (pid {os.getpid()})\n".encode())
        os._exit(CRASH_EXIT_CODE)
    if _fires(STOP_ENV, name):
        os.write(2, f"hacfed: {STOP_ENV}={os.environ[STOP_ENV]}: stopped at {name} (pid {os.getpid()})\n".encode())
        os.kill(os.getpid(), signal.SIGSTOP)


def _fires(env: str, name: str) -> bool:
    """Whether the spec in `env` (`point[@n]`) names `name` and this is its n-th hit (counted per variable)."""
    spec = os.environ.get(env)
    if not spec:
        return False
    point, _, nth = spec.partition("@")
    if point != name:
        return False
    key = f"{env}:{name}"
    _hits[key] = _hits.get(key, 0) + 1
    return _hits[key] == (int(nth) if nth.isdigit() and int(nth) > 0 else 1)
