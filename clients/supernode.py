"""Start a lab's Flower SuperNode with hacfed's resident ClientApp runner and a shorter idle poll.

Runs in hacfed-client, which supervises the SuperNode as its child: the child is this module itself
(`python -m hacfed.clients.supernode hacfed-supernode ...`), which runs the stock SuperNode with
Flower's message cap lowered to hacfed's (`hacfed.flower_protocol.FLOWER_MAX_MESSAGE_BYTES`) and
- with isolation "runner" (the default), Flower's `--isolation process` mode and, as a thread of the
  same process, hacfed's ClientApp runner on its ClientAppIo API (`hacfed.clients.clientapp_runner`):
  no `flower-superexec` polling every 1 s, no fresh `flwr-clientapp` process per message; isolation
  "subprocess" (`$HACFED_CLIENTAPP_ISOLATION=subprocess`, for comparison) runs stock Flower's;
- unless `idle_poll_s` is None, every sleep of the SuperNode loop capped (its fixed 3 s after an empty
  pull, its 0.5 s while waiting for the reply; a reply from the runner ends the wait at once), the
  pulls after a message quick at first (`IdlePolls`: 20 ms, then each wait 1.3x longer, back to
  `idle_poll_s` within about 2.5 s: an idle lab pulls as often as before), a stored message waking the
  runner at once instead of at its next 50 ms poll,
  hacfed's reconnect backoff (`hacfed.clients.backoff`: 1 s x1.6, jitter, max 30 s, every attempt
  logged) and a 20 ms first retry when it pulls a message's content that is still arriving
  (`hacfed.flower_pulls`; Flower waits 1 s), and gRPC keepalive on its channels
  (`hacfed.flower_keepalive`: a dead link noticed within 15 s). These are the Flower internals still patched: flwr 1.32
  has no option or environment variable for any of them (`tests/unit/test_flower_pins.py` fails on
  an upgrade that changes them).
Before the SuperNode starts, hacfed-client serves `hacfed.clients.relay.serve_participant_unix(handler)`
on a Unix socket in a 0700 directory (`hacfed.clients.local_socket`); the ClientAppIo API stays on
127.0.0.1 TCP, since flwr 1.32 takes only HOST:PORT there (docs/security.md, "Listeners and sinks").
The coordinator's side (SuperLink, run submission) is `hacfed.server.superlink`.

The exact command (with its own FLWR_HOME, FLWR_TELEMETRY_ENABLED=0, FLWR_DISABLE_UPDATE_CHECK=1,
FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1, this venv's bin first on PATH, in its own process
group; the ClientAppIo port is read back from its log):

    python -m hacfed.clients.supernode hacfed-supernode 0.5 16842752 runner \\
        --grpc-rere --superlink 127.0.0.1:9092 --clientappio-api-address 127.0.0.1:0 \\
        --node-config NODE/node-config.toml --isolation process --insecure   # or, with TLS and SuperNode auth:
    #   --root-certificates ca.pem --auth-supernode-private-key STATE/supernode.key
    # node-config.toml:  participant-id = "lab-a"
    #                    participant-address = "unix:/STATE/sockets/relay.sock"
    # (`idle_poll_s=None`: "stock" instead of 0.5 keeps Flower's 3 s sleep and its reconnect backoff;
    #  isolation "subprocess": "subprocess" instead of "runner" and --isolation subprocess)

Where a message's time goes on this path (echo participants, 2 SuperNodes, 2 busy cores, one run
each, poll 0.2 s): ~0.6-0.9 s per round trip with the runner against ~12 s with a fresh
`flwr-clientapp` per message on the same loaded machine; the runner's own share is 30-90 ms. With
2 tiny labs the exchange (round trip minus the lab's compute) was 0.52 s per lab and round, 80 % of
it the SuperNode's idle poll and the ServerApp's; with the quick polls after a message and the
ServerApp's 0.05 s poll it is 0.15-0.17 s (docs/results.md, "Round time over Flower").
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from hacfed.clients.backoff import install as install_backoff
from hacfed.flower_keepalive import install as install_keepalive
from hacfed.flower_protocol import FLOWER_MAX_MESSAGE_BYTES, ConfigValue, cap_flower_messages, to_toml
from hacfed.flower_pulls import shorten_pull_retries
from hacfed.procs import ManagedProcess, ProcessError, ProcessSupervisor, flower_env, wait_for_log_line

# SuperNode pull interval when idle (stock flwr: 3 s). Measured on 2 busy cores, 2 nodes:
# ~5.0 s per round with stock Flower, ~2.1-2.6 s with 0.5 s.
DEFAULT_IDLE_POLL_S = 0.5
# After each message the SuperNode pulls again after BURST_POLL_S, each empty pull waiting BURST_GROWTH
# times longer, up to the idle interval (`IdlePolls`): the coordinator's next message usually follows
# soon after a reply. From 0.5 s idle that is 14 pulls in the 2.5 s after a message, against 5.
BURST_POLL_S = 0.02
BURST_GROWTH = 1.3

# How the SuperNode's ClientApp messages run (see the module docstring).
RUNNER, SUBPROCESS = "runner", "subprocess"
ISOLATION_ENV = "HACFED_CLIENTAPP_ISOLATION"
_APPIO_LINE = "Starting ClientAppIo API on"  # flwr's log line naming the bound ClientAppIo address
_REPLY_READY = threading.Event()  # set by the runner thread after each task (see `_speed_up`)
_MESSAGE_STORED = threading.Event()  # set by the SuperNode loop after each pulled message: wakes the runner

# The SuperNode exits with this code, after a line starting with HEARTBEAT_LOST_LINE, when its heartbeat
# thread died (see `_exit_when_heartbeat_dies`); hacfed-client then starts a new one.
HEARTBEAT_LOST_EXIT = 75
HEARTBEAT_LOST_LINE = "hacfed: the SuperNode's heartbeat to the coordinator stopped"
_EXITING = "; exiting so that hacfed-client starts a new SuperNode"


def clientapp_isolation(env: Mapping[str, str]) -> str:
    """`env[HACFED_CLIENTAPP_ISOLATION]`: "runner" (default) or "subprocess"; anything else is refused."""
    value = env.get(ISOLATION_ENV, "").strip() or RUNNER
    if value not in (RUNNER, SUBPROCESS):
        raise ValueError(f"{ISOLATION_ENV} must be {RUNNER!r} or {SUBPROCESS!r}, got {value!r}")
    return value


@dataclass(frozen=True)
class SuperNode:
    process: ManagedProcess
    node_id: int
    clientappio_address: str
    flwr_home: Path


def start_supernode(
    sup: ProcessSupervisor,
    state_dir: Path,
    *,
    superlink_address: str,
    node_config: Mapping[str, ConfigValue],
    insecure: bool = True,
    root_cert: Path | None = None,
    auth_key: Path | None = None,
    clientappio_port: int = 0,
    idle_poll_s: float | None = DEFAULT_IDLE_POLL_S,
    isolation: str | None = None,
    ready_timeout_s: float = 60.0,
) -> SuperNode:
    """Start `flower-supernode` and wait until it has registered with the SuperLink.

    `node_config` reaches every ClientApp as `context.node_config` (hacfed's relay needs
    `participant-id` and `participant-address`). Port 0 lets the SuperNode pick its
    ClientAppIo port, which is read back from its log. `idle_poll_s` replaces flwr's fixed
    3 s sleep between empty pulls (see `run_supernode`); None keeps the stock sleep.
    `auth_key`: the lab's SuperNode private key (`hacfed.enrolment`) for a SuperLink with SuperNode
    authentication; the coordinator must have registered its public key. `isolation`: how ClientApp
    messages run, `"runner"` (hacfed's resident runner, the default) or `"subprocess"` (stock Flower:
    a SuperExec and a fresh `flwr-clientapp` per message); None reads `$HACFED_CLIENTAPP_ISOLATION`.
    """
    if insecure == (root_cert is not None):
        raise ValueError("pass insecure=True without root_cert, or insecure=False with root_cert")
    if auth_key is not None and insecure:
        raise ValueError("SuperNode authentication needs TLS (pass root_cert)")
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    config_path = state_dir / "node-config.toml"
    config_path.write_text(to_toml(node_config), encoding="utf-8")
    if idle_poll_s is not None and not idle_poll_s > 0:
        raise ValueError(f"idle_poll_s must be > 0 or None, got {idle_poll_s}")
    isolation = clientapp_isolation(os.environ if isolation is None else {ISOLATION_ENV: isolation})
    program = [sys.executable, "-m", "hacfed.clients.supernode", "hacfed-supernode",
               "stock" if idle_poll_s is None else repr(idle_poll_s), str(FLOWER_MAX_MESSAGE_BYTES), isolation]
    argv = [
        *program,
        "--grpc-rere",
        "--superlink", superlink_address,
        "--clientappio-api-address", f"127.0.0.1:{clientappio_port}",
        "--node-config", str(config_path),
        "--isolation", "process" if isolation == RUNNER else "subprocess",
    ]
    argv += ["--insecure"] if root_cert is None else ["--root-certificates", str(root_cert)]
    if auth_key is not None:
        argv += ["--auth-supernode-private-key", str(auth_key)]
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


def run_supernode(idle_poll_s: float | None, max_message_bytes: int, isolation: str, argv: list[str]) -> None:
    """Run `flower-supernode argv...` with its Fleet connection capped at `max_message_bytes`, hacfed's
    ClientApp runner on its ClientAppIo API (`isolation` "runner", with `--isolation process` in argv)
    and, unless `idle_poll_s` is None, every sleep of its main loop capped at `idle_poll_s`, hacfed's
    reconnect backoff and a 20 ms first retry for content still arriving (`hacfed.flower_pulls`).

    Why the sleep: flwr 1.32 sleeps a fixed 3 s after an empty pull, and since a SuperNode pulls
    right after pushing its reply, the next round's message almost always waits out that full
    sleep. There is no option for it, so this wraps the `time` module that
    `flwr.supernode.start_client_internal` sees. Why the cap: see
    `hacfed.flower_protocol.cap_flower_messages`. The checks (and tests/unit/test_flower_pins.py)
    make a flwr upgrade that changes either fail loudly instead of silently running with stock settings.
    """
    import flwr.supernode.start_client_internal as loop_module
    from flwr.supernode.cli import flower_supernode

    cap_flower_messages(loop_module, [loop_module._init_connection], max_message_bytes)
    install_keepalive()  # a dead link to the coordinator is noticed within seconds (security.md R6)
    if idle_poll_s is not None:
        shorten_pull_retries(loop_module, [loop_module._pull_and_store_message])  # before `_speed_up` wraps it
        _speed_up(loop_module, idle_poll_s)
    if isolation == RUNNER:
        _start_runner_when_serving()
    _exit_when_heartbeat_dies()
    sys.argv = ["flower-supernode", *argv]
    flower_supernode()


class _AppIoAddressWatch(logging.Handler):
    """Starts hacfed's ClientApp runner once flwr logs the ClientAppIo API's bound address.

    Why a log handler: the SuperNode binds the API (port 0: any free port) inside
    `flower_supernode()`, which only returns when the node stops, and the bound address reaches the
    outside only through that log line (the same line `start_supernode` reads from the log file).
    """

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.started = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.started or _APPIO_LINE not in str(record.msg) or not record.args:
            return
        from hacfed.clients.clientapp import app
        from hacfed.clients.clientapp_runner import start_runner

        self.started = True
        # A finished task wakes the SuperNode loop from its (capped) sleep: it is waiting for that reply.
        start_runner(str(record.args[-1]), app, on_task=lambda _outcome: _REPLY_READY.set(),  # type: ignore[index]
                     wake=_MESSAGE_STORED)


def _exit_when_heartbeat_dies() -> None:
    """End the SuperNode when its heartbeat thread dies, so that hacfed-client starts a new one.

    Why: flwr 1.32's heartbeat sender retries only UNAVAILABLE and DEADLINE_EXCEEDED. Any other
    answer (UNKNOWN from a SuperLink whose SQLite reports "database or disk is full", or a SuperLink
    that no longer knows the node) ends the thread, while the main loop keeps pulling, since reads
    still work. The SuperLink then counts the node offline for good, also after it recovers: the lab
    never rejoins. A fresh SuperNode registers again; the lab's outbox resends what was unanswered.
    """
    from flwr.supercore.heartbeat import HeartbeatSender

    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        previous(args)
        if not _raised_in(args.exc_traceback, HeartbeatSender):
            return
        print(f"{HEARTBEAT_LOST_LINE} ({_why(args.exc_value)}){_EXITING}", file=sys.stderr, flush=True)
        os._exit(HEARTBEAT_LOST_EXIT)  # the main loop would otherwise pull on as a node the SuperLink dropped

    threading.excepthook = hook


def heartbeat_lost_reason(log_path: Path) -> str:
    """What the SuperNode logged when it exited with HEARTBEAT_LOST_EXIT (the end of its log)."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(max(fh.seek(0, os.SEEK_END) - 16_384, 0))
            tail = fh.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"its log is unreadable: {exc}"
    lines = [line for line in tail.splitlines() if HEARTBEAT_LOST_LINE in line]
    if not lines:
        return "the SuperNode's heartbeat to the coordinator stopped (no reason logged)"
    return lines[-1][lines[-1].index(HEARTBEAT_LOST_LINE) + len("hacfed: "):].removesuffix(_EXITING)


def _why(exc: BaseException | None) -> str:
    """One line: a gRPC error's status and details (UNKNOWN: ...database or disk is full), else the exception."""
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):
        text = f"{getattr(code(), 'name', code())}: {details()}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:300]


def _raised_in(tb: object, cls: type) -> bool:
    """Whether a frame of the traceback `tb` is a method of a `cls` instance."""
    while tb is not None:
        if isinstance(tb.tb_frame.f_locals.get("self"), cls):  # type: ignore[attr-defined]
            return True
        tb = tb.tb_next  # type: ignore[attr-defined]
    return False


def _start_runner_when_serving() -> None:
    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.addHandler(_AppIoAddressWatch())


class IdlePolls:
    """How long the SuperNode loop sleeps after each empty pull: `burst_s` after a message, then each
    sleep `growth` times the one before, up to `idle_s` (see `BURST_POLL_S`). Idle labs pull every `idle_s`."""

    def __init__(self, idle_s: float, burst_s: float = BURST_POLL_S, growth: float = BURST_GROWTH) -> None:
        if not 0 < burst_s <= idle_s:
            raise ValueError(f"burst_s must be in (0, idle_s={idle_s}], got {burst_s}")
        if not growth > 1:
            raise ValueError(f"growth must be > 1, got {growth}")
        self.idle_s, self.burst_s, self.growth = idle_s, burst_s, growth
        self._next = idle_s

    def pulled(self, got_message: bool) -> None:
        """A pull ended; after a message the next empty pulls come quickly again."""
        if got_message:
            self._next = self.burst_s

    def sleep_s(self) -> float:
        """The sleep after this empty pull (and the schedule moves on)."""
        seconds, self._next = self._next, min(self._next * self.growth, self.idle_s)
        return seconds


def _speed_up(loop_module: ModuleType, idle_poll_s: float) -> None:
    """The quick idle sleeps and hacfed's reconnect backoff (see `run_supernode`)."""
    if "time.sleep(3)" not in inspect.getsource(loop_module.start_client_internal):
        raise RuntimeError("this flwr's SuperNode loop has no time.sleep(3): drop idle_poll_s")
    if not hasattr(loop_module, "_make_fleet_connection_retry_invoker"):
        raise RuntimeError("this flwr's SuperNode has no _make_fleet_connection_retry_invoker: update hacfed's backoff")
    polls = IdlePolls(idle_poll_s)
    pull = loop_module._pull_and_store_message
    last_pull_empty = [False]

    def pull_and_store(*args: object, **kwargs: object) -> int | None:
        run_id = pull(*args, **kwargs)
        last_pull_empty[0] = run_id is None
        polls.pulled(run_id is not None)
        if run_id is not None:
            _MESSAGE_STORED.set()  # the runner claims its task now, not at its next poll
        return run_id

    class _CappedSleepTime:
        def __getattr__(self, name: str) -> object:
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            # After an empty pull (flwr's 3 s): the `IdlePolls` schedule. Any sleep ends early when hacfed's
            # runner has stored a reply (`_REPLY_READY`): the loop's wait for it (`time.sleep(0.5)` per check
            # in flwr 1.32) then costs nothing; a stray wake only adds one pull.
            wait = polls.sleep_s() if last_pull_empty[0] else idle_poll_s
            if _REPLY_READY.wait(min(seconds, wait)):
                _REPLY_READY.clear()

    loop_module._pull_and_store_message = pull_and_store
    loop_module.time = _CappedSleepTime()  # type: ignore[assignment]
    # Reconnect with hacfed's backoff (1 s x1.6, jitter, max 30 s) and log every attempt (R5).
    make_invoker = loop_module._make_fleet_connection_retry_invoker
    loop_module._make_fleet_connection_retry_invoker = lambda *a, **kw: install_backoff(make_invoker(*a, **kw))


if __name__ == "__main__":
    if len(sys.argv) < 5 or sys.argv[1] != "hacfed-supernode" or sys.argv[4] not in (RUNNER, SUBPROCESS):
        sys.exit("usage: python -m hacfed.clients.supernode hacfed-supernode SECONDS|stock MAX_BYTES "
                 "runner|subprocess [flower-supernode args]")
    run_supernode(None if sys.argv[2] == "stock" else float(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                  sys.argv[5:])
