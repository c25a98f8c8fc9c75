"""Start a lab's Flower SuperNode, with a shorter idle poll than stock Flower (hacfed-client's process).

Runs in hacfed-client, which supervises the SuperNode as its child: the child is this module itself
(`python -m hacfed.clients.supernode hacfed-supernode ...`), which runs the stock SuperNode with
Flower's message cap lowered to hacfed's (`hacfed.flower_protocol.FLOWER_MAX_MESSAGE_BYTES`) and,
unless `idle_poll_s` is None, a capped idle sleep and hacfed's reconnect backoff
(`hacfed.clients.backoff`: 1 s x1.6, jitter, max 30 s, every attempt logged). Before the SuperNode starts, hacfed-client
serves `hacfed.clients.relay.serve_participant(handler)` on 127.0.0.1. The coordinator's side
(SuperLink, run submission) is `hacfed.server.superlink`.

The exact command (with its own FLWR_HOME, FLWR_TELEMETRY_ENABLED=0, FLWR_DISABLE_UPDATE_CHECK=1,
FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1, this venv's bin first on PATH, in its own process
group; the ClientAppIo port is read back from its log):

    python -m hacfed.clients.supernode hacfed-supernode 0.5 16842752 \\
        --grpc-rere --superlink 127.0.0.1:9092 --clientappio-api-address 127.0.0.1:0 \\
        --node-config NODE/node-config.toml --insecure      # or, with TLS and SuperNode auth:
    #   --root-certificates ca.pem --auth-supernode-private-key STATE/supernode.key
    # node-config.toml:  participant-id = "lab-a"
    #                    participant-address = "127.0.0.1:50051"
    # (`idle_poll_s=None`: "stock" instead of 0.5 keeps Flower's 3 s sleep and its reconnect backoff)

Measured on 2 busy CPU cores, 2 SuperNodes, tiny payloads: one round trip takes ~5.0 s
(median) with stock Flower and ~2.1-2.6 s with the 0.5 s SuperNode poll; what remains is the
SuperNode's superexec (polls every 1 s) starting a fresh `flwr-clientapp` process per message.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from hacfed.clients.backoff import install as install_backoff
from hacfed.flower_protocol import FLOWER_MAX_MESSAGE_BYTES, ConfigValue, cap_flower_messages, to_toml
from hacfed.procs import ManagedProcess, ProcessError, ProcessSupervisor, flower_env, wait_for_log_line

# SuperNode pull interval when idle (stock flwr: 3 s). Measured on 2 busy cores, 2 nodes:
# ~5.0 s per round with stock Flower, ~2.1-2.6 s with 0.5 s.
DEFAULT_IDLE_POLL_S = 0.5


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
    ready_timeout_s: float = 60.0,
) -> SuperNode:
    """Start `flower-supernode` and wait until it has registered with the SuperLink.

    `node_config` reaches every ClientApp as `context.node_config` (hacfed's relay needs
    `participant-id` and `participant-address`). Port 0 lets the SuperNode pick its
    ClientAppIo port, which is read back from its log. `idle_poll_s` replaces flwr's fixed
    3 s sleep between empty pulls (see `run_supernode`); None keeps the stock sleep.
    `auth_key`: the lab's SuperNode private key (`hacfed.enrolment`) for a SuperLink with SuperNode
    authentication; the coordinator must have registered its public key.
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
    program = [sys.executable, "-m", "hacfed.clients.supernode", "hacfed-supernode",
               "stock" if idle_poll_s is None else repr(idle_poll_s), str(FLOWER_MAX_MESSAGE_BYTES)]
    argv = [
        *program,
        "--grpc-rere",
        "--superlink", superlink_address,
        "--clientappio-api-address", f"127.0.0.1:{clientappio_port}",
        "--node-config", str(config_path),
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


def run_supernode(idle_poll_s: float | None, max_message_bytes: int, argv: list[str]) -> None:
    """Run `flower-supernode argv...` with its Fleet connection capped at `max_message_bytes` and,
    unless `idle_poll_s` is None, every sleep of its main loop capped at `idle_poll_s` and hacfed's
    reconnect backoff.

    Why the sleep: flwr 1.32 sleeps a fixed 3 s after an empty pull, and since a SuperNode pulls
    right after pushing its reply, the next round's message almost always waits out that full
    sleep. There is no option for it, so this wraps the `time` module that
    `flwr.supernode.start_client_internal` sees. Why the cap: see
    `hacfed.flower_protocol.cap_flower_messages`. The checks make a flwr upgrade that changes
    either fail loudly instead of silently running with stock settings.
    """
    import flwr.supernode.start_client_internal as loop_module
    from flwr.supernode.cli import flower_supernode

    cap_flower_messages(loop_module, [loop_module._init_connection], max_message_bytes)
    if idle_poll_s is not None:
        _speed_up(loop_module, idle_poll_s)
    sys.argv = ["flower-supernode", *argv]
    flower_supernode()


def _speed_up(loop_module: ModuleType, idle_poll_s: float) -> None:
    """The capped idle sleep and hacfed's reconnect backoff (see `run_supernode`)."""
    if "time.sleep(3)" not in inspect.getsource(loop_module.start_client_internal):
        raise RuntimeError("this flwr's SuperNode loop has no time.sleep(3): drop idle_poll_s")
    if not hasattr(loop_module, "_make_fleet_connection_retry_invoker"):
        raise RuntimeError("this flwr's SuperNode has no _make_fleet_connection_retry_invoker: update hacfed's backoff")

    class _CappedSleepTime:
        def __getattr__(self, name: str) -> object:
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            time.sleep(min(seconds, idle_poll_s))

    loop_module.time = _CappedSleepTime()  # type: ignore[assignment]
    # Reconnect with hacfed's backoff (1 s x1.6, jitter, max 30 s) and log every attempt (R5).
    make_invoker = loop_module._make_fleet_connection_retry_invoker
    loop_module._make_fleet_connection_retry_invoker = lambda *a, **kw: install_backoff(make_invoker(*a, **kw))


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "hacfed-supernode":
        sys.exit("usage: python -m hacfed.clients.supernode hacfed-supernode SECONDS|stock MAX_BYTES "
                 "[flower-supernode args]")
    run_supernode(None if sys.argv[2] == "stock" else float(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
