"""What hacfed's Flower processes agree on: record keys, config keys, loopback addresses, config files.

Shared by both sides. The coordinator's ServerApp (`hacfed.server.serverapp`) writes and reads the
records that a lab's ClientApp relay (`hacfed.clients.relay`) reads and answers; hacfed-server
writes the run config and hacfed-client the SuperNode's node config, both as flat TOML files that
flwr reads directly. Torch-free: the ClientApp imports this in a fresh process per message.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Mapping

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


def check_loopback_address(address: str) -> tuple[str, int]:
    """Split "host:port" and insist the host is loopback: the relay channel is plaintext."""
    host, sep, port_text = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"participant address must look like 127.0.0.1:PORT, got {address!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range in {address!r}")
    if host != "localhost":
        try:
            is_loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            is_loopback = False
        if not is_loopback:
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
