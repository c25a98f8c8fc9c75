"""hacfed-server refuses a TLS private key that others can read, in one line before it creates
anything, as the SuperNode and signing key loaders do; a root-owned key its group may read (how a
Kubernetes Secret is mounted with fsGroup) is still accepted for a process that is not root."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hacfed.certs import check_server_tls, init_federation_certs
from hacfed.server.config import load_server_config
from tests.unit.test_server_config import BASE

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_tls_key_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    certs = init_federation_certs(tmp_path / "certs", [])
    certs.server_key.chmod(mode)
    config = tmp_path / "coordinator.toml"
    config.write_text(BASE.format(state=tmp_path / "state"))
    flags = {"tls_cert": str(certs.server_cert), "tls_key": str(certs.server_key), "tls_ca": str(certs.ca_cert)}
    with pytest.raises(ValueError, match=rf"private key .*server.key is accessible by others \(mode {mode:o}\); "
                                         rf"run: chmod 600"):
        load_server_config(config, [], flags)
    certs.server_key.chmod(0o600)
    assert load_server_config(config, [], flags).server.tls_key == certs.server_key.resolve()


def test_hacfed_server_says_so_in_one_line_before_creating_anything(tmp_path: Path) -> None:
    certs = init_federation_certs(tmp_path / "certs", [])
    certs.server_key.chmod(0o644)
    config = tmp_path / "coordinator.toml"
    config.write_text(BASE.format(state=tmp_path / "state"))
    server = subprocess.Popen([sys.executable, "-m", "hacfed.server.main", "--config", str(config), "--listen",
                               "127.0.0.1:0", "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
                               "--tls-ca", str(certs.ca_cert)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=REPO, start_new_session=True)
    try:
        out, err = server.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # it started: SIGTERM makes it stop its children
        os.killpg(server.pid, signal.SIGTERM)
        server.communicate(timeout=60)
        pytest.fail("hacfed-server started with a world-readable TLS key")
    assert server.returncode == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, out + err
    assert err.startswith("hacfed-server: error: ") and "is accessible by others (mode 644)" in err
    assert not (tmp_path / "state").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a root-owned key file: run as root")
def test_a_root_owned_key_its_group_may_read_is_accepted_for_another_user(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """As Kubernetes mounts the Secret (defaultMode 0440, group = fsGroup) for uid 10001: the file is
    root's, the process is not root (its uid stands in here; it reads the file through its group)."""
    certs = init_federation_certs(tmp_path / "certs", [])
    assert certs.server_key.stat().st_uid == 0
    files = (certs.server_cert, certs.server_key, certs.ca_cert)
    certs.server_key.chmod(0o440)
    with pytest.raises(ValueError, match="accessible by others"):
        check_server_tls(*files)  # root's own key: private or nothing
    monkeypatch.setattr(os, "geteuid", lambda: 10001)
    for mode in (0o440, 0o640, 0o600):
        certs.server_key.chmod(mode)
        check_server_tls(*files)
    for mode in (0o444, 0o644, 0o460):
        certs.server_key.chmod(mode)
        with pytest.raises(ValueError, match=f"accessible by others \\(mode {mode:o}\\)"):
            check_server_tls(*files)
