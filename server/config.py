"""hacfed-server's typed configuration: the coordinator's settings plus where and how it listens.

    cfg = load_server_config("deploy/coordinator.toml", sets=["rounds=3", "server.listen=127.0.0.1:0"],
                             flags={"insecure": True})

TOML layout (deploy/coordinator.toml): the coordinator's keys at top level (or in a `[coordinator]`
table) with its `[task]`, `[sampling]` and `[hacpo]` tables (see hacfed.server.coordinator.config), and a
`[server]` table for this process's own settings (the fields of `ServerSettings`). Precedence:
file < `--set KEY=VALUE` (coordinator keys, dotted `task.digits`, or `server.listen`) < the
dedicated flags (`--state-dir`, `--listen`, ...). Relative paths are taken from the current
directory, except task data files, which resolve against the config file's folder. Every error names
the field and the bad value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from hacfed.certs import check_server_tls
from hacfed.config_values import parse_set, split_host_port
from hacfed.server.dashboard.bind import is_loopback_host, parse_dashboard_address
from hacfed.server.coordinator.config import CoordinatorConfig
from hacfed.tomlfile import read_toml

DEFAULT_LISTEN = "127.0.0.1:9092"


@dataclass(frozen=True)
class ServerSettings:
    """listen: the Fleet API address participants connect to (port 0: the OS picks one).
    insecure: plaintext, loopback only; otherwise tls_cert/tls_key/tls_ca (PEM files) are required.
    keys_dir: registered participant keys (`<participant-id>.pub`); default `<state_dir>/keys`.
    metrics_out: JSONL metrics; default `<state_dir>/metrics.jsonl`.
    trust_on_first_use: register unknown participants' keys (development only, needs insecure).
    poll_interval_s: how often the ServerApp pulls replies; retry_interval_s: how long a failed
    participant waits before the same round is sent again; max_run_restarts: how many times in a row
    a dying ServerApp run is resubmitted without the journal moving on.
    dashboard: HOST:PORT of the read-only live dashboard (None: off); loopback unless
    dashboard_public (hacfed.server.dashboard.bind says why)."""

    listen: str = DEFAULT_LISTEN
    insecure: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    keys_dir: Path | None = None
    metrics_out: Path | None = None
    trust_on_first_use: bool = False
    poll_interval_s: float = 0.2
    retry_interval_s: float = 2.0
    max_run_restarts: int = 3
    dashboard: str | None = None
    dashboard_public: bool = False

    def __post_init__(self) -> None:
        host, _ = split_host_port(self.listen, "server.listen")
        for name in ("insecure", "trust_on_first_use"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"server.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("tls_cert", "tls_key", "tls_ca", "keys_dir", "metrics_out"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, (str, Path)) or not str(value):
                    raise ValueError(f"server.{name} must be a path, got {value!r}")
                object.__setattr__(self, name, Path(value).expanduser().resolve())
        tls = [self.tls_cert, self.tls_key, self.tls_ca]
        if self.trust_on_first_use and not self.insecure:
            raise ValueError("server.trust_on_first_use is a development shortcut allowed only with --insecure")
        if self.insecure:
            if any(tls):
                raise ValueError("server.insecure: --insecure and the TLS files exclude each other; pass one of them")
            if not is_loopback_host(host):
                raise ValueError(f"server.listen: --insecure binds loopback only (127.0.0.1, ::1, localhost), got "
                                 f"{self.listen!r}; use --tls-cert/--tls-key/--tls-ca to listen on other addresses")
        elif not all(tls):
            raise ValueError("server.insecure: pass --insecure (loopback only) or all of --tls-cert, --tls-key "
                             "and --tls-ca")
        else:
            for name in ("tls_cert", "tls_key", "tls_ca"):
                if not getattr(self, name).is_file():
                    raise ValueError(f"server.{name}: {getattr(self, name)} is not a file")
            check_server_tls(self.tls_cert, self.tls_key, self.tls_ca)  # expired, another CA, wrong key, no 127.0.0.1
        for name in ("poll_interval_s", "retry_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"server.{name} must be a number > 0, got {value!r}")
        value = self.max_run_restarts
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"server.max_run_restarts must be an integer >= 0, got {value!r}")
        if self.dashboard is not None:
            parse_dashboard_address(self.dashboard, public=self.dashboard_public, field="server.dashboard")
        elif not isinstance(self.dashboard_public, bool):
            raise ValueError(f"server.dashboard_public must be true or false, got {self.dashboard_public!r}")


@dataclass(frozen=True)
class ServerConfig:
    coordinator: CoordinatorConfig
    server: ServerSettings
    config_dir: Path  # task data paths resolve against it

    @property
    def state_dir(self) -> Path:
        return Path(self.coordinator.state_dir)

    @property
    def keys_dir(self) -> Path:
        return self.server.keys_dir or self.state_dir / "keys"

    @property
    def metrics_out(self) -> Path:
        return self.server.metrics_out or self.state_dir / "metrics.jsonl"

    @property
    def listen(self) -> tuple[str, int]:
        return split_host_port(self.server.listen, "server.listen")


def load_server_config(
    path: str | Path, sets: Sequence[str] = (), flags: Mapping[str, Any] | None = None
) -> ServerConfig:
    """Read the TOML file, apply `--set` items, then the dedicated flags (`ServerSettings` field
    names, plus `state_dir`)."""
    path = Path(path)
    data = read_toml(path)
    server_table = data.pop("server", {})
    if not isinstance(server_table, dict):
        raise ValueError(f"[server] in {path} must be a table, got {server_table!r}")
    coordinator_table = dict(data.get("coordinator", data))
    overrides: dict[str, Any] = {}
    for item in sets:
        key, value = parse_set(item)
        if key.startswith("server."):
            server_table[key.removeprefix("server.")] = value
        else:
            overrides[key] = value
    flags = dict(flags or {})
    set_state_dir = overrides.pop("state_dir", None)  # --state-dir wins over --set state_dir=...
    state_dir = flags.pop("state_dir", None) or set_state_dir or coordinator_table.get("state_dir")
    if not state_dir:
        raise ValueError("state_dir: set it in the config file or pass --state-dir")
    coordinator_table["state_dir"] = str(Path(str(state_dir)).expanduser().resolve())
    coordinator = CoordinatorConfig.from_mapping(coordinator_table)
    if overrides:
        coordinator = coordinator.with_overrides(overrides)
    known = {f.name for f in fields(ServerSettings)}
    unknown = sorted(set(server_table) - known)
    if unknown:
        raise ValueError(f"[server]: unknown key(s) {unknown}; known: {sorted(known)}")
    given = {k: v for k, v in flags.items() if v is not None}
    if any(k in given for k in ("tls_cert", "tls_key", "tls_ca")) and "insecure" not in given:
        given["insecure"] = False  # TLS files on the command line replace the file's plaintext setting
    if given.get("insecure") is True and not any(k in given for k in ("tls_cert", "tls_key", "tls_ca")):
        for name in ("tls_cert", "tls_key", "tls_ca"):  # ... and --insecure replaces the file's TLS files
            server_table.pop(name, None)
    server_table.update(given)
    return ServerConfig(coordinator, ServerSettings(**server_table), path.resolve().parent)
