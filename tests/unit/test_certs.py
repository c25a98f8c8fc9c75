"""Federation certificates (security.md S1): the tooling, the checks, and what the TLS transport refuses.

The transport tests serve gRPC on 127.0.0.1:0 with a certificate and dial it the way a lab's
SuperNode does (`grpc.ssl_channel_credentials(root_certificates=<the federation ca.pem>)`): a
certificate from another CA, an expired one, or one that does not name the address is refused in
the TLS handshake, and plaintext is refused by a TLS server.
"""

from __future__ import annotations

import datetime
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization

from hacfed.certs import (
    check_ca_cert,
    check_hosts,
    check_server_tls,
    init_federation_certs,
    load_cert,
    make_ca,
    make_server_cert,
)

YEAR_AGO = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=400)


def test_init_creates_a_ca_and_a_server_certificate_for_the_hosts(tmp_path: Path) -> None:
    certs = init_federation_certs(tmp_path / "certs", ["coordinator.example", "10.0.0.5"])
    check_server_tls(certs.server_cert, certs.server_key, certs.ca_cert, hosts=["coordinator.example", "10.0.0.5"])
    for key in (certs.ca_key, certs.server_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(certs.ca_cert.stat().st_mode) == 0o644
    names = str(load_cert(certs.server_cert).extensions)
    assert "127.0.0.1" in names and "localhost" in names  # hacfed-server reaches its own Control API there


def test_init_refuses_to_replace_a_server_certificate_and_reuses_the_ca(tmp_path: Path) -> None:
    first = init_federation_certs(tmp_path, ["a.example"])
    with pytest.raises(ValueError, match="pass --overwrite"):
        init_federation_certs(tmp_path, ["a.example"])
    ca_before = first.ca_cert.read_bytes()
    first.server_cert.unlink()
    first.server_key.unlink()
    init_federation_certs(tmp_path, ["b.example"])  # a new server certificate from the same CA
    assert first.ca_cert.read_bytes() == ca_before
    check_server_tls(first.server_cert, first.server_key, first.ca_cert, hosts=["b.example"])


@pytest.mark.parametrize("host", ["0.0.0.0", "*.example", "a b", "bad_host!"])
def test_hosts_that_no_client_connects_to_are_refused(host: str) -> None:
    with pytest.raises(ValueError, match="--hosts"):
        check_hosts([host])


def test_expired_server_certificate_is_refused(tmp_path: Path) -> None:
    ca = init_federation_certs(tmp_path, [])
    cert, key = _issue(tmp_path / "old", ca, not_before=YEAR_AGO, days=30)
    with pytest.raises(ValueError, match="expired on"):
        check_server_tls(cert, key, ca.ca_cert)


def test_expired_ca_is_refused(tmp_path: Path) -> None:
    ca_cert, _ = make_ca(days=30, not_before=YEAR_AGO)
    path = tmp_path / "ca.pem"
    path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(ValueError, match="expired on"):
        check_ca_cert(path)


def test_certificate_of_a_foreign_ca_is_refused(tmp_path: Path) -> None:
    ours, foreign = init_federation_certs(tmp_path / "ours", []), init_federation_certs(tmp_path / "foreign", [])
    with pytest.raises(ValueError, match="was not issued by the CA"):
        check_server_tls(foreign.server_cert, foreign.server_key, ours.ca_cert)


def test_key_of_another_certificate_is_refused(tmp_path: Path) -> None:
    a, b = init_federation_certs(tmp_path / "a", []), init_federation_certs(tmp_path / "b", [])
    with pytest.raises(ValueError, match="is not the private key of the certificate"):
        check_server_tls(a.server_cert, b.server_key, a.ca_cert)


def test_server_certificate_as_ca_is_refused(tmp_path: Path) -> None:
    certs = init_federation_certs(tmp_path, [])
    with pytest.raises(ValueError, match="is not a CA certificate"):
        check_ca_cert(certs.server_cert)


def test_not_a_certificate_is_one_clear_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(ValueError, match="junk.pem is not a PEM certificate"):
        check_ca_cert(junk)


def _issue(directory: Path, ca, **kwargs) -> tuple[Path, Path]:  # noqa: ANN001 - FederationCerts
    ca_key = serialization.load_pem_private_key(ca.ca_key.read_bytes(), password=None)
    cert, key = make_server_cert(load_cert(ca.ca_cert), ca_key, [], **kwargs)  # type: ignore[arg-type]
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "server.pem", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


# ---- what the TLS transport itself refuses -------------------------------------------------------


@contextmanager
def _tls_server(cert: Path, key: Path) -> Iterator[int]:
    handler = grpc.method_handlers_generic_handler("t.T", {"Echo": grpc.unary_unary_rpc_method_handler(
        lambda request, context: request)})
    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(2), handlers=[handler])
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(((key.read_bytes(), cert.read_bytes()),)))
    server.start()
    try:
        yield port
    finally:
        server.stop(0).wait()


def _call(port: int, ca: Path | None, target: str = "127.0.0.1") -> grpc.StatusCode:
    if ca is None:
        channel = grpc.insecure_channel(f"{target}:{port}")
    else:
        channel = grpc.secure_channel(f"{target}:{port}", grpc.ssl_channel_credentials(ca.read_bytes()))
    with channel:
        try:
            channel.unary_unary("/t.T/Echo")(b"ping", timeout=10)
        except grpc.RpcError as err:
            return err.code()  # type: ignore[attr-defined]
    return grpc.StatusCode.OK


def test_transport_accepts_the_federation_certificate(tmp_path: Path) -> None:
    certs = init_federation_certs(tmp_path, [])
    with _tls_server(certs.server_cert, certs.server_key) as port:
        assert _call(port, certs.ca_cert) == grpc.StatusCode.OK


def test_transport_refuses_a_server_certificate_of_a_foreign_ca(tmp_path: Path) -> None:
    ours, foreign = init_federation_certs(tmp_path / "ours", []), init_federation_certs(tmp_path / "foreign", [])
    with _tls_server(foreign.server_cert, foreign.server_key) as port:
        assert _call(port, ours.ca_cert) == grpc.StatusCode.UNAVAILABLE


def test_transport_refuses_an_expired_server_certificate(tmp_path: Path) -> None:
    ca = init_federation_certs(tmp_path, [])
    cert, key = _issue(tmp_path / "old", ca, not_before=YEAR_AGO, days=30)
    with _tls_server(cert, key) as port:
        assert _call(port, ca.ca_cert) == grpc.StatusCode.UNAVAILABLE


def test_transport_refuses_plaintext_against_tls(tmp_path: Path) -> None:
    certs = init_federation_certs(tmp_path, [])
    with _tls_server(certs.server_cert, certs.server_key) as port:
        assert _call(port, None) == grpc.StatusCode.UNAVAILABLE
