"""Nothing but the Fleet API leaves the coordinator's host (issue 9, reproductions 1 and 7; security.md S1, S5).

A real `hacfed-server --listen 0.0.0.0:P` with TLS, its SuperLink, the SuperExec and the ServerApp
run. Every listening socket of that whole process tree must be on loopback, except the Fleet API;
and a stranger who reaches the coordinator (and holds the public federation CA certificate, as
every lab does) cannot run their own Flower app on it: `flwr run` against the exposed port is
refused and the stranger's code never runs (a canary file it would write stays absent).

The Fleet API listens on 0.0.0.0 for the duration of this module (that is what is under test);
every connection the test makes goes to 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from hacfed.procs import flower_env, free_port
from tests.federation import coordinator_toml
from tests.processes import BIN

SERVER_TOML = coordinator_toml("exposure", rounds=1, expected_participants=2, min_participants=2, round_deadline_s=60,
                               max_new_tokens=None)

STRANGER_APP = '''
from pathlib import Path

Path({canary!r}).write_text("the stranger's code ran on the coordinator\\n")

from flwr.serverapp import ServerApp
from flwr.clientapp import ClientApp

app = ServerApp()
client = ClientApp()


@app.main()
def main(grid, context):
    Path({canary!r}).write_text("the stranger's ServerApp ran\\n")
'''

STRANGER_PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "stranger"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "stranger"

[tool.flwr.app.components]
serverapp = "stranger_app:app"
clientapp = "stranger_app:client"

[tool.flwr.app.config]
"""


@dataclass
class Coordinator:
    popen: subprocess.Popen[bytes]
    log: Path
    fleet_port: int
    ca: Path
    canary_dir: Path
    serverapp_ready: bool


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _listening(pid: int) -> dict[int, set[str]]:
    """Every TCP socket in LISTEN state of the process tree: port -> bound addresses."""
    out: dict[int, set[str]] = {}
    for proc in _tree(pid):
        try:
            conns = proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN:
                out.setdefault(conn.laddr.port, set()).add(conn.laddr.ip)
    return out


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)  # gRPC binds IPv4 as ::ffff:127.0.0.1
    return (mapped or address).is_loopback


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    from hacfed.certs import init_federation_certs

    root = tmp_path_factory.mktemp("exposure")
    certs = init_federation_certs(root / "certs", ["127.0.0.1", "localhost"])
    (root / "coordinator.toml").write_text(SERVER_TOML)
    port = free_port()
    log = root / "server.log"
    argv = [str(BIN / "hacfed-server"), "--config", str(root / "coordinator.toml"), "--state-dir", str(root / "server"),
            "--listen", f"0.0.0.0:{port}", "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
            "--tls-ca", str(certs.ca_cert)]
    with open(log, "wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=root, start_new_session=True,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 240
        while "ready: Fleet API on" not in log.read_text(errors="replace"):
            assert popen.poll() is None, log.read_text(errors="replace")[-5000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-5000:]
            time.sleep(0.5)
        # "coordinator ready" comes from the ServerApp: the whole tree (SuperLink, SuperExec,
        # flwr-serverapp) is up by then.
        deadline = time.monotonic() + 120
        while "coordinator ready" not in log.read_text(errors="replace") and time.monotonic() < deadline \
                and popen.poll() is None:
            time.sleep(0.5)
        ready = "coordinator ready" in log.read_text(errors="replace")
        yield Coordinator(popen, log, port, certs.ca_cert, root, ready)
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()


def _stranger_flwr_run(root: Path, name: str, port: int, ca: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """A stranger's own app submitted with `flwr run` to 127.0.0.1:port; returns (result, canary)."""
    app = root / f"stranger-{name}"
    app.mkdir()
    canary = root / f"canary-{name}"
    (app / "stranger_app.py").write_text(STRANGER_APP.format(canary=str(canary)))
    (app / "pyproject.toml").write_text(STRANGER_PYPROJECT)
    home = root / f"stranger-home-{name}"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "target"\n\n[superlink.target]\naddress = "127.0.0.1:{port}"\n'
        f'insecure = false\nroot-certificates = "{ca}"\n')
    result = subprocess.run(["flwr", "run", str(app), "target"], env=flower_env(home), capture_output=True,
                            text=True, timeout=180, cwd=app, start_new_session=True, check=False)
    return result, canary


@pytest.mark.slow
def test_stranger_flwr_run_against_the_exposed_ports_runs_nothing(coordinator: Coordinator) -> None:
    exposed = sorted(port for port, ips in _listening(coordinator.popen.pid).items()
                     if not all(_is_loopback(ip) for ip in ips))
    assert coordinator.fleet_port in exposed
    results = {}
    for port in exposed:  # after the fix: the Fleet API only
        result, canary = _stranger_flwr_run(coordinator.canary_dir, str(port), port, coordinator.ca)
        results[port] = (result, canary)
    time.sleep(10.0)  # the code of a run that was accepted starts within ~2 s (measured on the old main)
    for port, (result, canary) in results.items():
        output = result.stdout + result.stderr
        assert not canary.exists(), f"the stranger's app ran on the coordinator via port {port}:\n{output[-3000:]}"
        assert result.returncode != 0, f"flwr run against port {port} was accepted:\n{output[-3000:]}"
        assert not re.search(r"Successfully started run", output), output[-3000:]
    assert coordinator.popen.poll() is None  # the coordinator itself is unaffected


@pytest.mark.slow
def test_only_the_fleet_api_listens_off_loopback(coordinator: Coordinator) -> None:
    listening = _listening(coordinator.popen.pid)
    exposed = {port: ips for port, ips in listening.items() if not all(_is_loopback(ip) for ip in ips)}
    assert coordinator.fleet_port in listening, listening
    assert set(exposed) == {coordinator.fleet_port}, (
        f"only the Fleet API ({coordinator.fleet_port}) may listen off loopback; listening: {listening}")
    assert len(listening) >= 3  # the Control and ServerAppIo APIs are there, on loopback


@pytest.mark.slow
def test_a_tls_coordinator_listening_on_all_interfaces_runs_its_own_serverapp(coordinator: Coordinator) -> None:
    """hacfed-server submits its run to the Control API on 127.0.0.1, which its certificate names
    (before, it dialled the --listen host 0.0.0.0, which no certificate names: the run never started)."""
    assert coordinator.serverapp_ready, coordinator.log.read_text(errors="replace")[-5000:]


@pytest.mark.slow
def test_fleet_api_refuses_a_17_mib_message_before_anything_reads_it(coordinator: Coordinator) -> None:
    """reproduction 7: Flower's transport accepted 2 GiB messages before hacfed's 16 MiB check. Now a
    17 MiB request is refused by gRPC itself (RESOURCE_EXHAUSTED) before Flower's node authentication
    or any handler sees it, while a request just above hacfed's cap still reaches them (and, not
    being from a registered SuperNode, is refused there: UNAUTHENTICATED)."""
    import grpc

    from hacfed.wire import MAX_MESSAGE_BYTES

    credentials = grpc.ssl_channel_credentials(coordinator.ca.read_bytes())
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.secure_channel(f"127.0.0.1:{coordinator.fleet_port}", credentials, options=options) as channel:
        push = channel.unary_unary("/flwr.proto.Fleet/PushObject")
        codes = {}
        for size in (1024, MAX_MESSAGE_BYTES + 1024, 17 * 1024 * 1024):
            try:
                push(b"\x00" * size, timeout=60)
                codes[size] = grpc.StatusCode.OK
            except grpc.RpcError as err:
                codes[size] = err.code()  # type: ignore[attr-defined]
    assert codes == {1024: grpc.StatusCode.UNAUTHENTICATED,
                     MAX_MESSAGE_BYTES + 1024: grpc.StatusCode.UNAUTHENTICATED,
                     17 * 1024 * 1024: grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert coordinator.popen.poll() is None
