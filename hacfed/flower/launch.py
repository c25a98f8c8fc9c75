"""Start the Flower deployment processes hacfed uses, and submit the hacfed app.

Every process runs under a `hacfed.procs.ProcessSupervisor` (own process group, own
FLWR_HOME, telemetry and update checks off, runtime dependency installation off) and is
waited for until it is really serving, with its log tail in the error if it dies first.

flwr 1.32 facts this module relies on (checked in the 1.32.1 source):
- `flwr run APP CONNECTION` reads the SuperLink connection `[superlink.CONNECTION]` from
  `$FLWR_HOME/config.toml` (address, insecure, root-certificates); the app's pyproject
  carries no address. A missing connection name falls back to `[superlink] default`,
  which flwr creates as ":local:" (a detached background SuperLink): always pass ours.
- `--run-config` and `--node-config` accept a TOML file path; run-config keys must already
  exist in the app's `[tool.flwr.app.config]`, or the run fails.
- `flwr run --stream` prints "Successfully started run <id>" and returns when the run ends;
  `flwr ls --run-id ID --format json` then gives "finished:completed|failed|stopped".
"""

from __future__ import annotations

import inspect
import json
import math
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hacfed.procs import (
    ManagedProcess,
    ProcessError,
    ProcessSupervisor,
    flower_env,
    wait_for_log_line,
    wait_for_port,
)
from hacfed.flower.relay import check_loopback_address

APP_DIR = Path(__file__).resolve().parent / "app"
DEFAULT_CONNECTION = "hacfed"
# SuperNode pull interval when idle (stock flwr: 3 s). Measured on 2 busy cores, 2 nodes:
# ~5.0 s per round with stock Flower, ~2.1-2.6 s with 0.5 s.
DEFAULT_IDLE_POLL_S = 0.5
ConfigValue = str | int | float | bool


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
        return f"{self.host}:{self.control_port}"


@dataclass(frozen=True)
class SuperNode:
    process: ManagedProcess
    node_id: int
    clientappio_address: str
    flwr_home: Path


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
    database: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 60.0,
) -> SuperLink:
    """Start `flower-superlink` (gRPC-rere Fleet API) and wait until its APIs listen.

    A port of 0 lets the OS choose (no race between picking and binding); the SuperLink
    logs the bound addresses, which are read back. Use fixed ports where SuperNodes must
    find a restarted SuperLink again. State goes to `database` (default
    `<state_dir>/superlink.db`) so runs survive a SuperLink restart. The ServerAppIo API
    always binds loopback: only the ServerApp subprocess uses it. `extra_env` reaches the
    ServerApp process (e.g. PYTHONPATH for a driver module that is not installed).
    """
    if insecure == (tls is not None):
        raise ValueError("pass insecure=True without TLS files, or insecure=False with TLS files")
    _check_bind_host(host, insecure)
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    database = Path(database) if database is not None else state_dir / "superlink.db"
    argv = [
        "flower-superlink",
        "--fleet-api-type", "grpc-rere",
        "--fleet-api-address", f"{host}:{fleet_port}",
        "--control-api-address", f"{host}:{control_port}",
        "--serverappio-api-address", f"127.0.0.1:{serverappio_port}",
        "--database", str(database),
        "--disable-runtime-dependency-installation",
    ]
    if tls is None:
        argv.append("--insecure")
    else:
        argv += ["--ssl-certfile", str(tls.certfile), "--ssl-keyfile", str(tls.keyfile),
                 "--ssl-ca-certfile", str(tls.ca_certfile)]
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
        probe_host = "127.0.0.1" if host == "0.0.0.0" else host
        for port in (bound["Fleet"], bound["Control"]):
            wait_for_port(probe_host, port, ready_timeout_s, process=proc)
    except (ProcessError, TimeoutError):
        sup.stop(proc)
        raise
    return SuperLink(proc, host, bound["Fleet"], bound["Control"], bound["ServerAppIo"], home)


def _bound_port(match: re.Match[str]) -> int:
    return int(match.group(1).rpartition(":")[2])


def start_supernode(
    sup: ProcessSupervisor,
    state_dir: Path,
    *,
    superlink_address: str,
    node_config: Mapping[str, ConfigValue],
    insecure: bool = True,
    root_cert: Path | None = None,
    clientappio_port: int = 0,
    idle_poll_s: float | None = DEFAULT_IDLE_POLL_S,
    ready_timeout_s: float = 60.0,
) -> SuperNode:
    """Start `flower-supernode` and wait until it has registered with the SuperLink.

    `node_config` reaches every ClientApp as `context.node_config` (hacfed's relay needs
    `participant-id` and `participant-address`). Port 0 lets the SuperNode pick its
    ClientAppIo port, which is read back from its log. `idle_poll_s` replaces flwr's fixed
    3 s sleep between empty pulls (see `run_fast_poll_supernode`); None runs stock Flower.
    """
    if insecure == (root_cert is not None):
        raise ValueError("pass insecure=True without root_cert, or insecure=False with root_cert")
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    config_path = state_dir / "node-config.toml"
    config_path.write_text(to_toml(node_config), encoding="utf-8")
    if idle_poll_s is None:
        program = ["flower-supernode"]
    elif idle_poll_s > 0:
        program = [sys.executable, "-m", "hacfed.flower.launch", "fast-poll-supernode", repr(idle_poll_s)]
    else:
        raise ValueError(f"idle_poll_s must be > 0 or None, got {idle_poll_s}")
    argv = [
        *program,
        "--grpc-rere",
        "--superlink", superlink_address,
        "--clientappio-api-address", f"127.0.0.1:{clientappio_port}",
        "--node-config", str(config_path),
    ]
    argv += ["--insecure"] if root_cert is None else ["--root-certificates", str(root_cert)]
    home = state_dir / "flwr-home"
    log_path = state_dir / "supernode.log"
    name = f"supernode-{node_config.get('participant-id', state_dir.name)}"
    proc = sup.start(argv, env=flower_env(home), log_path=log_path, name=name, cwd=state_dir)
    try:
        appio = wait_for_log_line(log_path, r"Starting ClientAppIo API on (\S+)", ready_timeout_s, process=proc)
        node = wait_for_log_line(log_path, r"SuperNode ID: (\d+)", ready_timeout_s, process=proc)
    except (ProcessError, TimeoutError):
        sup.stop(proc)
        raise
    return SuperNode(proc, int(node.group(1)), appio.group(1), home)


def to_toml(values: Mapping[str, ConfigValue]) -> str:
    """Flat key = value TOML for run and node configs (flwr reads these files directly)."""
    lines = []
    for key, value in values.items():
        if not re.fullmatch(r"[A-Za-z0-9_-]+", key):
            raise ValueError(f"config key {key!r} must match [A-Za-z0-9_-]+")
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int):
            text = str(value)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"config value of {key!r} must be finite, got {value}")
            text = repr(value)
        elif isinstance(value, str):
            text = json.dumps(value)  # a JSON string is a valid TOML basic string
        else:
            raise ValueError(f"config value of {key!r} must be str/int/float/bool, got {type(value).__name__}")
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


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


def run_fast_poll_supernode(idle_poll_s: float, argv: list[str]) -> None:
    """Run `flower-supernode argv...` with every sleep of its main loop capped at `idle_poll_s`.

    Why: flwr 1.32 sleeps a fixed 3 s after an empty pull, and since a SuperNode pulls right
    after pushing its reply, the next round's message almost always waits out that full
    sleep. There is no option for it, so this wraps the `time` module that
    `flwr.supernode.start_client_internal` sees. The check below makes a flwr upgrade that
    changes that loop fail loudly instead of silently running at the stock interval.
    """
    import flwr.supernode.start_client_internal as loop_module
    from flwr.supernode.cli import flower_supernode

    if "time.sleep(3)" not in inspect.getsource(loop_module.start_client_internal):
        raise RuntimeError("this flwr's SuperNode loop has no time.sleep(3): drop idle_poll_s")

    class _CappedSleepTime:
        def __getattr__(self, name: str) -> object:
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            time.sleep(min(seconds, idle_poll_s))

    loop_module.time = _CappedSleepTime()  # type: ignore[assignment]
    sys.argv = ["flower-supernode", *argv]
    flower_supernode()


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "fast-poll-supernode":
        sys.exit("usage: python -m hacfed.flower.launch fast-poll-supernode SECONDS [flower-supernode args]")
    run_fast_poll_supernode(float(sys.argv[2]), sys.argv[3:])
