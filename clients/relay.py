"""The bytes relay between Flower's stateless ClientApp and the resident participant process.

Runs on a lab's side, in two processes: `serve_participant` inside hacfed-client (the resident
participant's local gRPC service), `relay_content` / `hello_content` inside the lab's SuperNode
process, where hacfed's ClientApp runner calls the ClientApp (`hacfed.clients.clientapp`; with
stock Flower's isolation, in a fresh `flwr-clientapp` process per message).

Why: the model must not live in the SuperNode (nor in a ClientApp process that stock Flower starts
per message), and the SuperNode process should stay small and torch-free. The ClientApp only moves
opaque bytes: it takes `content["hacfed"]["payload"]`,
calls the participant's local gRPC service `/hacfed.v1.ParticipantRelay/Exchange` on a Unix
socket only the lab's user can open (address from the SuperNode's
`--node-config participant-address="unix:/STATE/sockets/relay.sock"`, `hacfed.clients.local_socket`),
and puts the reply bytes into the reply message. Bad input or an unreachable participant
becomes an error record `content["hacfed"]["error"] = "HACFED-E-...: message"`, never a
crash. The gRPC handlers are generic with raw bytes (no codegen); the payload's own
protobuf (the `Envelope`) is defined and parsed elsewhere. The record and config keys are
shared with the coordinator's ServerApp in `hacfed.flower_protocol`.

This module must stay torch-free: it runs in the SuperNode process (and in every `flwr-clientapp`).
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from collections.abc import Callable, Mapping
from concurrent import futures
from pathlib import Path
from typing import NoReturn

import grpc
from flwr.app import ConfigRecord, RecordDict

from hacfed.clients.local_socket import UNIX_PREFIX
from hacfed.flower_protocol import (
    ERROR_KEY,
    NODE_PARTICIPANT_ADDRESS,
    NODE_PARTICIPANT_ID,
    PARTICIPANT_ID_KEY,
    PAYLOAD_KEY,
    RECORD_NAME,
    RUN_RELAY_TIMEOUT,
    TORCH_LOADED_KEY,
    check_loopback_address,
)

SERVICE_NAME = "hacfed.v1.ParticipantRelay"
EXCHANGE_METHOD = f"/{SERVICE_NAME}/Exchange"
ERROR_CODE_METADATA_KEY = "hacfed-error-code"
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a round's pool of trajectory text fits easily

_log = logging.getLogger(__name__)


class RelayError(Exception):
    """A failure the relay reports to the coordinator as `"<code>: <message>"`."""

    def __init__(self, code: str, message: str) -> None:
        if not code.startswith("HACFED-E-"):
            raise ValueError(f"relay error codes start with HACFED-E-, got {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ParticipantRejection(Exception):
    """Raised by a participant handler to refuse a request with a chosen gRPC status.

    Use a specific status (INVALID_ARGUMENT, FAILED_PRECONDITION, PERMISSION_DENIED, ...)
    and a `HACFED-E-...` code; both reach the coordinator through the relay.
    """

    def __init__(self, status: grpc.StatusCode, code: str, message: str) -> None:
        if status == grpc.StatusCode.OK:
            raise ValueError("a rejection cannot carry status OK")
        if not code.startswith("HACFED-E-"):
            raise ValueError(f"error codes start with HACFED-E-, got {code!r}")
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def _grpc_options(max_message_bytes: int) -> list[tuple[str, int]]:
    if max_message_bytes <= 0:
        raise ValueError(f"max_message_bytes must be > 0, got {max_message_bytes}")
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def serve_participant_unix(
    handler: Callable[[bytes], bytes],
    socket_path: Path,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_workers: int = 4,
) -> grpc.Server:
    """Serve `handler` (as `serve_participant` does) on the Unix socket `socket_path`, mode 0600.

    The socket's directory must be this user's and closed to everyone else (0700, as
    `hacfed.clients.local_socket.relay_socket_place` makes it): then no other local user can
    connect. A stale socket left by a killed hacfed-client is replaced. Clients connect with the
    address `"unix:" + str(socket_path)`. Stop with `server.stop(grace)` (gRPC removes the file).
    """
    path = Path(socket_path)
    if not path.is_absolute():
        raise ValueError(f"the participant service's socket path must be absolute, got {str(path)!r}")
    parent = os.stat(path.parent)
    if parent.st_uid != os.geteuid() or parent.st_mode & 0o077:
        raise ValueError(f"the directory of the participant service's socket {path} must belong to this user and "
                         f"be closed to others (0700), it is uid {parent.st_uid} mode {oct(parent.st_mode & 0o777)}")
    if path.is_symlink() or path.exists():
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise ValueError(f"{path} exists and is not a socket: will not replace it with the participant service's")
        path.unlink()
    server = _participant_server(handler, max_message_bytes, max_workers)
    try:
        server.add_insecure_port(f"{UNIX_PREFIX}{path}")
    except RuntimeError:
        raise OSError(f"could not bind the participant service to the Unix socket {path}") from None
    os.chmod(path, 0o600)
    server.start()
    return server


def serve_participant(
    handler: Callable[[bytes], bytes],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_workers: int = 4,
) -> tuple[grpc.Server, int]:
    """Serve `handler` as `/hacfed.v1.ParticipantRelay/Exchange` on loopback TCP; return (server, port).

    Any local user can connect to a loopback port: hacfed-client serves on a Unix socket instead
    (`serve_participant_unix`); this is for tests and single-user machines.
    `handler` gets the request bytes and returns the reply bytes. It may raise
    `ParticipantRejection` to choose the status; a `ValueError` becomes INVALID_ARGUMENT
    (`HACFED-E-INVALID-REQUEST`), any other exception INTERNAL (`HACFED-E-PARTICIPANT-FAILED`),
    each with the exception's message and the `hacfed-error-code` trailer. Requests may run
    concurrently on up to `max_workers` threads: a handler that holds a model serializes itself.
    A request whose deadline passes while it waits for a worker never reaches `handler` (gRPC
    drops it; tests/faults/test_deadlines.py); one already running completes (a lab's step is kept
    in its outbox and resent), and its caller gets DEADLINE_EXCEEDED (`HACFED-E-PARTICIPANT-TIMEOUT`).
    Stop with `server.stop(grace)`.
    """
    check_loopback_address(f"[{host}]:{port}")
    server = _participant_server(handler, max_message_bytes, max_workers)
    bind_host = f"[{host}]" if ":" in host else host  # IPv6 literals need brackets
    bound = server.add_insecure_port(f"{bind_host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind the participant service to {host}:{port}")
    server.start()
    return server, bound


def _participant_server(handler: Callable[[bytes], bytes], max_message_bytes: int, max_workers: int) -> grpc.Server:
    def exchange(request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            reply = handler(request)
        except ParticipantRejection as exc:
            _abort(context, exc.status, exc.code, exc.message)
        except ValueError as exc:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "HACFED-E-INVALID-REQUEST", str(exc))
        except Exception as exc:  # noqa: BLE001 - the service boundary maps every failure to a status
            _log.exception("participant handler failed")
            _abort(context, grpc.StatusCode.INTERNAL, "HACFED-E-PARTICIPANT-FAILED",
                   f"{type(exc).__name__}: {exc}")
        if not isinstance(reply, bytes):
            _abort(context, grpc.StatusCode.INTERNAL, "HACFED-E-PARTICIPANT-FAILED",
                   f"handler returned {type(reply).__name__}, expected bytes")
        return reply

    method = grpc.unary_unary_rpc_method_handler(
        exchange, request_deserializer=None, response_serializer=None
    )
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="hacfed-relay"),
        handlers=[grpc.method_handlers_generic_handler(SERVICE_NAME, {"Exchange": method})],
        options=_grpc_options(max_message_bytes),
    )


def _abort(context: grpc.ServicerContext, status: grpc.StatusCode, code: str, message: str) -> NoReturn:
    context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, code),))
    context.abort(status, f"{code}: {message}")
    raise AssertionError("grpc's context.abort always raises")  # for type checkers


def call_participant(
    address: str,
    payload: bytes,
    *,
    timeout_s: float,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> bytes:
    """One Exchange call to the participant at `address`; failures raise `RelayError`.

    Fails fast when nothing listens (no wait-for-ready): the coordinator should learn at
    once that a participant is down rather than after the whole timeout.
    """
    if timeout_s is None or isinstance(timeout_s, bool) or not timeout_s > 0:  # R7: no call without a deadline
        raise ValueError(f"a call to the participant needs a timeout_s > 0, got {timeout_s!r}")
    check_participant_address(address)
    with grpc.insecure_channel(address, options=_grpc_options(max_message_bytes)) as channel:
        exchange = channel.unary_unary(
            EXCHANGE_METHOD, request_serializer=None, response_deserializer=None
        )
        try:
            reply = exchange(payload, timeout=timeout_s)
        except grpc.RpcError as err:
            raise _relay_error_from_rpc(err, address, timeout_s) from None
    if not isinstance(reply, bytes):
        raise RelayError("HACFED-E-PARTICIPANT-FAILED", f"reply is {type(reply).__name__}, not bytes")
    return reply


def check_participant_address(address: str) -> None:
    """`unix:/absolute/path` (what hacfed-client serves) or a loopback `host:port`; else ValueError."""
    if address.startswith(UNIX_PREFIX):
        if not address[len(UNIX_PREFIX):].startswith("/"):
            raise ValueError(f"participant address unix:PATH needs an absolute path, got {address!r}")
        return
    check_loopback_address(address)


def _relay_error_from_rpc(err: grpc.RpcError, address: str, timeout_s: float) -> RelayError:
    status = err.code()  # type: ignore[attr-defined]
    details = err.details() or ""  # type: ignore[attr-defined]
    if status == grpc.StatusCode.UNAVAILABLE:
        return RelayError("HACFED-E-PARTICIPANT-UNREACHABLE", f"{address}: {details}")
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RelayError("HACFED-E-PARTICIPANT-TIMEOUT", f"no reply from {address} within {timeout_s}s")
    trailer = dict(err.trailing_metadata() or ())  # type: ignore[attr-defined]
    code = trailer.get(ERROR_CODE_METADATA_KEY) or f"HACFED-E-PARTICIPANT-{status.name.replace('_', '-')}"
    prefix = f"{code}: "
    message = details[len(prefix):] if details.startswith(prefix) else details
    return RelayError(code, f"{message} (status {status.name})")


def relay_content(
    content: RecordDict, node_config: Mapping[str, object], run_config: Mapping[str, object]
) -> RecordDict:
    """Forward one exchange message's payload to the participant; return the reply content.

    Never raises for bad input or a failed call: the reply carries `error` instead.
    """
    try:
        payload = read_payload(content)
        address = _participant_address(node_config)
        timeout_s = _config_positive_float(run_config, RUN_RELAY_TIMEOUT)
        reply = call_participant(address, payload, timeout_s=timeout_s)
    except RelayError as exc:
        return reply_record(node_config, error=str(exc))
    return reply_record(node_config, payload=reply)


def hello_content(
    content: RecordDict, node_config: Mapping[str, object], run_config: Mapping[str, object]
) -> RecordDict:
    """Answer the ServerApp's `query.hello`: which participant this node is (from the node config)
    and the participant's signed answer to the hello's challenge (`hacfed.hello`), relayed like an
    exchange.

    A missing `participant-id` is an error reply, so the coordinator sees a misconfigured
    SuperNode instead of a silent anonymous one.
    """
    try:
        _config_str(node_config, NODE_PARTICIPANT_ID, "node config")
    except RelayError as exc:
        return reply_record(node_config, error=str(exc))
    return relay_content(content, node_config, run_config)


def reply_record(
    node_config: Mapping[str, object], *, payload: bytes | None = None, error: str | None = None
) -> RecordDict:
    """The relay's reply: payload or error, plus who answered and whether torch was loaded."""
    if payload is not None and error is not None:
        raise ValueError("a relay reply carries a payload or an error, not both")
    values: dict[str, bytes | str | bool] = {TORCH_LOADED_KEY: "torch" in sys.modules}
    participant_id = node_config.get(NODE_PARTICIPANT_ID)
    if isinstance(participant_id, str):
        values[PARTICIPANT_ID_KEY] = participant_id
    if payload is not None:
        values[PAYLOAD_KEY] = payload
    if error is not None:
        values[ERROR_KEY] = error
    return RecordDict({RECORD_NAME: ConfigRecord(values)})


def read_payload(content: RecordDict) -> bytes:
    """`content["hacfed"]["payload"]` as bytes, or a `RelayError` saying what is wrong."""
    if RECORD_NAME not in content:
        raise RelayError("HACFED-E-RELAY-BAD-MESSAGE", f"message has no {RECORD_NAME!r} record")
    record = content[RECORD_NAME]
    if not isinstance(record, ConfigRecord):
        raise RelayError("HACFED-E-RELAY-BAD-MESSAGE",
                         f"record {RECORD_NAME!r} is a {type(record).__name__}, expected ConfigRecord")
    if PAYLOAD_KEY not in record:
        raise RelayError("HACFED-E-RELAY-BAD-MESSAGE", f"record {RECORD_NAME!r} has no {PAYLOAD_KEY!r}")
    payload = record[PAYLOAD_KEY]
    if not isinstance(payload, bytes):
        raise RelayError("HACFED-E-RELAY-BAD-MESSAGE",
                         f"{RECORD_NAME}.{PAYLOAD_KEY} is {type(payload).__name__}, expected bytes")
    return payload


def _config_str(config: Mapping[str, object], key: str, where: str) -> str:
    value = config.get(key)
    if not isinstance(value, str) or not value:
        raise RelayError("HACFED-E-RELAY-CONFIG", f"{where} needs a non-empty string {key!r}, got {value!r}")
    return value


def _participant_address(node_config: Mapping[str, object]) -> str:
    address = _config_str(node_config, NODE_PARTICIPANT_ADDRESS, "node config")
    try:
        check_participant_address(address)
    except ValueError as exc:
        raise RelayError("HACFED-E-RELAY-CONFIG", str(exc)) from None
    return address


def _config_positive_float(config: Mapping[str, object], key: str) -> float:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise RelayError("HACFED-E-RELAY-CONFIG", f"run config needs a positive number {key!r}, got {value!r}")
    return float(value)
