"""What the Linux process table says about a process tree, read from /proc.

`ManagedProcess.stop` (in `hacfed.procs`) needs to know which processes a child started,
whether any of its process group still runs, and whether a pid still names the same
process, so that a kill never hits a recycled pid. Where /proc is missing (not Linux),
these answers degrade to "no descendants known" and "the group may still exist".
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to process group `pgid`; an empty group is not an error."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group is already empty


def group_exists(pgid: int) -> bool:
    """True while a non-zombie process is in group `pgid`.

    Zombies are ignored: where PID 1 does not reap orphans (some containers), a killed
    grandchild stays a zombie forever, yet it runs nothing and holds no port.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return True
    for entry in proc_dir.iterdir():
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name))
            if fields and fields[0] != "Z" and int(fields[2]) == pgid:  # state, pgrp
                return True
    return False


def pgid_or_none(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@dataclass(frozen=True)
class ProcId:
    """A pid plus its start time, so a kill never hits a recycled pid."""

    pid: int
    start_ticks: int

    def running(self) -> bool:
        """Still this process (same start time) and not a zombie."""
        fields = stat_fields(self.pid)
        return bool(fields) and int(fields[19]) == self.start_ticks and fields[0] != "Z"

    def kill_if_same(self) -> None:
        if start_ticks(self.pid) == self.start_ticks:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (None if gone or not Linux)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses.
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 of stat: starttime


def descendants(root: int) -> list[ProcId]:
    """All live descendants of `root`, from /proc (empty where /proc is unavailable)."""
    children: dict[int, list[int]] = {}
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return []
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry.name))  # field 4: ppid
    found: list[ProcId] = []
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        ticks = start_ticks(pid)
        if ticks is not None:
            found.append(ProcId(pid, ticks))
        stack.extend(children.get(pid, []))
    return found
