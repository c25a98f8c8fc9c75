"""hacfed-client stops in one line where it used to retry "the coordinator is unreachable" forever:
a coordinator host name that does not resolve (a typo, the README's coordinator.example), and a lab
whose state dir already finished its run (the coordinator acknowledged its final report)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hacfed.certs import init_federation_certs
from hacfed.clients.config import check_server_name
from hacfed.clients.finished import finished_run
from hacfed.clients.outbox import Outbox
from hacfed.keys import ensure_key_pair

BIN = Path(sys.executable).parent


def _run_client(argv: list[str]) -> subprocess.CompletedProcess:
    """hacfed-client in its own process group, ended by its pid if it is still running after 120 s."""
    proc = subprocess.Popen([str(BIN / "hacfed-client"), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("hacfed-client kept running (retrying the coordinator) instead of exiting")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize("host", ["coordinator.example", "no-such-coordinator.invalid"])
def test_an_unresolvable_coordinator_name_is_refused_in_one_line(host, tmp_path):
    certs = init_federation_certs(tmp_path / "certs", [])
    key = ensure_key_pair(tmp_path / "server", "coordinator").public
    state = tmp_path / "lab-a"
    done = _run_client(["--model", "tiny-llama", "--server", f"{host}:9092", "--participant-id", "lab-a",
                        "--state-dir", str(state), "--coordinator-key", str(key), "--tls-ca", str(certs.ca_cert)])
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.startswith(f"hacfed-client: error: --server {host}:9092: the coordinator's host name "
                                  f"{host!r} does not resolve") and done.stderr.count("\n") == 1, done.stderr
    assert not state.exists()


def test_names_and_addresses_that_resolve_pass():
    for server in ("127.0.0.1:9092", "localhost:9092", "[::1]:9092"):
        check_server_name(server)


def _finished_lab(state: Path, run_id: str, acked: bool) -> None:
    """The outbox as hacfed.clients.service leaves it: the final report (plan round None), then its ack."""
    outbox = Outbox(state / "service" / "outbox.sqlite")
    outbox.add((run_id, 1, 2), 2, "n-2", b"round 2")
    outbox.settle("n-2", "acked", b"receipt")
    outbox.add((run_id, 2, None), 2, "n-final", b"final report")
    if acked:
        outbox.settle("n-final", "acked", b"final ack")
    outbox.close()


def test_finished_run_reads_the_acknowledged_final_report(tmp_path):
    assert finished_run(tmp_path / "none") is None
    _finished_lab(tmp_path / "pending", "run-1", acked=False)
    assert finished_run(tmp_path / "pending") is None
    _finished_lab(tmp_path / "done", "run-1", acked=True)
    assert finished_run(tmp_path / "done") == "run-1"


def test_a_lab_that_finished_its_run_exits_in_one_line(tmp_path):
    state = tmp_path / "lab-a"
    _finished_lab(state, "demo-run", acked=True)
    key = ensure_key_pair(tmp_path / "server", "coordinator").public
    with socket.socket() as s:  # nothing listens there: the coordinator has gone
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = _run_client(["--model", "tiny-llama", "--server", f"127.0.0.1:{port}", "--participant-id", "lab-a",
                        "--state-dir", str(state), "--coordinator-key", str(key), "--insecure"])
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    assert done.stdout == (f"hacfed-client: this lab already finished run demo-run (the coordinator "
                   f"acknowledged its final "
                   f"report; the state dir {state} belongs to that run): nothing to do. To join a new run, use a "
                   "fresh --state-dir\n")
    assert not (state / "supernode").exists()
