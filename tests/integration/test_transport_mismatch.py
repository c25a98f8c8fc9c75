"""A lab whose transport is not the coordinator's is told which flag to change (issue 42 L7; security.md L7).

Real hacfed-server and hacfed-client processes on loopback:

- a TLS coordinator (`--tls-cert/--tls-key/--tls-ca`) and a plaintext lab (`hacfed-client --insecure`):
  the lab says, in one plain line, that the coordinator speaks TLS and to pass --tls-ca;
- a plaintext coordinator (`--insecure`) and a lab with `--tls-ca`: the lab says the coordinator does
  not speak TLS.

The line must come while the lab's SuperNode is still trying, not after its retries give up (about
40 s, then Flower's last log line with its ANSI colour codes was all the lab said): it is asserted to
be on the lab's console before any line about the SuperNode's failure, and no escape character
reaches the console. The lab is started before the coordinator, as a lab often is: the probe made
once at start saw nothing listening, so the lab must probe again while its SuperNode connects
(`hacfed.clients.transport_probe.TransportWatch`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hacfed.keys import ensure_key_pair
from hacfed.procs import free_port
from tests.federation import coordinator_toml
from tests.processes import BIN, Proc, cli_env, running_descendants, wait_nothing_left

pytestmark = pytest.mark.slow

SERVER_TOML = coordinator_toml("transport", rounds=1, expected_participants=1, min_participants=1, round_deadline_s=60)
# what the lab says once a SuperNode attempt has given up (its reconnect lines, "the coordinator is
# unreachable ...; attempt N failed", are the attempt still trying)
FAILED = re.compile(r"exited while connecting|not reachable yet|TLS handshake with the coordinator failed")


def _run(tmp_path: Path, *, tls_server: bool, hint: str) -> tuple[str, int]:
    """The lab's console up to its transport line, and where it stood when the coordinator was ready
    (the lab and the coordinator are stopped after)."""
    from hacfed.certs import init_federation_certs

    certs = init_federation_certs(tmp_path / "certs", ["127.0.0.1", "localhost"])
    (tmp_path / "coordinator.toml").write_text(SERVER_TOML)
    env = {**cli_env(), "OMP_NUM_THREADS": "1"}
    address = f"127.0.0.1:{free_port()}"
    coordinator_pub = ensure_key_pair(tmp_path / "server", "coordinator").public
    lab_transport = ["--insecure"] if tls_server else ["--tls-ca", str(certs.ca_cert)]
    server_transport = (["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
                         "--tls-ca", str(certs.ca_cert)] if tls_server else ["--insecure"])
    before = running_descendants()
    procs: list[Proc] = []
    try:
        lab = Proc("lab-a", [str(BIN / "hacfed-client"), "--model", "tiny-llama", "--server", address,
                             "--participant-id", "lab-a", "--state-dir", str(tmp_path / "lab-a"),
                             "--coordinator-key", str(coordinator_pub), "--eval-problems", "4", *lab_transport],
                   tmp_path / "lab-a.log", env)
        procs.append(lab)
        supernode_log = tmp_path / "lab-a" / "supernode" / "supernode.log"
        deadline = time.monotonic() + 300
        while not supernode_log.exists():  # its model loaded, its SuperNode trying a port nobody listens on
            assert lab.popen.poll() is None and time.monotonic() < deadline, lab.text()[-3000:]
            time.sleep(0.2)
        server = Proc("server", [str(BIN / "hacfed-server"), "--config", str(tmp_path / "coordinator.toml"),
                                 "--listen", address, "--state-dir", str(tmp_path / "server"), *server_transport],
                      tmp_path / "server.log", env)
        procs.append(server)
        server.wait_for(r"hacfed-server: ready: Fleet API on ", timeout=300)
        ready_at = len(lab.text())
        match = lab.wait_for(re.escape(hint), timeout=240)
        return lab.text()[: match.end()], ready_at
    finally:
        for proc in reversed(procs):
            proc.stop()
        wait_nothing_left(before)


def _said_plainly_while_connecting(console: str, ready_at: int, hint: str) -> None:
    """One plain line naming the flag, before the SuperNode's attempt failed; no escape codes."""
    line = console[console.rindex("\n", 0, console.index(hint)) + 1:]
    assert line.startswith("hacfed-client: the coordinator at 127.0.0.1:") and "--tls-ca" in line, line
    assert "\x1b" not in console, [s for s in console.splitlines() if "\x1b" in s]
    failed = [s for s in console[ready_at:console.index(hint)].splitlines() if FAILED.search(s)]
    assert failed == [], failed  # said while the SuperNode was still trying, not after it gave up


def test_a_plaintext_lab_against_a_tls_coordinator_is_told_to_pass_tls_ca(
        tmp_path: Path, zoo_presets: Callable[..., None]) -> None:
    zoo_presets("tiny-llama")
    hint = "speaks TLS but this lab runs plaintext (--insecure): pass --tls-ca"
    _said_plainly_while_connecting(*_run(tmp_path, tls_server=True, hint=hint), hint)


def test_a_tls_lab_against_a_plaintext_coordinator_is_told_so(
        tmp_path: Path, zoo_presets: Callable[..., None]) -> None:
    zoo_presets("tiny-llama")
    hint = "is not speaking TLS (a plaintext hacfed-server --insecure?) but this lab expects TLS (--tls-ca)"
    _said_plainly_while_connecting(*_run(tmp_path, tls_server=False, hint=hint), hint)
