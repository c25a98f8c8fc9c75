"""R6: a lab behind a link that goes down for 30 s notices it by keepalive and recovers with nothing lost.

The lab (a real hacfed-client, its SuperNode and ClientApp runner) runs in a network namespace of its
own and reaches the coordinator (a real hacfed-server with TLS, listening on the host's end of a veth
pair) over that pair only. Once the lab has contributed to a round, the host's end of the pair is set
down for 30 s (`ip link set ... down`): the lab's end loses its carrier and every packet either way
vanishes, a half-open connection on both sides. Checked:

- the lab's SuperNode notices the dead link by gRPC keepalive (`hacfed.flower_keepalive`): its first
  reconnect line comes within keepalive time + keepalive timeout of the link going down (without
  keepalive its pull waits on the dead connection until TCP gives up, many minutes later);
- after the link is back, the lab reconnects by itself and contributes to a later round; every
  submission it made is answered (none left pending), each receipt is in the journal exactly once,
  and the journal passes `integrity_check`;
- no log of the lab or the coordinator shows a `too_many_pings` GOAWAY: the coordinator accepts the
  labs' keepalive pings. The long tier holds the federation 10 more minutes after the recovery for
  this check.

Needs root and `ip` with network namespaces and veth pairs; skipped, saying which is missing, elsewhere
(for example as a user without CAP_NET_ADMIN, as in most CI containers).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hacfed.clients.backoff import RECONNECT_MARK
from hacfed.flower_keepalive import KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS
from hacfed.keys import ensure_key_pair
from hacfed.procs import free_port
from tests.faults.conftest import fault_toml
from tests.federation import MODEL, TRACE, Federation
from tests.processes import BIN, Proc

pytestmark = pytest.mark.slow

DOWN_S = 30.0
DETECT_S = (KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS) / 1000
DETECT_SLACK_S = 3.0  # this test's polling of the log, a busy machine
ROUNDS = 100_000  # never reached: the test stops the coordinator
GOAWAY = "too_many_pings"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _why_no_netns() -> str | None:
    if shutil.which("ip") is None:
        return "needs iproute2's `ip`"
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) for a network namespace and a veth pair"
    probe = f"hacfed-probe-{os.getpid()}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


@dataclass(frozen=True)
class Net:
    ns: str
    host_if: str
    host_ip: str


@pytest.fixture
def lab_net() -> Iterator[Net]:
    """A network namespace joined to the host by a veth pair: 10.231.K.1 on the host, .2 inside."""
    if reason := _why_no_netns():
        pytest.skip(reason)
    tag = os.getpid() % 100_000
    net = Net(f"hacfed-r6-{tag}", f"hr6h{tag}", f"10.231.{tag % 250}.1")
    lab_ip = net.host_ip[:-1] + "2"
    steps = [("netns", "add", net.ns),
             ("link", "add", net.host_if, "type", "veth", "peer", "name", f"hr6l{tag}", "netns", net.ns),
             ("addr", "add", f"{net.host_ip}/30", "dev", net.host_if), ("link", "set", net.host_if, "up"),
             ("-n", net.ns, "addr", "add", f"{lab_ip}/30", "dev", f"hr6l{tag}"),
             ("-n", net.ns, "link", "set", f"hr6l{tag}", "up"), ("-n", net.ns, "link", "set", "lo", "up")]
    try:
        for step in steps:
            done = _ip(*step)
            assert done.returncode == 0, f"ip {' '.join(step)}: {done.stderr}"
        yield net
    finally:
        _ip("link", "del", net.host_if)  # its peer goes with it
        _ip("netns", "del", net.ns)


def _run(argv: list[str], fed: Federation) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=fed.env, cwd=fed.tmp, timeout=300)
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done.stdout


def _start(fed: Federation, net: Net) -> tuple[Proc, Proc]:
    """TLS coordinator on the host's end, the lab registered with its enrolment and started in the namespace."""
    certs, lab_dir = fed.tmp / "certs", fed.tmp / "lab-b"
    _run([str(BIN / "hacfed-server"), "certs", "init", "--dir", str(certs), "--hosts", net.host_ip], fed)
    _run([str(BIN / "hacfed-client"), "keys", "--state-dir", str(lab_dir), "--participant-id", "lab-b"], fed)
    ensure_key_pair(fed.server_dir, "coordinator")
    _run([str(BIN / "hacfed-server"), "register", "--state-dir", str(fed.server_dir),
          str(lab_dir / "enrolment.txt")], fed)
    fed.address = f"{net.host_ip}:{free_port()}"
    server = Proc("server", [str(BIN / "hacfed-server"), "--config", str(fed.tmp / "coordinator.toml"),
                             "--listen", fed.address, "--state-dir", str(fed.server_dir),
                             "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                             "--tls-ca", str(certs / "ca.pem")], fed.tmp / "server.log", fed.env)
    fed.procs.append(server)
    lab = Proc("lab-b", ["ip", "netns", "exec", net.ns, str(BIN / "hacfed-client"), "--model", MODEL,
                         "--server", fed.address, "--participant-id", "lab-b", "--state-dir", str(lab_dir),
                         "--coordinator-key", str(fed.server_dir / "coordinator.pub"),
                         "--tls-ca", str(certs / "ca.pem"), "--eval-problems", "4"], fed.tmp / "lab-b.log", fed.env)
    fed.procs.append(lab)
    fed.labs["lab-b"] = lab
    fed._ready(server)
    fed.remember(lab)
    return server, lab


def _first_line_after(path: Path, offset: int, mark: str, timeout: float) -> float:
    """When (monotonic) a line with `mark` first appears in `path` after byte `offset`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and mark.encode() in path.read_bytes()[offset:]:
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"no {mark!r} in {path} within {timeout}s:\n{path.read_text(errors='replace')[-3000:]}")


def _accepted_round(fed: Federation, server: Proc, since: int, timeout: float) -> int:
    pattern = r"round (\d+) lab-b: submitted \d+ trajectories, accepted [1-9]"
    return int(fed.console(server, pattern, timeout=timeout, since=since).group(1))


@pytest.mark.parametrize("hold_s", [0.0, pytest.param(600.0, marks=pytest.mark.long)], ids=["short", "10min"])
def test_a_lab_whose_link_dies_for_30s_notices_it_by_keepalive_and_recovers(
    federation: Federation, lab_net: Net, hold_s: float,
) -> None:
    fed = federation
    fed.configure(fault_toml("faults-partition", rounds=ROUNDS, expected=1, minimum=1, deadline_s=20.0))
    server, lab = _start(fed, lab_net)
    supernode_log = fed.tmp / "lab-b" / "supernode" / "supernode.log"
    before = _accepted_round(fed, server, 0, timeout=300)

    offset = supernode_log.stat().st_size
    assert _ip("link", "set", lab_net.host_if, "down").returncode == 0
    down = time.monotonic()
    detected = _first_line_after(supernode_log, offset, RECONNECT_MARK, timeout=DOWN_S) - down
    time.sleep(max(0.0, down + DOWN_S - time.monotonic()))
    since = len(server.text())
    assert _ip("link", "set", lab_net.host_if, "up").returncode == 0
    up = time.monotonic()
    assert detected <= DETECT_S + DETECT_SLACK_S, f"the dead link was noticed after {detected:.1f}s"

    after = _accepted_round(fed, server, since, timeout=300)
    recovered = time.monotonic() - up
    assert after > before
    last = _accepted_round(fed, server, len(server.text()), timeout=120)  # and it goes on
    deadline = time.monotonic() + 120
    while any(e["state"] == "pending" and e["round_id"] < last for e in fed.outbox("lab-b")):
        assert time.monotonic() < deadline, fed.outbox("lab-b")
        time.sleep(0.5)
    time.sleep(hold_s)
    assert lab.popen.poll() is None, lab.text()[-3000:]
    server.stop()
    assert server.popen.returncode == 0, server.text()[-3000:]

    assert fed.integrity() == "ok"
    entries = fed.outbox("lab-b")
    assert {e["state"] for e in entries if e["round_id"] < last} <= {"acked", "refused"}
    refused = {e["code"] for e in entries if e["state"] == "refused"}
    assert refused <= {"HACFED-E-ROUND-CLOSED", "HACFED-E-STALE-ROUND"}, refused  # late ones only
    fed.check_receipts_in_journal(["lab-b"], complete=False)
    logs = [server.log, lab.log, supernode_log, *fed.server_dir.rglob("*.log")]
    for path in logs:
        text = path.read_text(errors="replace")
        assert GOAWAY not in text, f"{path}: {GOAWAY}"
        assert not TRACE.search(text), f"{path}:\n{text[-3000:]}"
    print(f"\nlink down {DOWN_S:.0f}s: noticed after {detected:.1f}s (keepalive {DETECT_S:.0f}s); "
          f"lab-b contributed again {recovered:.1f}s after the link came back (round {after}, last {last})")
    assert re.search(r"connected to the coordinator again", supernode_log.read_text(errors="replace"))
