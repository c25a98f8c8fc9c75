"""Free-space headroom in the coordinator's state dir (`server.min_free_mib`, docs/operating.md).

Everything the coordinator decides lands in its state dir: the journal and the SuperLink's SQLite
databases, the audit log, the metrics. A full disk fails them in the middle of a write (the
SuperLink answers its labs UNKNOWN, a journal write fails its transaction), so the coordinator keeps
a margin instead:

- hacfed-server refuses to start when the state dir's file system has less than `min_free_mib`
  free (`check_headroom`, one line naming the directory, the free bytes and the setting);
- the running coordinator (`Headroom`, asked by the round driver before each exchange) pauses when
  free space drops below it: it opens no round, closes none and sends nothing, says so once on the
  console, checks again every `CHECK_INTERVAL_S`, and carries on by itself once space is back.
  Replies to what it sent before the pause are still taken: the margin is there for them.

`min_free_mib = 0` turns the check off.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

MIB = 1024 * 1024
DEFAULT_MIN_FREE_MIB = 512
CHECK_INTERVAL_S = 5.0
SETTING = "server.min_free_mib"


class DiskUsage(NamedTuple):
    total: int
    used: int
    free: int


Usage = Callable[[Path], DiskUsage]


def existing_dir(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (a state dir not created yet lies on its file system)."""
    path = Path(path)
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def shortfall(state_dir: Path, min_free_mib: int, usage: Usage | None = None) -> str | None:
    """None when `state_dir`'s file system has at least `min_free_mib` MiB free; else why, in one line.
    usage: `shutil.disk_usage` unless given (tests)."""
    if min_free_mib <= 0:
        return None
    free = (usage or shutil.disk_usage)(existing_dir(state_dir)).free
    if free >= min_free_mib * MIB:
        return None
    return (f"the state dir {state_dir} has {free} bytes free ({free / MIB:.1f} MiB), below {SETTING} = "
            f"{min_free_mib} ({min_free_mib * MIB} bytes)")


def check_headroom(state_dir: Path, min_free_mib: int, usage: Usage | None = None) -> None:
    """hacfed-server's start: raise ValueError (one line) when the state dir lacks the headroom."""
    problem = shortfall(state_dir, min_free_mib, usage)
    if problem is not None:
        raise ValueError(f"{problem}: free space there, give another --state-dir, or lower {SETTING} "
                         f"(0 turns the check off)")


class Headroom:
    """The running coordinator's check: `paused()` is True while the state dir lacks the headroom."""

    def __init__(self, state_dir: Path, min_free_mib: int, console: Callable[[str], None],
                 monotonic: Callable[[], float], usage: Usage | None = None) -> None:
        self.state_dir, self.min_free_mib = Path(state_dir), min_free_mib
        self._console, self._monotonic, self._usage = console, monotonic, usage
        self._checked_at: float | None = None
        self._problem: str | None = None

    def paused(self) -> bool:
        """Asked before each exchange; the file system is asked at most every CHECK_INTERVAL_S."""
        now = self._monotonic()
        if self._checked_at is not None and now - self._checked_at < CHECK_INTERVAL_S:
            return self._problem is not None
        self._checked_at = now
        try:
            problem = shortfall(self.state_dir, self.min_free_mib, self._usage)
        except OSError as exc:
            problem = f"the free space of the state dir {self.state_dir} cannot be read: {exc}"
        if problem is not None and self._problem is None:
            self._console(f"PAUSED: {problem}; no round is opened or closed and nothing is sent until space "
                          f"returns (checked every {CHECK_INTERVAL_S:.0f}s)")
        elif problem is None and self._problem is not None:
            self._console(f"resumed: the state dir {self.state_dir} has {self.min_free_mib} MiB free again ({SETTING})")
        self._problem = problem
        return problem is not None
