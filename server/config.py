"""hacfed-server's typed configuration: the coordinator's settings plus where and how it listens.

    cfg = load_server_config("deploy/coordinator.toml", sets=["rounds=3", "server.listen=127.0.0.1:0"],
                             flags={"insecure": True})

`ServerConfig` is the one configuration of the coordinator's processes: hacfed-server and the
Flower ServerApp process it submits. Two sections: `coordinator` (what must agree across labs,
hacfed.server.coordinator.config) and `server` (this deployment's network, TLS, paths and
intervals, `ServerSettings`). hacfed-server loads it here once; the ServerApp process, which the
SuperLink starts and which cannot receive Python objects, reads the same values back from the JSON
that `write_server_config` leaves in the state dir, through the same `server_config_from_tables`.

TOML layout (deploy/coordinator.toml): the coordinator's keys at top level (or in a `[coordinator]`
table) with its `[task]`, `[sampling]` and `[hacpo]` tables (see hacfed.server.coordinator.config), and a
`[server]` table for this process's own settings (the fields of `ServerSettings`). Precedence:
file < `--set KEY=VALUE` (coordinator keys, dotted `task.digits`, or `server.listen`) < the
dedicated flags (`--state-dir`, `--listen`, ...). Relative paths are taken from the current
directory, except task data files, which resolve against the config file's folder. Every error names
the field and the bad value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from hacfed.certs import check_server_tls
from hacfed.config_values import parse_set, split_host_port
from hacfed.server.coordinator.config import CoordinatorConfig, apply_overrides
from hacfed.server.dashboard.bind import DashboardAddress, is_loopback_host, parse_dashboard_address
from hacfed.server.headroom import DEFAULT_MIN_FREE_MIB
from hacfed.tomlfile import read_toml

DEFAULT_LISTEN = "127.0.0.1:9092"
COORDINATOR_KEY_STEM = "coordinator"  # <state_dir>/coordinator.key signs everything sent to labs


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
    dashboard_public (hacfed.server.dashboard.bind says why).
    min_free_mib: the free space (MiB) the state dir's file system must keep: hacfed-server refuses to
    start below it and a running coordinator pauses (hacfed.server.headroom); 0 turns the check off."""

    listen: str = DEFAULT_LISTEN
    insecure: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    keys_dir: Path | None = None
    metrics_out: Path | None = None
    trust_on_first_use: bool = False
    poll_interval_s: float = 0.05
    retry_interval_s: float = 2.0
    max_run_restarts: int = 3
    dashboard: str | None = None
    dashboard_public: bool = False
    min_free_mib: int = DEFAULT_MIN_FREE_MIB

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
        value = self.min_free_mib
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"server.min_free_mib must be an integer >= 0 (MiB; 0: no check), got {value!r}")
        if self.dashboard is not None:
            parse_dashboard_address(self.dashboard, public=self.dashboard_public, field="server.dashboard")
        elif not isinstance(self.dashboard_public, bool):
            raise ValueError(f"server.dashboard_public must be true or false, got {self.dashboard_public!r}")


@dataclass(frozen=True)
class ServerConfig:
    """The coordinator processes' one configuration; both sections are validated when built."""

    coordinator: CoordinatorConfig
    server: ServerSettings
    config_dir: Path  # task data paths resolve against it

    def __post_init__(self) -> None:
        if not isinstance(self.coordinator, CoordinatorConfig):
            raise ValueError(f"ServerConfig.coordinator must be a CoordinatorConfig, got {self.coordinator!r}")
        if not isinstance(self.server, ServerSettings):
            raise ValueError(f"ServerConfig.server must be a ServerSettings, got {self.server!r}")
        k, rounds = self.coordinator.max_staleness, self.coordinator.rounds
        if k > max(rounds - 1, 0):  # K = rounds - 1 already lets every round be open at once (docs/staleness.md)
            raise ValueError(f"max_staleness = {k}: must be at most rounds - 1 = {max(rounds - 1, 0)}")
        if not isinstance(self.config_dir, (str, Path)) or not Path(self.config_dir).is_absolute():
            raise ValueError(f"ServerConfig.config_dir must be an absolute path, got {str(self.config_dir)!r}")
        object.__setattr__(self, "config_dir", Path(self.config_dir))

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
    def coordinator_key(self) -> Path:
        """The private key signing what is sent to labs (hacfed.keys.ensure_key_pair makes it)."""
        return self.state_dir / f"{COORDINATOR_KEY_STEM}.key"

    @property
    def supernode_auth(self) -> bool:
        """With TLS the SuperLink authenticates SuperNodes, and each lab must use the node bound to its key."""
        return not self.server.insecure

    @property
    def listen(self) -> tuple[str, int]:
        return split_host_port(self.server.listen, "server.listen")

    @property
    def dashboard_address(self) -> DashboardAddress | None:
        """`server.dashboard` parsed (it was checked at load), None when the dashboard is off."""
        if self.server.dashboard is None:
            return None
        return parse_dashboard_address(self.server.dashboard, public=self.server.dashboard_public,
                                       field="server.dashboard")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (paths absolute); `server_config_from_tables(**cfg.to_dict()) == cfg`."""
        server = {f.name: getattr(self.server, f.name) for f in fields(ServerSettings)}
        server = {k: str(v) if isinstance(v, Path) else v for k, v in server.items() if v is not None}
        return {"coordinator": self.coordinator.to_dict(), "server": server, "config_dir": str(self.config_dir)}


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
    coordinator_table = apply_overrides(coordinator_table, overrides)  # validated once, below
    _check_server_keys(server_table)
    given = {k: v for k, v in flags.items() if v is not None}
    if any(k in given for k in ("tls_cert", "tls_key", "tls_ca")) and "insecure" not in given:
        given["insecure"] = False  # TLS files on the command line replace the file's plaintext setting
    if given.get("insecure") is True and not any(k in given for k in ("tls_cert", "tls_key", "tls_ca")):
        for name in ("tls_cert", "tls_key", "tls_ca"):  # ... and --insecure replaces the file's TLS files
            server_table.pop(name, None)
    server_table.update(given)
    return server_config_from_tables(coordinator_table, server_table, path.resolve().parent)


def server_config_from_tables(
    coordinator: Mapping[str, Any], server: Mapping[str, Any], config_dir: str | Path
) -> ServerConfig:
    """The one place a `ServerConfig` is built from plain values: the TOML's tables (after `--set`
    and the flags) in hacfed-server, the JSON of `write_server_config` in the ServerApp process."""
    if not isinstance(server, Mapping):
        raise ValueError(f"[server] must be a table, got {server!r}")
    _check_server_keys(server)
    return ServerConfig(CoordinatorConfig.from_mapping(coordinator), ServerSettings(**server), Path(config_dir))


def write_server_config(cfg: ServerConfig, path: Path) -> Path:
    """Serialize `cfg` for the ServerApp process (every path in it is absolute)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read_server_config(path: str | Path) -> ServerConfig:
    """What `write_server_config` wrote, validated by the same rules as at hacfed-server's start."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"server config {path} unreadable: {exc}") from None
    if not isinstance(data, dict) or set(data) != {"coordinator", "server", "config_dir"}:
        raise ValueError(f"server config {path} must hold coordinator, server and config_dir, got {data!r}")
    return server_config_from_tables(data["coordinator"], data["server"], data["config_dir"])


def _check_server_keys(table: Mapping[str, Any]) -> None:
    known = {f.name for f in fields(ServerSettings)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ValueError(f"[server]: unknown key(s) {unknown}; known: {sorted(known)}")
