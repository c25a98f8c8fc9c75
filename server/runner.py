"""What hacfed-server does once its configuration is valid: supervise the SuperLink and the app run.

    SuperLink (gRPC-rere Fleet API on --listen, state in <state>/superlink.db)
    flwr run  -> ServerApp -> hacfed.server.driver (journal <state>/journal.sqlite)

The driver runs in a process the SuperLink starts, so this process follows it through files in the
state dir: `console.log` (printed here as it grows), `federation-done.json` (the run is over). A run
that ends without it (the ServerApp died) is resubmitted and resumes from the journal; a SuperLink
that dies is restarted on the same Fleet port. Never imports torch.
"""

from __future__ import annotations

import fcntl
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from hacfed.config_values import check_port_free
from hacfed.envelope import write_atomic
from hacfed.keys import describe_key, ensure_key_pair
from hacfed.leftovers import CHILDREN_FILE, forget_children, kill_leftovers, record_children
from hacfed.procs import ManagedProcess, ProcessError, ProcessSupervisor
from hacfed.server.config import ServerConfig, write_server_config
from hacfed.server.coordinator import Journal, JournalError, load_task_from_config
from hacfed.server.coordinator.errors import AuditError
from hacfed.server.coordinator.settings_fit import check_settings_fit
from hacfed.server.disk_space import SpacePause, hold_open_deadlines
from hacfed.server.driver_settings import (
    CONSOLE_FILE,
    DONE_FILE,
    DRIVER_SPEC,
    SETTINGS_FILE,
    STATUS_FILE,
    format_supervisor,
    this_process,
)
from hacfed.server.headroom import check_headroom
from hacfed.server.node_auth import BINDINGS_FILE, FlwrCli, NodeAuthSync
from hacfed.server.node_auth import CONNECTION as ADMIN_CONNECTION
from hacfed.server.registry import load_registry
from hacfed.server.superlink import SuperLink, TlsFiles, start_superlink, submit_run, write_connection_config

Print = Callable[[str], None]
PORT_FILE = "fleet-port"


def say(text: str) -> None:
    print(f"hacfed-server: {text}", flush=True)


class ConsoleTail:
    """Prints the lines the driver appends to console.log, from where the file ended at start."""

    def __init__(self, path: Path, out: Print) -> None:
        self.path, self.out = path, out
        self.offset = path.stat().st_size if path.exists() else 0

    def pump(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            self.out(f"[{datetime.now():%H:%M:%S}] {line}")


def check_before_writing(cfg: ServerConfig) -> None:
    """What a user can get wrong that the config types cannot see, checked before any file is
    created: the task loads (its data files exist and parse), the settings fit it and the message caps
    (`settings_fit`), the state and keys paths are folders,
    the state dir's file system has its free-space headroom (`server.min_free_mib`)."""
    check_settings_fit(cfg.coordinator, load_task_from_config(cfg.coordinator, str(cfg.config_dir)))
    for what, path in (("state dir", cfg.state_dir), ("keys dir", cfg.keys_dir)):
        if path.exists() and not path.is_dir():
            raise ValueError(f"the {what} {path} is a file, not a directory")
    check_headroom(cfg.state_dir, cfg.server.min_free_mib)
    if cfg.metrics_out.is_dir():
        raise ValueError(f"metrics_out {cfg.metrics_out} is a directory; give a file path")
    if not (cfg.state_dir / CHILDREN_FILE).exists():  # else a SuperLink left running may hold the port
        check_ports(cfg)


LEFTOVER_PORT_SETTLE_S = 15.0


def check_ports(cfg: ServerConfig, settle_s: float = 0.0) -> None:
    """The Fleet API's and the dashboard's ports are free (one line naming the flag if not). With
    `settle_s`, a busy port is asked again until then: the sockets of a leftover SuperLink that was
    just killed (kill -9 of a previous hacfed-server) are released by the kernel a moment later."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            check_port_free(*cfg.listen, "--listen")
            if cfg.dashboard_address is not None:
                check_port_free(cfg.dashboard_address.host, cfg.dashboard_address.port, "--dashboard")
            return
        except ValueError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def prepare(cfg: ServerConfig) -> Path:
    """Everything that can fail on a user mistake once the state dir exists, before any process
    starts: the journal belongs to this run, the keys exist. Returns the config file the ServerApp reads."""
    state = cfg.state_dir
    state.mkdir(parents=True, exist_ok=True)
    with Journal(cfg.coordinator.journal_path) as journal:
        journal.bind_run(cfg.coordinator.run_id, cfg.coordinator.plan_fingerprint())
    keys = ensure_key_pair(state, cfg.coordinator_key.stem)
    if keys.created:
        say(f"created the coordinator key {keys.private}")
    say(f"coordinator public key: {describe_key(keys.public)}; every lab passes it to hacfed-client --coordinator-key")
    cfg.keys_dir.mkdir(parents=True, exist_ok=True)
    registry = load_registry(cfg.keys_dir)
    say(f"registered labs in {cfg.keys_dir}: {sorted(registry.entries) or 'none yet'} (to register a lab: "
        f"hacfed-server register --state-dir {cfg.state_dir} <its enrolment.txt>)")
    for problem in registry.problems:
        say(f"registry: {problem}")
    if cfg.server.trust_on_first_use:
        say("WARNING: --trust-on-first-use: ANY participant that connects first can register a key for an id. "
            "Development only; never across organizations.")
    return write_server_config(cfg, state / SETTINGS_FILE)


def lock_state_dir(state: Path):  # noqa: ANN201 - an open file object kept for the process's lifetime
    """One hacfed-server per state dir. The lock dies with the process, also on SIGKILL."""
    handle = open(state / "server.lock", "w")  # noqa: SIM115
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ValueError(f"another hacfed-server is running with state dir {state}") from None
    return handle


def run_config(cfg: ServerConfig, settings_path: Path) -> dict[str, str | float]:
    """The ServerApp reads every setting from the config file (its loop timing too); the ClientApp
    relays, which cannot read it, get only their deadline."""
    deadline = cfg.coordinator.round_deadline_s
    return {
        "driver": DRIVER_SPEC,
        "driver-config": str(settings_path),
        "state-dir": str(cfg.state_dir),
        "supervisor": format_supervisor(this_process()),  # an orphaned ServerApp stops
        "relay-timeout-s": max(deadline * 0.9, 1.0),  # below the round's, so the relay answers first
    }


class Server:
    def __init__(self, cfg: ServerConfig, sup: ProcessSupervisor) -> None:
        self.cfg, self.sup = cfg, sup
        self.state = cfg.state_dir
        self.tls = None if cfg.server.insecure else TlsFiles(cfg.server.tls_cert, cfg.server.tls_key, cfg.server.tls_ca)
        self.link: SuperLink | None = None
        self.run: ManagedProcess | None = None
        self.console = ConsoleTail(self.state / CONSOLE_FILE, print)
        self.node_auth: NodeAuthSync | None = None  # with TLS: Flower's SuperNode authentication
        self._checked_registry = 0.0
        self.space = SpacePause(self.state, say, time.monotonic, time.time)  # writes failing for lack of space

    def start_link(self, port: int) -> SuperLink:
        host, _ = self.cfg.listen
        self.link = start_superlink(self.sup, self.state / "superlink", host=host, fleet_port=port,
                                    insecure=self.tls is None, tls=self.tls, supernode_auth=self.tls is not None,
                                    database=self.state / "superlink.db")
        self._record()
        if self.tls is not None:  # register the labs' SuperNode keys before any run can start
            home = self.state / "flwr-admin"
            write_connection_config(home, name=ADMIN_CONNECTION, control_address=self.link.control_address,
                                    insecure=False, root_cert=self.tls.ca_certfile)
            self.node_auth = NodeAuthSync(self.cfg.keys_dir, self.state / BINDINGS_FILE, FlwrCli(home), say)
            self.node_auth.sync(check_superlink=True)
        return self.link

    def watch_registry(self) -> None:
        """Within about a second of a `register` or `revoke`, make the SuperLink's registered
        SuperNode keys follow (a revoked lab's SuperNode is cut off)."""
        now = time.monotonic()
        if self.node_auth is None or now - self._checked_registry < 1.0:
            return
        self._checked_registry = now
        if self.node_auth.changed():
            self.node_auth.sync()

    def submit(self) -> ManagedProcess:
        assert self.link is not None
        submitted = submit_run(self.sup, self.state / "flwr-run", control_address=self.link.control_address,
                               run_config=run_config(self.cfg, self.state / SETTINGS_FILE),
                               insecure=self.tls is None, root_cert=None if self.tls is None else self.tls.ca_certfile)
        self.run = submitted.process
        self._record()
        return self.run

    def _record(self) -> None:
        procs = [p for p in (self.link.process if self.link else None, self.run) if p is not None and p.alive()]
        record_children(self.state, [(p.name, p.pid) for p in procs])

    def serve(self) -> int:
        """Submit the run, follow it, resubmit it when it dies; 0 once every round is done."""
        failures, progress = 0, self._progress()
        self.submit()
        while True:
            self.console.pump()
            self.watch_registry()
            ended = (self.link is not None and not self.link.process.alive()) or not (self.run and self.run.alive())
            if self._paused_for_space(ended):
                time.sleep(0.2)
                continue
            if self.link is not None and not self.link.process.alive():
                say(f"the SuperLink exited (code {self.link.process.returncode()}); restarting it on port "
                    f"{self.link.fleet_port}")
                if self.run is not None and self.run.alive():
                    self.sup.stop(self.run)
                self.start_link(self.link.fleet_port)
                self.submit()
                continue
            if self.run is not None and self.run.alive():
                time.sleep(0.2)
                continue
            self.console.pump()
            if (self.state / DONE_FILE).exists():
                done = json.loads((self.state / DONE_FILE).read_text(encoding="utf-8"))
                say(f"all {done['rounds']} rounds done; metrics in {self.cfg.metrics_out}; journal "
                    f"{self.cfg.coordinator.journal_path}; torch imported: ServerApp {done['torch_loaded']}, "
                    f"hacfed-server {'torch' in sys.modules}")
                return 0
            now = self._progress()
            failures = 0 if now != progress else failures + 1
            progress = now
            tail = "\n".join((self.run.log_tail(4000) if self.run is not None else "").splitlines()[-10:])
            if failures > self.cfg.server.max_run_restarts:
                say(f"the ServerApp run failed {failures} times without progress; giving up. Last output:\n{tail}")
                return 1
            say(f"the ServerApp run ended before the federation finished; resubmitting (resumes from the "
                f"journal). Last output:\n{tail}")
            time.sleep(min(2.0 * failures, 10.0))
            self.submit()

    def _paused_for_space(self, ended: bool) -> bool:
        """True while the state dir's writes fail for lack of space (hacfed.server.disk_space): nothing is
        restarted and an ended run is not a failure. When space returns, Flower's side starts again."""
        pause = self.space.check(now_needed=ended and not self.space.paused)
        if pause is not None:
            self._restart_after_pause(*pause)
        return self.space.paused

    def _restart_after_pause(self, since: float, paused_s: float) -> None:
        """The SuperLink and the ServerApp may have failed a write in any state (Flower's SuperExec was
        seen to die, leaving runs that never start): both start again, on the same port, once the open
        rounds' deadlines are held by the pause (unless the ServerApp's driver held them itself)."""
        if self.run is not None and self.run.alive():
            self.sup.stop(self.run)
        assert self.link is not None
        port = self.link.fleet_port
        if self.link.process.alive():
            self.sup.stop(self.link.process)
        c = self.cfg.coordinator
        try:
            held = hold_open_deadlines(c.journal_path, c.audit_path, since, paused_s, time.time())
        except (JournalError, AuditError) as exc:
            say(f"the open rounds' deadlines could not be held: {exc}")
        else:
            for round_id in held:
                say(f"round {round_id}: deadline held {paused_s:.0f}s (the time paused)")
        self.start_link(port)
        self.submit()

    def _progress(self) -> tuple[int, int | None, tuple[int, ...]]:
        return rounds_progress(self.state)


def rounds_progress(state: Path) -> tuple[int, int | None, tuple[int, ...]]:
    """Where the rounds stand (`driver-status.json`): a round opened or closed since is progress. A
    missing or unreadable file (one torn by a kill -9 before its writes were atomic) says nothing."""
    try:
        data = json.loads((state / STATUS_FILE).read_text(encoding="utf-8"))
        return (int(data["next_round"]), data.get("open_round"), tuple(data.get("open_rounds") or ()))
    except (OSError, ValueError, KeyError, TypeError):
        return (-1, None, ())


def start_link_on_known_port(server: Server, port: int) -> SuperLink:
    """With port 0, a restarted server first tries the port its previous life used, so the labs'
    SuperNodes (which keep retrying that address) find it again; the OS picks one if it is taken."""
    remembered = server.state / PORT_FILE
    previous = remembered_port(remembered) if port == 0 else None
    if previous is not None:
        try:
            link = server.start_link(previous)
        except (ProcessError, TimeoutError):
            say(f"port {previous} of the previous run is taken; letting the OS pick one (labs must reconnect)")
            link = server.start_link(0)
    else:
        link = server.start_link(port)
    write_atomic(remembered, f"{link.fleet_port}\n".encode(), 0o644)
    return link


def remembered_port(path: Path) -> int | None:
    """The Fleet port a previous run wrote to `path`, or None when there is none or it is not a port
    (a file torn by a kill -9 before its write was atomic, or not hacfed's): the OS picks one then."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        say(f"cannot read {path} ({exc}); letting the OS pick the port")
        return None
    if not text.isdigit() or not 0 < int(text) < 65536:
        say(f"{path} holds no port ({text[:40]!r}); letting the OS pick one")
        return None
    return int(text)


def start_dashboard_of(cfg: ServerConfig):  # noqa: ANN201 - RunningDashboard | None
    """`--dashboard`: the read-only page in a thread of this process (hacfed.server.dashboard)."""
    address = cfg.dashboard_address
    if address is None:
        return None
    from hacfed.server.dashboard.reader import DashboardSources
    from hacfed.server.dashboard.serve import start_dashboard

    c = cfg.coordinator
    sources = DashboardSources(journal=Path(c.journal_path), metrics=cfg.metrics_out, keys_dir=cfg.keys_dir,
                               status=cfg.state_dir / STATUS_FILE, run_id=c.run_id, rounds=c.rounds,
                               round_deadline_s=c.round_deadline_s, expected_participants=c.expected_participants)
    dashboard = start_dashboard(address, sources)
    exposure = "PUBLIC, no authentication" if address.public else "loopback"
    say(f"dashboard: {dashboard.url} (read-only, {exposure})")
    return dashboard


def run_server(cfg: ServerConfig) -> int:
    """The whole life of hacfed-server; SIGTERM / SIGINT stop every child and return 0."""
    check_before_writing(cfg)
    state = cfg.state_dir
    state.mkdir(parents=True, exist_ok=True)
    lock = lock_state_dir(state)
    try:
        leftovers = kill_leftovers(state)
        for leftover in leftovers:
            say(f"stopped {leftover} left running by a previous hacfed-server")
        check_ports(cfg, settle_s=LEFTOVER_PORT_SETTLE_S if leftovers else 0.0)  # a leftover held the port
        prepare(cfg)
        if (state / DONE_FILE).exists():
            say(f"the run {cfg.coordinator.run_id} in {state} is already complete; nothing to do (its metrics: "
                f"{cfg.metrics_out}; a new run needs a fresh --state-dir)")
            return 0
        try:
            with ProcessSupervisor(grace_s=10.0) as sup:
                server = Server(cfg, sup)
                link = start_link_on_known_port(server, cfg.listen[1])
                mode = ("plaintext, loopback, no SuperNode authentication: development only" if server.tls is None
                        else "TLS, SuperNode authentication")
                say(f"ready: Fleet API on {link.fleet_address} ({mode}); state in {state}")
                dashboard = start_dashboard_of(cfg)
                try:
                    code = server.serve()
                finally:
                    if dashboard is not None:
                        dashboard.stop()
            forget_children(state)
            return code
        except (KeyboardInterrupt, SystemExit) as stop:
            forget_children(state)
            say(f"stopped ({type(stop).__name__}); state kept in {state}: run the same command to resume")
            return 0
    except JournalError as exc:
        raise ValueError(str(exc)) from None
    finally:
        lock.close()
