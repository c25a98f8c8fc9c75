"""A lab whose transport is not the coordinator's is told which to use (issue: plaintext lab against a
TLS coordinator heard only "not reachable yet"). Real gRPC servers on loopback, as the SuperLink is."""

from __future__ import annotations

import socket
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from hacfed.certs import init_federation_certs
from hacfed.clients.runner import connect_failure
from hacfed.clients.transport_probe import TransportWatch, speaks_tls, transport_mismatch


def _server(tls_dir: Path | None) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    if tls_dir is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        certs = init_federation_certs(tls_dir, ["127.0.0.1", "localhost"])
        credentials = grpc.ssl_server_credentials([(certs.server_key.read_bytes(), certs.server_cert.read_bytes())])
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def tls_server(tmp_path: Path):
    server, address = _server(tmp_path / "certs")
    yield address
    server.stop(None)


@pytest.fixture
def plaintext_server():
    server, address = _server(None)
    yield address
    server.stop(None)


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_plaintext_lab_against_a_tls_coordinator_is_told_to_pass_its_ca(tls_server: str) -> None:
    assert speaks_tls(tls_server) is True
    hint = transport_mismatch(tls_server, insecure=True)
    assert hint is not None and "speaks TLS" in hint and "--tls-ca" in hint
    assert transport_mismatch(tls_server, insecure=False) is None


def test_a_tls_lab_against_a_plaintext_coordinator_is_told_so(plaintext_server: str) -> None:
    assert speaks_tls(plaintext_server) is False
    hint = transport_mismatch(plaintext_server, insecure=False)
    assert hint is not None and "not speaking TLS" in hint
    assert transport_mismatch(plaintext_server, insecure=True) is None


def test_a_coordinator_that_is_down_gives_no_hint() -> None:
    address = _closed_port()
    assert speaks_tls(address, timeout_s=1.0) is None
    assert transport_mismatch(address, insecure=True, timeout_s=1.0) is None
    assert transport_mismatch(address, insecure=False, timeout_s=1.0) is None


def test_the_watch_probes_again_while_the_supernode_connects_and_says_it_once() -> None:
    """The coordinator was down at the first probe: the watch probes again during the attempt and
    says the mismatch as soon as it is known; later attempts say nothing more (issue 42 L7)."""
    hint = "the coordinator at x:1 speaks TLS but this lab runs plaintext (--insecure): pass --tls-ca ..."
    calls: list[tuple[str, bool]] = []

    def probe(server: str, insecure: bool) -> str | None:
        calls.append((server, insecure))
        return hint if len(calls) >= 3 else None  # nothing listening yet, then a TLS coordinator

    said: list[str] = []
    known = threading.Event()
    watch = TransportWatch("x:1", True, lambda line: (said.append(line), known.set()), interval_s=0.01, probe=probe)
    with watch.watching():  # one SuperNode attempt, still connecting
        assert known.wait(60)
    with watch.watching():  # the next attempt
        pass
    assert said == [f"{hint}; still trying"] and calls == [("x:1", True)] * 3 and watch.said == hint


def test_a_failed_attempt_is_probed_at_once_so_the_mismatch_comes_before_the_generic_reason() -> None:
    """The SuperNode's TLS attempt against a plaintext coordinator can fail between two of the
    watch's probes (a busy machine): check_now probes at once and says the mismatch, once."""
    hint = "the coordinator at x:1 is not speaking TLS ..."
    calls: list[str] = []

    def probe(server: str, insecure: bool) -> str | None:
        calls.append(server)
        return hint

    said: list[str] = []
    watch = TransportWatch("x:1", False, said.append, interval_s=3600.0, probe=probe)
    assert watch.check_now() == hint and watch.check_now() == hint
    assert said == [f"{hint}; still trying"] and calls == ["x:1"]  # probed once, said once


def test_a_supernode_failure_reaches_the_console_without_flowers_colour_codes(tmp_path: Path) -> None:
    tail = "\x1b[92mINFO \x1b[0m:      Starting\n\x1b[91mERROR \x1b[0m:     Connection failed: UNAVAILABLE\n"
    reason, _ = connect_failure(tail, tmp_path)
    assert reason == "the SuperNode exited while connecting: ERROR :     Connection failed: UNAVAILABLE"
