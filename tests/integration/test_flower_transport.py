"""Flower transport, the bytes relay: a SuperNode's ClientApp forwards Flower messages to the lab's
participant service over loopback gRPC and turns every failure into a coded error record.

The round loop is tested in test_flower_transport_round_loop.py, a real deployment in
test_flower_transport_deployment.py.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

import grpc
import pytest
from flwr.app import ConfigRecord, RecordDict

from hacfed.clients.relay import (
    ParticipantRejection,
    RelayError,
    call_participant,
    hello_content,
    relay_content,
    serve_participant,
)


@pytest.fixture
def participant() -> Iterable[tuple[int, list[bytes]]]:
    """An echo participant on loopback: b"abc" -> b"echo:cba"; "fail:*" payloads raise."""
    seen: list[bytes] = []

    def handle(request: bytes) -> bytes:
        seen.append(request)
        if request == b"fail:value":
            raise ValueError("payload is not an envelope")
        if request == b"fail:crash":
            raise RuntimeError("model exploded")
        if request == b"fail:reject":
            raise ParticipantRejection(grpc.StatusCode.FAILED_PRECONDITION, "HACFED-E-STALE-ROUND", "round 3 is closed")
        if request == b"fail:slow":
            time.sleep(1.0)
        return b"echo:" + request[::-1]

    server, port = serve_participant(handle)
    try:
        yield port, seen
    finally:
        server.stop(0).wait()


def _relay(port: int, content: RecordDict, **run_config: object) -> ConfigRecord:
    node_config = {"participant-id": "lab-a", "participant-address": f"127.0.0.1:{port}"}
    reply = relay_content(content, node_config, {"relay-timeout-s": 5.0, **run_config})
    return reply["hacfed"]


def _payload(data: object) -> RecordDict:
    return RecordDict({"hacfed": ConfigRecord({"payload": data})})  # type: ignore[dict-item]


def test_relay_forwards_bytes_and_reply(participant: tuple[int, list[bytes]]) -> None:
    port, seen = participant
    record = _relay(port, _payload(b"\x00abc"))
    assert record["payload"] == b"echo:cba\x00"
    assert seen == [b"\x00abc"]
    assert record["participant-id"] == "lab-a"
    assert record["relay-torch-loaded"] == ("torch" in sys.modules)  # this process is the relay here
    assert "error" not in record


@pytest.mark.parametrize(
    ("request_bytes", "code", "status"),
    [
        (b"fail:value", "HACFED-E-INVALID-REQUEST", "INVALID_ARGUMENT"),
        (b"fail:crash", "HACFED-E-PARTICIPANT-FAILED", "INTERNAL"),
        (b"fail:reject", "HACFED-E-STALE-ROUND", "FAILED_PRECONDITION"),
    ],
)
def test_participant_failures_reach_the_relay_as_codes(
    participant: tuple[int, list[bytes]], request_bytes: bytes, code: str, status: str
) -> None:
    port, _ = participant
    with pytest.raises(RelayError) as info:
        call_participant(f"127.0.0.1:{port}", request_bytes, timeout_s=5.0)
    assert info.value.code == code
    assert f"status {status}" in info.value.message
    record = _relay(port, _payload(request_bytes))
    assert record["error"].startswith(f"{code}: ")
    assert "payload" not in record


def test_relay_timeout_and_unreachable_become_error_records(participant: tuple[int, list[bytes]]) -> None:
    port, _ = participant
    slow = _relay(port, _payload(b"fail:slow"), **{"relay-timeout-s": 0.2})
    assert slow["error"].startswith("HACFED-E-PARTICIPANT-TIMEOUT")
    server, closed_port = serve_participant(lambda b: b)
    server.stop(0).wait()
    gone = _relay(closed_port, _payload(b"x"))
    assert gone["error"].startswith("HACFED-E-PARTICIPANT-UNREACHABLE")


@pytest.mark.parametrize(
    ("content", "node_config", "run_config", "expected"),
    [
        (RecordDict(), None, None, "HACFED-E-RELAY-BAD-MESSAGE: message has no 'hacfed' record"),
        (_payload("text"), None, None, "HACFED-E-RELAY-BAD-MESSAGE: hacfed.payload is str, expected bytes"),
        (RecordDict({"hacfed": ConfigRecord({"other": b"x"})}), None, None, "HACFED-E-RELAY-BAD-MESSAGE"),
        (_payload(b"x"), {"participant-id": "a"}, None, "HACFED-E-RELAY-CONFIG: node config needs"),
        (_payload(b"x"), {"participant-address": "10.1.2.3:5000"}, None, "HACFED-E-RELAY-CONFIG"),
        (_payload(b"x"), None, {}, "HACFED-E-RELAY-CONFIG: run config needs a positive number"),
    ],
)
def test_bad_messages_and_configs_get_clear_error_records(
    content: RecordDict, node_config: dict | None, run_config: dict | None, expected: str
) -> None:
    node_config = node_config if node_config is not None else {"participant-address": "127.0.0.1:9"}
    run_config = run_config if run_config is not None else {"relay-timeout-s": 1.0}
    record = relay_content(content, node_config, run_config)["hacfed"]
    assert record["error"].startswith(expected)


def test_hello_names_the_participant_and_relays_its_answer(participant: tuple[int, list[bytes]]) -> None:
    port, seen = participant
    node_config = {"participant-id": "lab-b", "participant-address": f"127.0.0.1:{port}"}
    record = hello_content(_payload(b"challenge"), node_config, {"relay-timeout-s": 5.0})["hacfed"]
    assert record["participant-id"] == "lab-b" and record["payload"] == b"echo:egnellahc"
    assert seen == [b"challenge"]  # the participant itself answers the challenge (hacfed.hello)
    missing = hello_content(_payload(b"x"), {"participant-address": f"127.0.0.1:{port}"}, {"relay-timeout-s": 5.0})
    assert missing["hacfed"]["error"].startswith("HACFED-E-RELAY-CONFIG")


def test_participant_service_refuses_non_loopback_hosts() -> None:
    with pytest.raises(ValueError, match="loopback"):
        serve_participant(lambda b: b, host="0.0.0.0")

