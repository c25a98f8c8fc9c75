"""Start the coordinator's Flower SuperLink and submit the hacfed app run (hacfed-server's process).

Runs in hacfed-server: the SuperLink and the `flwr run` submission are its supervised children.
Every process runs under a `hacfed.procs.ProcessSupervisor` (own process group, own FLWR_HOME,
telemetry and update checks off, runtime dependency installation off) and is waited for until it
is really serving, with its log tail in the error if it dies first. The labs' side, the SuperNode,
is started by `hacfed.clients.supernode`.

Exposure (security.md S1): only the Fleet API faces the labs, on the `--listen` host. The Control
API runs any app submitted to it and has no authentication in Flower 1.32, and the ServerAppIo API
serves the ServerApp: both always bind 127.0.0.1, whatever the Fleet host is. No other server is
started (Flower's health server only starts with --health-server-address, which is never passed;
the SuperExec and the ServerApp processes only dial the ServerAppIo API).
`tests/integration/test_coordinator_exposure.py` checks every listening socket of the tree.

The exact commands this module runs (each with its own FLWR_HOME, FLWR_TELEMETRY_ENABLED=0,
FLWR_DISABLE_UPDATE_CHECK=1, FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1, this venv's bin first
on PATH, in its own process group; ports are examples: port 0 lets the OS choose, and the bound
ports are read back from the logs, "Starting {Control,ServerAppIo,Fleet} API ... on HOST:PORT"):

    # flower-superlink, run through this module to cap its Fleet API's messages (run_capped_superlink):
    python -m hacfed.server.superlink capped-superlink 16842752 \\
        --fleet-api-type grpc-rere --fleet-api-address 0.0.0.0:9092 \\
        --control-api-address 127.0.0.1:9093 --serverappio-api-address 127.0.0.1:9091 \\
        --database STATE/superlink.db --disable-runtime-dependency-installation --insecure
    # with TLS instead of --insecure (and then always SuperNode authentication):
    #   --ssl-certfile server.pem --ssl-keyfile server.key --ssl-ca-certfile ca.pem --enable-supernode-auth

    flwr run <server/flower_app> hacfed --run-config CLI/run-config.toml --stream
    # CLI/flwr-home/config.toml:
    #   [superlink]
    #   default = "hacfed"
    #   [superlink.hacfed]
    #   address = "127.0.0.1:9093"
    #   insecure = true          # or: insecure = false, root-certificates = "/abs/ca.pem"
    # run-config.toml sets driver = "pkg.mod:factory" and any key of [tool.flwr.app.config]

    flwr ls hacfed --run-id RUN_ID --format json     # -> "finished:completed" | "finished:failed"
    flwr log RUN_ID hacfed --show                    # the ServerApp's output (or --stream)

flwr 1.32 facts this module relies on (checked in the 1.32.1 source):
- `flwr run APP CONNECTION` reads the SuperLink connection `[superlink.CONNECTION]` from
  `$FLWR_HOME/config.toml` (address, insecure, root-certificates); the app's pyproject
  carries no address. A missing connection name falls back to `[superlink] default`,
  which flwr creates as ":local:" (a detached background SuperLink): always pass ours.
- `--run-config` and `--node-config` accept a TOML file path; run-config keys must already
  exist in the app's `[tool.flwr.app.config]`, or the run fails.
- `flwr run --stream` prints "Successfully started run <id>", then the ServerApp's stdout and
  stderr, and returns when the run ends; `flwr ls --run-id ID --format json` then gives
  "finished:completed|failed|stopped".
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hacfed.flower_protocol import (
    FLOWER_MAX_MESSAGE_BYTES,
    ConfigValue,
    cap_flower_messages,
    check_loopback_address,
    to_toml,
)
from hacfed.procs import ManagedProcess, ProcessError, ProcessSupervisor, flower_env, wait_for_log_line, wait_for_port

APP_DIR = Path(__file__).resolve().parent / "flower_app"
DEFAULT_CONNECTION = "hacfed"
LOCAL_HOST = "127.0.0.1"  # where every SuperLink API but the Fleet API binds


@dataclass(frozen=True)
class TlsFiles:
    """Server certificate, its key and the CA that signed it (PEM files)."""

    certfile: Path
    keyfile: Path
    ca_certfile: Path

    def __post_init__(self) -> None:
        for name in ("certfile", "keyfile", "ca_certfile"):
            if not Path(getattr(self, name)).is_file():
                raise ValueError(f"TLS {name} {getattr(self, name)} is not a file")


@dataclass(frozen=True)
class SuperLink:
    process: ManagedProcess
    host: str
    fleet_port: int
    control_port: int
    serverappio_port: int
    flwr_home: Path

    @property
    def fleet_address(self) -> str:
        return f"{self.host}:{self.fleet_port}"

    @property
    def control_address(self) -> str:
        """Where hacfed-server reaches the Control API: always loopback."""
        return f"{LOCAL_HOST}:{self.control_port}"


def _check_bind_host(host: str, insecure: bool) -> None:
    if insecure:
        try:
            check_loopback_address(f"{host}:0")
        except ValueError:
            raise ValueError(f"--insecure binds loopback only; got host {host!r} (use TLS)") from None


def start_superlink(
    sup: ProcessSupervisor,
    state_dir: Path,
    *,
    fleet_port: int = 0,
    control_port: int = 0,
    serverappio_port: int = 0,
    host: str = "127.0.0.1",
    insecure: bool = True,
    tls: TlsFiles | None = None,
    supernode_auth: bool = False,
    database: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 60.0,
) -> SuperLink:
    """Start `flower-superlink` (gRPC-rere Fleet API) and wait until its APIs listen.

    A port of 0 lets the OS choose (no race between picking and binding); the SuperLink
    logs the bound addresses, which are read back. Use fixed ports where SuperNodes must
    find a restarted SuperLink again. State goes to `database` (default
    `<state_dir>/superlink.db`) so runs survive a SuperLink restart. `host` is the Fleet API's
    only: the Control and ServerAppIo APIs always bind 127.0.0.1. `extra_env` reaches the
    ServerApp process (e.g. PYTHONPATH for a driver module that is not installed).
    """
    if insecure == (tls is not None):
        raise ValueError("pass insecure=True without TLS files, or insecure=False with TLS files")
    _check_bind_host(host, insecure)
    if supernode_auth and tls is None:
        raise ValueError("SuperNode authentication needs TLS (Flower refuses it over plaintext)")
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    database = Path(database) if database is not None else state_dir / "superlink.db"
    argv = superlink_argv(host=host, fleet_port=fleet_port, control_port=control_port,
                          serverappio_port=serverappio_port, tls=tls, database=database,
                          supernode_auth=supernode_auth)
    home = state_dir / "flwr-home"
    log_path = state_dir / "superlink.log"
    proc = sup.start(argv, env=flower_env(home, extra=extra_env), log_path=log_path, name="superlink",
                     cwd=state_dir)
    try:
        bound = {
            api: _bound_port(wait_for_log_line(log_path, rf"Starting {api} API\b.* on (\S+)$",
                                               ready_timeout_s, process=proc))
            for api in ("Control", "ServerAppIo", "Fleet")
        }
        wait_for_port(LOCAL_HOST if host in ("0.0.0.0", "::") else host, bound["Fleet"], ready_timeout_s, process=proc)
        wait_for_port(LOCAL_HOST, bound["Control"], ready_timeout_s, process=proc)
    except (ProcessError, TimeoutError):
        sup.stop(proc)
        raise
    return SuperLink(proc, host, bound["Fleet"], bound["Control"], bound["ServerAppIo"], home)


def superlink_argv(
    *, host: str, fleet_port: int, control_port: int, serverappio_port: int, tls: TlsFiles | None, database: Path,
    supernode_auth: bool = False,
) -> list[str]:
    """The `flower-superlink` command: the Fleet API on `host`, everything else on 127.0.0.1."""
    argv = [
        sys.executable, "-m", "hacfed.server.superlink", "capped-superlink", str(FLOWER_MAX_MESSAGE_BYTES),
        "--fleet-api-type", "grpc-rere",
        "--fleet-api-address", f"{host}:{fleet_port}",
        "--control-api-address", f"{LOCAL_HOST}:{control_port}",
        "--serverappio-api-address", f"{LOCAL_HOST}:{serverappio_port}",
        "--database", str(database),
        "--disable-runtime-dependency-installation",
    ]
    if tls is None:
        argv.append("--insecure")
    else:
        argv += ["--ssl-certfile", str(tls.certfile), "--ssl-keyfile", str(tls.keyfile),
                 "--ssl-ca-certfile", str(tls.ca_certfile)]
    if supernode_auth:
        argv.append("--enable-supernode-auth")  # only SuperNodes whose key was registered get in
    return argv


def run_capped_superlink(max_message_bytes: int, argv: list[str]) -> None:
    """Run `flower-superlink argv...` with its Fleet API capped at `max_message_bytes` per message
    (hacfed's cap; Flower's default is 2 GiB and 1.32 has no option: `cap_flower_messages`). The
    Control and ServerAppIo APIs, on loopback only, keep Flower's default. Its servers accept the
    labs' keepalive pings (`hacfed.flower_keepalive`)."""
    import flwr.server.app as app_module

    from hacfed.flower_keepalive import install as install_keepalive

    cap_flower_messages(app_module, [app_module._run_fleet_api_grpc_rere], max_message_bytes)
    install_keepalive()  # labs' keepalive pings are accepted (security.md R6)
    sys.argv = ["flower-superlink", *argv]
    app_module.run_superlink()


def _bound_port(match: re.Match[str]) -> int:
    return int(match.group(1).rpartition(":")[2])


def app_config_defaults(app_dir: Path = APP_DIR) -> dict[str, ConfigValue]:
    """The run-config keys (and defaults) the app declares in `[tool.flwr.app.config]`."""
    with open(Path(app_dir) / "pyproject.toml", "rb") as file:
        return dict(tomllib.load(file)["tool"]["flwr"]["app"].get("config", {}))


def write_connection_config(
    flwr_home: Path, *, name: str, control_address: str, insecure: bool = True, root_cert: Path | None = None
) -> Path:
    """Write `$FLWR_HOME/config.toml` naming one SuperLink connection, and make it the default."""
    if insecure == (root_cert is not None):
        raise ValueError("pass insecure=True without root_cert, or insecure=False with root_cert")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise ValueError(f"connection name {name!r} must match [A-Za-z0-9_-]+")
    entry: dict[str, ConfigValue] = {"address": control_address, "insecure": insecure}
    if root_cert is not None:
        entry["root-certificates"] = str(Path(root_cert).resolve())
    text = f"[superlink]\ndefault = {json.dumps(name)}\n\n[superlink.{name}]\n" + to_toml(entry)
    path = Path(flwr_home) / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@dataclass(frozen=True)
class SubmittedRun:
    """A `flwr run` process and the FLWR_HOME holding its connection."""

    process: ManagedProcess
    flwr_home: Path
    connection: str

    def run_id(self, timeout_s: float = 60.0) -> int:
        """The run id, from "Successfully started run <id>" in the `flwr run` output."""
        match = wait_for_log_line(self.process.log_path, r"Successfully started run (\d+)", timeout_s,
                                  process=self.process)
        return int(match.group(1))


def submit_run(
    sup: ProcessSupervisor,
    state_dir: Path,
    *,
    control_address: str,
    run_config: Mapping[str, ConfigValue],
    app_dir: Path = APP_DIR,
    connection: str = DEFAULT_CONNECTION,
    stream: bool = True,
    insecure: bool = True,
    root_cert: Path | None = None,
) -> SubmittedRun:
    """Submit the hacfed app with `flwr run` against the SuperLink's Control API.

    With `stream=True` the process prints the ServerApp's output and exits when the run
    ends (use `wait_for_run`); without it, it exits right after submitting.
    """
    unknown = sorted(set(run_config) - set(app_config_defaults(app_dir)))
    if unknown:
        raise ValueError(f"run config keys {unknown} are not declared in {app_dir}/pyproject.toml")
    state_dir = Path(state_dir)
    home = state_dir / "flwr-home"
    write_connection_config(home, name=connection, control_address=control_address,
                            insecure=insecure, root_cert=root_cert)
    config_path = state_dir / "run-config.toml"
    config_path.write_text(to_toml(run_config), encoding="utf-8")
    argv = ["flwr", "run", str(Path(app_dir).resolve()), connection, "--run-config", str(config_path)]
    if stream:
        argv.append("--stream")
    proc = sup.start(argv, env=flower_env(home), log_path=state_dir / "flwr-run.log", name="flwr-run",
                     cwd=state_dir)
    return SubmittedRun(proc, home, connection)


def run_status(flwr_home: Path, connection: str, run_id: int, *, timeout_s: float = 60.0) -> str:
    """The run's status text from `flwr ls`, e.g. "running" or "finished:completed"."""
    result = subprocess.run(
        ["flwr", "ls", connection, "--run-id", str(run_id), "--format", "json"],
        env=flower_env(flwr_home), capture_output=True, text=True, timeout=timeout_s,
        start_new_session=True, check=False,
    )
    try:
        runs = json.loads(result.stdout)["runs"]
    except (json.JSONDecodeError, KeyError) as exc:
        raise ProcessError(f"flwr ls gave no run list (exit {result.returncode}): "
                           f"{result.stdout[-2000:]}{result.stderr[-2000:]}") from exc
    for run in runs:
        if int(run["run-id"]) == run_id:
            return str(run["status"])
    raise ProcessError(f"run {run_id} not listed by the SuperLink")


def wait_for_run(run: SubmittedRun, timeout_s: float, *, poll_s: float = 5.0) -> tuple[int, str]:
    """Wait until the run has finished; return (run id, final status, e.g. "finished:completed").

    A streaming `flwr run` ends with the run, so waiting for it costs nothing; otherwise the
    status is polled with `flwr ls` every `poll_s` (each call is a CLI start: ~1 s of CPU).
    """
    deadline = time.monotonic() + timeout_s
    run_id = run.run_id(timeout_s)
    if "--stream" in run.process.argv:
        code = run.process.wait(max(deadline - time.monotonic(), 0.0))
        if code != 0:
            raise ProcessError(f"flwr run exited with code {code}:\n{run.process.log_tail()}")
    while not (status := run_status(run.flwr_home, run.connection, run_id)).startswith("finished"):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"run {run_id} still {status!r} after {timeout_s:.0f}s")
        time.sleep(poll_s)
    return run_id, status


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "capped-superlink":
        sys.exit("usage: python -m hacfed.server.superlink capped-superlink MAX_BYTES [flower-superlink args]")
    run_capped_superlink(int(sys.argv[2]), sys.argv[3:])
