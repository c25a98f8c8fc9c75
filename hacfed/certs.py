"""The federation's X.509 certificates: a CA, the coordinator's server certificate, and their checks.

    hacfed-server certs init --dir certs --hosts coordinator.example,10.0.0.5     # the operator, once
    certs/ca.pem          the federation CA certificate: every lab gets it (--tls-ca), it is public
    certs/ca.key          the CA's private key: stays with the operator (0600)
    certs/server.pem/.key the coordinator's certificate for 127.0.0.1, localhost and --hosts

Used by both sides: the operator creates the files with `init_federation_certs` (hacfed-server's
`certs init`), hacfed-server checks its certificate, key and CA with `check_server_tls` before it
starts anything, and hacfed-client checks its `--tls-ca` with `check_ca_cert`. Each problem is one
`ValueError` naming the file and what is wrong (expired, signed by another CA, key of another
certificate, a host missing from the certificate).

Why no lab certificates: Flower 1.32's SuperLink serves TLS without client authentication
(`require_client_auth=False` in `flwr.supercore.grpc`), so a lab certificate would never be asked
for. A lab proves who it is with its registered SuperNode key (Flower's SuperNode authentication)
and signs everything it submits with its Ed25519 key (`hacfed.envelope`).

The coordinator's certificate always names 127.0.0.1 and localhost: hacfed-server itself submits
the run to the SuperLink's Control API on 127.0.0.1 over the same TLS certificate.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOCAL_HOSTS = ("127.0.0.1", "localhost")
DEFAULT_DAYS = 365


@dataclass(frozen=True)
class FederationCerts:
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san_entry(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def check_hosts(hosts: Sequence[str]) -> list[str]:
    """The hosts a certificate names: IP addresses or DNS names, without wildcards or blanks."""
    out: list[str] = []
    for host in hosts:
        host = host.strip()
        if not host:
            continue
        if host in ("0.0.0.0", "::") or "*" in host or any(c.isspace() for c in host):
            raise ValueError(f"--hosts: {host!r} is not a name or address clients connect to")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            labels = host.rstrip(".").split(".")
            if not all(label and len(label) <= 63 and label.replace("-", "").isalnum() for label in labels):
                raise ValueError(f"--hosts: {host!r} is neither an IP address nor a DNS name") from None
        if host not in out:
            out.append(host)
    return out


def make_ca(common_name: str = "hacfed federation CA", *, days: int = DEFAULT_DAYS,
            not_before: datetime.datetime | None = None) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = not_before or _utcnow() - datetime.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def make_server_cert(
    ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, hosts: Sequence[str], *,
    days: int = DEFAULT_DAYS, not_before: datetime.datetime | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A server certificate for LOCAL_HOSTS plus `hosts`, signed by the CA."""
    names = check_hosts([*LOCAL_HOSTS, *hosts])
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or _utcnow() - datetime.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[-1])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([_san_entry(h) for h in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def init_federation_certs(directory: Path, hosts: Sequence[str], *, days: int = DEFAULT_DAYS,
                          overwrite: bool = False) -> FederationCerts:
    """Create `ca.pem`/`ca.key` and `server.pem`/`server.key` in `directory` (keys 0600).

    Refuses to replace existing files unless `overwrite`: a new CA means every lab needs the new
    `ca.pem`. With an existing CA (`ca.pem` + `ca.key`) and `overwrite=False`, only a missing server
    certificate is issued from it."""
    directory = Path(directory)
    if not isinstance(days, int) or days < 1:
        raise ValueError(f"--days must be an integer >= 1, got {days!r}")
    paths = FederationCerts(directory / "ca.pem", directory / "ca.key", directory / "server.pem",
                            directory / "server.key")
    existing = [p for p in (paths.server_cert, paths.server_key) if p.exists()]
    if existing and not overwrite:
        raise ValueError(f"{existing[0]} exists; pass --overwrite to replace the server certificate")
    if paths.ca_cert.exists() and paths.ca_key.exists() and not overwrite:
        ca_cert = load_cert(paths.ca_cert)
        ca_key = serialization.load_pem_private_key(paths.ca_key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{paths.ca_key} is not an EC private key")
    else:
        ca_cert, ca_key = make_ca(days=days)
        _write(paths.ca_key, _key_pem(ca_key), 0o600)
        _write(paths.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    cert, key = make_server_cert(ca_cert, ca_key, hosts, days=days)
    _write(paths.server_key, _key_pem(key), 0o600)
    _write(paths.server_cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return paths


# ---- checks -------------------------------------------------------------------------------------


def load_cert(path: Path) -> x509.Certificate:
    path = Path(path)
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except OSError as exc:
        raise ValueError(f"cannot read certificate {path}: {exc.strerror}") from None
    except ValueError:
        raise ValueError(f"{path} is not a PEM certificate") from None


def _check_validity(cert: x509.Certificate, path: Path, now: datetime.datetime) -> None:
    if now < cert.not_valid_before_utc:
        raise ValueError(f"certificate {path} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    if now > cert.not_valid_after_utc:
        raise ValueError(f"certificate {path} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; "
                         f"issue a new one (hacfed-server certs init)")


def check_ca_cert(path: Path, *, now: datetime.datetime | None = None) -> x509.Certificate:
    """A CA certificate that is valid now (what a lab passes as --tls-ca)."""
    cert = load_cert(path)
    _check_validity(cert, Path(path), now or _utcnow())
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ValueError(f"{path} is not a CA certificate (no basicConstraints CA:TRUE); pass the federation's ca.pem")
    return cert


def _sans(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))


def check_private_key_mode(path: Path) -> None:
    """Refuse a private key others can read, as the SuperNode and signing key loaders do: no group or
    other bits on a file of this user's. A root-owned key may be readable by its group (0640, 0440)
    for a process that is not root: how a Kubernetes Secret is mounted with fsGroup, and how
    PostgreSQL treats its ssl_key_file. Readable by everyone is refused always."""
    info = os.stat(path)
    mode = stat.S_IMODE(info.st_mode)
    allowed = 0o7740 if info.st_uid == 0 and os.geteuid() != 0 else 0o7700
    if mode & ~allowed:
        raise ValueError(f"private key {path} is accessible by others (mode {mode:o}); run: chmod 600 {path}")


def check_server_tls(cert_path: Path, key_path: Path, ca_path: Path, *, hosts: Sequence[str] = (),
                     now: datetime.datetime | None = None) -> None:
    """The coordinator's TLS files fit together and are valid now: the certificate was issued by the
    CA, its key is the private key of the certificate, and it names 127.0.0.1 and every host in
    `hosts` (the --listen host when it is a name or a specific address)."""
    now = now or _utcnow()
    ca = check_ca_cert(ca_path, now=now)
    cert = load_cert(cert_path)
    _check_validity(cert, Path(cert_path), now)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise ValueError(f"certificate {cert_path} was not issued by the CA {ca_path} (another CA, or an "
                         f"intermediate: hacfed needs a server certificate signed directly by --tls-ca)") from None
    try:
        check_private_key_mode(Path(key_path))
    except OSError as exc:
        raise ValueError(f"cannot read private key {key_path}: {exc.strerror}") from None
    try:
        key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
    except OSError as exc:
        raise ValueError(f"cannot read private key {key_path}: {exc.strerror}") from None
    except (ValueError, TypeError):
        raise ValueError(f"{key_path} is not an unencrypted PEM private key") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.PEM, public) != \
            cert.public_key().public_bytes(serialization.Encoding.PEM, public):
        raise ValueError(f"{key_path} is not the private key of the certificate {cert_path}")
    names = _sans(cert)
    for host in ("127.0.0.1", *hosts):
        if host not in names:
            raise ValueError(f"certificate {cert_path} does not name {host} (it names {sorted(names)}); "
                             f"hacfed-server reaches its SuperLink on 127.0.0.1: issue it with "
                             f"hacfed-server certs init --hosts ...")
