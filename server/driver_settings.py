"""What hacfed-server hands the round driver running inside the Flower ServerApp process.

The ServerApp is started by the SuperLink, not by hacfed-server, so the driver cannot receive
Python objects: hacfed-server writes its one `ServerConfig` as JSON into the state directory
(`hacfed.server.config.write_server_config`, file `SETTINGS_FILE`) and passes the file's path as
the run config's `driver-config`, and its own identity as `supervisor` ("PID:TICKS"), so an
orphaned ServerApp notices that hacfed-server is gone. Also the names of the files both sides
share in the state directory.
"""

from __future__ import annotations

import os
from pathlib import Path

DRIVER_SPEC = "hacfed.server.driver:make_driver"
SETTINGS_FILE = "driver-settings.json"
CONSOLE_FILE = "console.log"
DONE_FILE = "federation-done.json"
STATUS_FILE = "driver-status.json"

Supervisor = tuple[int, int]  # hacfed-server's (pid, start time in clock ticks)


class SupervisorGone(RuntimeError):
    """hacfed-server died (e.g. SIGKILL): this orphaned ServerApp must not drive rounds."""


def this_process() -> Supervisor:
    """The calling process as a `Supervisor` (the run config carries it as `format_supervisor`)."""
    pid = os.getpid()
    ticks = process_start_ticks(pid)
    assert ticks is not None, "a running process has a start time"
    return (pid, ticks)


def format_supervisor(supervisor: Supervisor) -> str:
    return f"{supervisor[0]}:{supervisor[1]}"


def parse_supervisor(value: object) -> Supervisor | None:
    """The run config's `supervisor`: "PID:TICKS", or "" when no hacfed-server supervises the run."""
    if value == "":
        return None
    pid, _, ticks = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not (pid.isdigit() and ticks.isdigit() and int(pid) > 0 and int(ticks) > 0):
        raise ValueError(f"run config 'supervisor' must be 'PID:TICKS' or empty, got {value!r}")
    return (int(pid), int(ticks))


def supervisor_alive(supervisor: Supervisor | None) -> bool:
    """False once the hacfed-server named by `supervisor` is gone (even after SIGKILL), so an
    orphaned ServerApp stops instead of driving rounds nobody watches."""
    if supervisor is None:
        return True
    pid, ticks = supervisor
    return process_start_ticks(pid) == ticks


def process_start_ticks(pid: int) -> int | None:
    """A process's start time (field 22 of /proc/PID/stat), None if it does not exist (or is a
    zombie): with the pid it names one process, never a recycled pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[19])
