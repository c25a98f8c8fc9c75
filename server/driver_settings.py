"""What hacfed-server hands the round driver running inside the Flower ServerApp process.

The ServerApp is started by the SuperLink, not by hacfed-server, so the driver cannot receive
Python objects: hacfed-server writes `DriverSettings` as JSON into its state directory and passes
the file's path as the run config's `driver-config`. Every path in it is absolute.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from hacfed.server.coordinator.config import CoordinatorConfig

DRIVER_SPEC = "hacfed.server.driver:make_driver"
SETTINGS_FILE = "driver-settings.json"
CONSOLE_FILE = "console.log"
DONE_FILE = "federation-done.json"
STATUS_FILE = "driver-status.json"


@dataclass(frozen=True)
class DriverSettings:
    """coordinator: `CoordinatorConfig.to_dict()`; task_base_dir: where relative task data paths
    resolve; keys_dir: `<participant-id>.pub` files; coordinator_key: the private key signing
    updates; metrics_out: the JSONL metrics file; retry_interval_s: how long a participant whose
    exchange failed waits before the same round is sent to it again; trust_on_first_use: register
    unknown participants' self-signed keys (development only); supernode_auth: the SuperLink
    authenticates SuperNodes and `<state>/supernode-nodes.json` binds each lab to its node id."""

    coordinator: Mapping[str, Any]
    task_base_dir: str | None
    keys_dir: str
    coordinator_key: str
    metrics_out: str
    retry_interval_s: float = 2.0
    trust_on_first_use: bool = False
    supervisor: tuple[int, int] | None = None  # hacfed-server's (pid, start time in clock ticks)
    supernode_auth: bool = False  # Flower authenticates SuperNodes: a lab's node must be the one bound to its key

    def __post_init__(self) -> None:
        CoordinatorConfig.from_mapping(self.coordinator)  # raises with the field's name
        for name in ("keys_dir", "coordinator_key", "metrics_out"):
            value = getattr(self, name)
            if not isinstance(value, str) or not Path(value).is_absolute():
                raise ValueError(f"DriverSettings.{name} must be an absolute path, got {value!r}")
        value = self.retry_interval_s
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"DriverSettings.retry_interval_s must be a number > 0, got {value!r}")
        if self.supervisor is not None:
            if not (isinstance(self.supervisor, (tuple, list)) and len(self.supervisor) == 2
                    and all(isinstance(v, int) and v > 0 for v in self.supervisor)):
                raise ValueError(f"DriverSettings.supervisor must be (pid, start ticks), got {self.supervisor!r}")
            object.__setattr__(self, "supervisor", tuple(self.supervisor))
        for name in ("trust_on_first_use", "supernode_auth"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"DriverSettings.{name} must be a bool, got {getattr(self, name)!r}")

    def supervisor_alive(self) -> bool:
        """False once the hacfed-server that wrote these settings is gone (even after SIGKILL), so
        an orphaned ServerApp stops instead of driving rounds nobody watches."""
        if self.supervisor is None:
            return True
        pid, ticks = self.supervisor
        return process_start_ticks(pid) == ticks

    @property
    def coordinator_config(self) -> CoordinatorConfig:
        return CoordinatorConfig.from_mapping(self.coordinator)

    @property
    def state_dir(self) -> Path:
        return Path(self.coordinator_config.state_dir)

    def write(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: str | Path) -> "DriverSettings":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"driver settings {path} unreadable: {exc}") from None
        return cls(**data)


def process_start_ticks(pid: int) -> int | None:
    """A process's start time (field 22 of /proc/PID/stat), None if it does not exist (or is a
    zombie): with the pid it names one process, never a recycled pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[19])
