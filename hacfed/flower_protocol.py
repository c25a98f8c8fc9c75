"""What hacfed's Flower processes agree on: record keys, config keys, loopback addresses, config files.

Shared by both sides. The coordinator's ServerApp (`hacfed.server.serverapp`) writes and reads the
records that a lab's ClientApp relay (`hacfed.clients.relay`) reads and answers; hacfed-server
writes the run config and hacfed-client the SuperNode's node config, both as flat TOML files that
flwr reads directly. Torch-free: the ClientApp imports this in a fresh process per message.
"""

from __future__ import annotations

import inspect
import ipaddress
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType

from hacfed.wire.types import MAX_MESSAGE_BYTES

# Flower's own gRPC cap on what the SuperLink's Fleet API and a SuperNode send or receive: hacfed's
# per-message cap plus room for Flower's framing of one record (security.md T8, S5). Stock Flower
# allows 2 GiB - 1, so a 2 GiB message would be read in full before hacfed's check.
FLOWER_MAX_MESSAGE_BYTES = MAX_MESSAGE_BYTES + 64 * 1024
FLOWER_DEFAULT_MAX_MESSAGE_BYTES = 2_147_483_647  # flwr.supercore.grpc.GRPC_MAX_MESSAGE_LENGTH in 1.32

# Keys of the Flower records the ServerApp and the relay exchange.
RECORD_NAME = "hacfed"
PAYLOAD_KEY = "payload"
ERROR_KEY = "error"
PARTICIPANT_ID_KEY = "participant-id"
TORCH_LOADED_KEY = "relay-torch-loaded"
# Keys of the SuperNode's node config and of the run config that the relay reads.
NODE_PARTICIPANT_ID = "participant-id"
NODE_PARTICIPANT_ADDRESS = "participant-address"
RUN_RELAY_TIMEOUT = "relay-timeout-s"

ConfigValue = str | int | float | bool


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost (a name that resolves elsewhere is not loopback)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_loopback_address(address: str) -> tuple[str, int]:
    """Split "host:port" and insist the host is loopback: the relay channel is plaintext."""
    host, sep, port_text = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"participant address must look like 127.0.0.1:PORT, got {address!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range in {address!r}")
    if not is_loopback_host(host):
        raise ValueError(f"participant address must be on loopback, got {address!r}")
    return host, port


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


def cap_flower_messages(module: ModuleType, readers: Sequence[Callable[..., object]], max_bytes: int) -> None:
    """Lower Flower's gRPC message cap in `module` to `max_bytes`.

    flwr 1.32 has no option for it: its servers and channels take `GRPC_MAX_MESSAGE_LENGTH`, a
    module global that `readers` (the functions that build the Fleet API server, or the SuperNode's
    connection) read each time they run. Raises if this flwr no longer reads it there, so an upgrade
    fails loudly instead of silently accepting 2 GiB again (tests/unit/test_flower_message_cap.py).
    """
    if getattr(module, "GRPC_MAX_MESSAGE_LENGTH", None) != FLOWER_DEFAULT_MAX_MESSAGE_BYTES:
        raise RuntimeError(f"{module.__name__}.GRPC_MAX_MESSAGE_LENGTH is not Flower's 2 GiB default: check the cap")
    for reader in readers:
        if "GRPC_MAX_MESSAGE_LENGTH" not in inspect.getsource(reader):
            raise RuntimeError(f"{reader.__qualname__} no longer reads GRPC_MAX_MESSAGE_LENGTH: hacfed cannot cap "
                               f"Flower's messages this way")
    module.GRPC_MAX_MESSAGE_LENGTH = max_bytes  # type: ignore[attr-defined]
