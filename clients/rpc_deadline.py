"""No gRPC call of a lab's own code goes out without a deadline (security.md R7).

hacfed's code calls two gRPC services: the participant relay (`hacfed.clients.relay.call_participant`,
which refuses a call without a positive timeout) and, in the ClientApp runner, Flower's ClientAppIo
API through Flower's stubs and helpers, which call without a timeout. Their channels carry
`DeadlineInterceptor`: a unary call without a timeout gets `default_s` (or, with `default_s=None`,
raises before anything is sent), so no call can wait forever on a peer that hangs.

Torch-free: runs in the SuperNode process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc


class MissingDeadlineError(ValueError):
    """An RPC was about to go out without a timeout."""


class DeadlineInterceptor(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Give every unary call without a timeout `default_s` seconds; with `default_s=None`, refuse it."""

    def __init__(self, default_s: float | None) -> None:
        if default_s is not None and (isinstance(default_s, bool) or not default_s > 0):
            raise ValueError(f"default_s must be > 0 or None, got {default_s!r}")
        self.default_s = default_s

    def intercept_unary_unary(self, continuation: Callable[..., Any], client_call_details: grpc.ClientCallDetails,
                              request: Any) -> Any:
        if client_call_details.timeout is None:
            if self.default_s is None:
                raise MissingDeadlineError(f"gRPC call {client_call_details.method} has no timeout: every call "
                                           f"needs one")
            client_call_details = client_call_details._replace(timeout=self.default_s)
        return continuation(client_call_details, request)
