"""Free-space headroom in the coordinator's state dir (`server.min_free_mib`, docs/operating.md).

Everything the coordinator decides lands in its state dir: the journal and the SuperLink's SQLite
databases, the audit log, the metrics. A full disk fails them in the middle of a write (the
SuperLink answers its labs UNKNOWN, a journal write fails its transaction), so the coordinator keeps
a margin instead:

- hacfed-server refuses to start when the state dir's file system has less than `min_free_mib`
  free (`check_headroom`, one line naming the directory, the free bytes and the setting);
- the running coordinator (`Headroom`, asked by the round driver before each exchange) pauses when
  free space drops below it: it opens no round, closes none and sends nothing, says so once on the
  console, checks again every `CHECK_INTERVAL_S`, and carries on by itself once space is back, with
  the open rounds' deadlines moved later by the time paused (`on_resume`).
  Replies to what it sent before the pause are still taken: the margin is there for them.

`min_free_mib = 0` turns the check off. Another process can still fill the disk to its last byte:
with less than `FREE_ENOUGH` free, each check also writes `PROBE_BYTES` in the state dir (and deletes
them), and a write that fails for lack of space (`is_no_space`) pauses the same way whatever the
setting. hacfed-server makes the same probe (hacfed.server.disk_space) for a ServerApp that ended.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

MIB = 1024 * 1024
DEFAULT_MIN_FREE_MIB = 512
CHECK_INTERVAL_S = 5.0
SETTING = "server.min_free_mib"
HEALTHY_PROBE_S = CHECK_INTERVAL_S


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


PROBE_FILE = ".space-probe"
PROBE_BYTES = 256 * 1024  # a few SQLite pages, a console line and an audit line, with margin
FREE_ENOUGH = 64 * 1024 * 1024  # more free than this: the probe only asks the file system
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
NO_SPACE_TEXTS = ("disk is full", "no space left on device", "disk quota exceeded", "errno 28]")


def is_no_space(error: BaseException | str) -> bool:
    """Whether a failed write failed for lack of space (an OSError's errno, or the text of a wrapped
    one: an AuditError or JournalWriteError names the OSError or SQLite's message)."""
    if isinstance(error, OSError) and error.errno in NO_SPACE_ERRNOS:
        return True
    text = str(error).lower()
    return any(marker in text for marker in NO_SPACE_TEXTS)


def probe_space(state_dir: Path, n_bytes: int = PROBE_BYTES) -> str | None:
    """None when `n_bytes` can be written (and synced) in `state_dir`; else why, in one line. Other
    failures (permissions, a missing dir) are not this check's business: None."""
    try:
        if shutil.disk_usage(state_dir).free >= FREE_ENOUGH:
            return None  # no write can fail for lack of space here yet: nothing is written to find out
    except OSError:
        return None
    path = Path(state_dir) / PROBE_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        return _reason(state_dir, exc) if is_no_space(exc) else None
    try:
        block = b"\0" * 65536
        left = n_bytes
        while left > 0:
            left -= os.write(fd, block[:left])
        os.fsync(fd)
    except OSError as exc:
        return _reason(state_dir, exc) if is_no_space(exc) else None
    finally:
        os.close(fd)
        try:
            path.unlink()
        except OSError:
            pass
    return None


def _reason(state_dir: Path, exc: OSError) -> str:
    return f"a write of {PROBE_BYTES // 1024} KiB to the state dir {state_dir} fails: {exc.strerror or exc}"


class Headroom:
    """The running coordinator's check: `paused()` is True while the state dir lacks the headroom."""

    def __init__(self, state_dir: Path, min_free_mib: int, console: Callable[[str], None],
                 monotonic: Callable[[], float], usage: Usage | None = None,
                 on_resume: Callable[[float], None] | None = None) -> None:
        """on_resume(paused_s): called once space is back, with the seconds paused (the driver holds
        the open rounds' deadlines by as much: the labs could not deliver meanwhile)."""
        self.state_dir, self.min_free_mib = Path(state_dir), min_free_mib
        self._console, self._monotonic, self._usage = console, monotonic, usage
        self._on_resume = on_resume
        self._checked_at: float | None = None
        self._paused_at = 0.0
        self._problem: str | None = None

    def paused(self) -> bool:
        """Asked before each exchange; the file system is asked at most every CHECK_INTERVAL_S."""
        now = self._monotonic()
        if self._checked_at is not None and now - self._checked_at < CHECK_INTERVAL_S:
            return self._problem is not None
        self._checked_at = now
        try:
            problem = shortfall(self.state_dir, self.min_free_mib, self._usage) or probe_space(self.state_dir)
        except OSError as exc:
            problem = f"the free space of the state dir {self.state_dir} cannot be read: {exc}"
        if problem is not None and self._problem is None:
            self._paused_at = now
            self._console(f"PAUSED: {problem}; no round is opened or closed and nothing is sent until space "
                          f"returns (checked every {CHECK_INTERVAL_S:.0f}s)")
        elif problem is None and self._problem is not None:
            self._console(f"resumed: the state dir {self.state_dir} has space again ({SETTING} = {self.min_free_mib}, "
                          f"and a write there succeeds)")
        resumed = problem is None and self._problem is not None
        self._problem = problem
        if resumed and self._on_resume is not None:
            self._on_resume(now - self._paused_at)
        return problem is not None
