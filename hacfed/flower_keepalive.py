"""gRPC keepalive for Flower's connections: a dead link is noticed within seconds (security.md R6).

Without it a lab's SuperNode whose link to the coordinator dies silently (a partition, a NAT that
dropped the flow) keeps its TCP connection "up": its pull waits without a deadline until TCP gives
up, many minutes later, while Flower's SuperLink pings only every 210 s. With it the SuperNode's
channel pings after `KEEPALIVE_TIME_MS` and closes the connection when no answer comes within
`KEEPALIVE_TIMEOUT_MS` (also given as gRPC's ping timeout, which is what gRPC 1.85 waits for a
ping's answer: a link that is down is noticed sooner through the TCP user timeout gRPC derives from
the keepalive, a frozen host that still acknowledges TCP only by the ping; tests/faults/
test_half_open_keepalive.py); the call fails with UNAVAILABLE, and the SuperNode reconnects (hacfed's
backoff, `hacfed.clients.backoff`) until the link is back. The servers of the same processes accept
pings that often (`grpc.http2.min_recv_ping_interval_without_data_ms`, also between calls), so no
`too_many_pings` GOAWAY ever answers them.

flwr 1.32 takes no gRPC option anywhere (`flwr.supercore.grpc.create_channel` and
`generic_create_grpc_server` build their option lists themselves) and gRPC reads none from the
environment, so `install` gives `flwr.supercore.grpc` a `grpc` whose channel and server factories add
these options to Flower's. hacfed's SuperNode (`hacfed.clients.supernode`) and SuperLink
(`hacfed.server.superlink`) wrappers call it first; it raises when Flower no longer builds its
channels and servers there, so an upgrade fails loudly (tests/unit/test_flower_keepalive.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import grpc

KEEPALIVE_TIME_MS = 10_000  # a ping after 10 s without one
KEEPALIVE_TIMEOUT_MS = 5_000  # no answer within 5 s: the connection is dead
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    # gRPC 1.85 waits for a keepalive ping's ACK for this long (default 60 s), not keepalive_timeout_ms:
    # a peer that still ACKs TCP but never answers the ping (its host frozen) took 70 s to notice
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),  # also between pulls
    ("grpc.http2.max_pings_without_data", 0),
)
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_pings_without_data", 0),
)


def merged(options: Sequence[tuple[str, Any]] | None, extra: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """`options` with each key of `extra` set to its value there (one entry per key)."""
    values = dict(options or ())
    values.update(extra)
    return list(values.items())


class KeepaliveGrpc:
    """The `grpc` module as Flower's factories see it: channels and servers get the keepalive options."""

    def __init__(self, module: ModuleType) -> None:
        self._grpc = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grpc, name)

    def insecure_channel(self, target: str, *args: Any, options: Sequence[tuple[str, Any]] | None = None,
                         **kwargs: Any) -> grpc.Channel:
        return self._grpc.insecure_channel(target, *args, options=merged(options, CHANNEL_OPTIONS), **kwargs)

    def secure_channel(self, target: str, credentials: grpc.ChannelCredentials, *args: Any,
                       options: Sequence[tuple[str, Any]] | None = None, **kwargs: Any) -> grpc.Channel:
        return self._grpc.secure_channel(target, credentials, *args, options=merged(options, CHANNEL_OPTIONS),
                                         **kwargs)

    def server(self, *args: Any, options: Sequence[tuple[str, Any]] | None = None, **kwargs: Any) -> grpc.Server:
        return self._grpc.server(*args, options=merged(options, SERVER_OPTIONS), **kwargs)


def install(module: ModuleType | None = None) -> None:
    """Give Flower's gRPC factories (`flwr.supercore.grpc`, or `module`) the keepalive options."""
    if module is None:
        import flwr.supercore.grpc as module
    if isinstance(module.grpc, KeepaliveGrpc):
        return
    if module.grpc is not grpc:
        raise RuntimeError(f"{module.__name__}.grpc is not the grpc module: cannot set Flower's keepalive")
    for name, calls in (("create_channel", ("grpc.insecure_channel(", "grpc.secure_channel(")),
                        ("generic_create_grpc_server", ("grpc.server(",))):
        source = inspect.getsource(getattr(module, name))
        if not all(call in source for call in calls) or "options=" not in source:
            raise RuntimeError(f"{module.__name__}.{name} no longer builds its gRPC objects with "
                               f"{' and '.join(calls)}...options=: hacfed cannot set Flower's keepalive this way")
    module.grpc = KeepaliveGrpc(grpc)  # type: ignore[attr-defined]


def uninstall(module: ModuleType | None = None) -> None:
    """Undo `install` (for tests)."""
    if module is None:
        import flwr.supercore.grpc as module
    if isinstance(module.grpc, KeepaliveGrpc):
        module.grpc = grpc  # type: ignore[attr-defined]
