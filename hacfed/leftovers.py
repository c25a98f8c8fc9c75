"""Children of a hacfed-server or hacfed-client killed with SIGKILL, found and stopped by the next one.

Run by both sides: hacfed-server and hacfed-client each record and clean up their own children.

A supervisor cleans up after SIGTERM, Ctrl-C and exceptions, but nothing runs after SIGKILL, and
Flower's daemons run in their own process groups. Each child's guard (`hacfed.child_guard`) ends it
once its parent is gone, but that takes up to its grace period, and a guard can itself be killed:
a SuperLink left over would keep the Fleet port, and a lab's SuperNode would keep answering hellos
for a participant that is gone (the coordinator would then see two nodes with one participant
id). So each CLI records its
children's pids with their start times in `<state-dir>/children.json`, and a restarted one kills
those (by pid and process group, after checking the start time so a recycled pid is never hit)
before it starts anything.

The file is replaced whole (`hacfed.envelope.write_atomic`), so a kill -9 mid-write leaves the previous
list; one that still cannot be read (torn by an older version, or not hacfed's) names no child: a
restarted CLI says so and starts, and each child's guard ends what it cannot find.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from hacfed.envelope import write_atomic

CHILDREN_FILE = "children.json"


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rfind(")") + 2:].split()  # fields after the command name: state, ppid, pgrp, ...


def start_ticks(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _alive(pid: int, ticks: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and int(fields[19]) == ticks and fields[0] != "Z"


def _descendants(root: int) -> list[tuple[int, int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if (ticks := start_ticks(pid)) is not None:
            found.append((pid, ticks))
        stack.extend(children.get(pid, []))
    return found


def record_children(state_dir: Path, pids: list[tuple[str, int]]) -> None:
    """Remember (name, pid) of the running children, with their start times."""
    entries = [{"name": name, "pid": pid, "start_ticks": start_ticks(pid)} for name, pid in pids]
    write_atomic(Path(state_dir) / CHILDREN_FILE, (json.dumps(entries) + "\n").encode("utf-8"), 0o644)


def forget_children(state_dir: Path) -> None:
    (Path(state_dir) / CHILDREN_FILE).unlink(missing_ok=True)


def kill_leftovers(state_dir: Path, grace_s: float = 5.0, timeout_s: float = 10.0) -> list[str]:
    """Stop the recorded children still running (their process groups and descendants): SIGTERM
    first, so a SuperNode unregisters and the coordinator stops waiting for it at once instead of
    after Flower's heartbeat timeout, then SIGKILL after `grace_s`. Returns "name (pid N)" each."""
    path = Path(state_dir) / CHILDREN_FILE
    if not path.exists():
        return []
    killed, victims, groups = [], [], []
    for entry in recorded_children(path):
        pid, ticks = entry["pid"], entry["start_ticks"]
        if ticks is None or not _alive(pid, ticks):
            continue
        victims += [(pid, int(ticks)), *_descendants(pid)]
        groups.append(pid)  # each child leads its own process group
        killed.append(f"{entry['name']} (pid {pid})")
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, timeout_s)):
        for pgid in groups:
            _signal_group(pgid, sig)
        for pid, ticks in victims:
            if _alive(pid, ticks):
                _signal(pid, sig)
        deadline = time.monotonic() + wait_s
        while any(_alive(pid, ticks) for pid, ticks in victims) and time.monotonic() < deadline:
            time.sleep(0.05)
    if any(_alive(pid, ticks) for pid, ticks in victims):
        raise RuntimeError(f"leftover processes of a previous run survived SIGKILL: {killed}")
    path.unlink()
    return killed


def recorded_children(path: Path) -> list[dict]:
    """The entries of a children file ({"name", "pid", "start_ticks"}, checked); [] for a file that
    cannot be read as one, with a line on stderr naming it."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(entries, list):
            raise TypeError(f"a list was expected, not {type(entries).__name__}")
        return [{"name": str(e["name"]), "pid": _positive(e["pid"]),
                 "start_ticks": None if e.get("start_ticks") is None else _positive(e["start_ticks"])}
                for e in entries]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        print(f"warning: {path} is unreadable ({type(exc).__name__}); no leftover children are known from it",
              file=sys.stderr)
        return []


def _positive(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"not a positive integer: {value!r}")
    return value


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
